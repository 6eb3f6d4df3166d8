"""The projections a decode round runs, as shapes: which products of which rows the target and the
drafter run in one round, and how many times.

Owns: the target's projections at a row count (`projection_shapes`); a drafter's own projections
(`drafter_weights`) and the rows it runs them at in one round (`drafter_round`); a deployment's
shapes per round, verification, drafting and the prefill buckets (`deployment_shapes`), the
drafter's named `drafter.*` (`is_drafter_shape`); and which of the models' weights a shape is
timed on (`projection_weight`).

Does not own timing or tuning them (`specpilot.kernels.shape_tuning`), nor choosing which to tune
(`specpilot.loop.agents.kernel`).
"""

from __future__ import annotations

from dataclasses import replace

from specpilot.config import DRAFTER_MODELS, DrafterKind, System
from specpilot.engine.round import PREFILL_BUCKET
from specpilot.kernels.shape_tuning import ProjectionShape

MAX_ROWS = 257  # the most rows per batch row a verification runs (a 256-token tree and its root)


def projection_shapes(config, rows: int, lm_head: bool) -> list[ProjectionShape]:
    """The target's projections (a `models.config.ModelConfig`) at `rows` rows."""
    C, I, L = config.hidden_size, config.intermediate_size, config.num_layers
    H, Hkv, D = config.num_heads, config.num_kv_heads, config.head_dim
    out = [ProjectionShape("qkv", rows, (H + 2 * Hkv) * D, C, L), ProjectionShape("o", rows, C, H * D, L),
           ProjectionShape("gate_up", rows, 2 * I, C, L), ProjectionShape("down", rows, C, I, L)]
    if lm_head:
        out.append(ProjectionShape("lm_head", rows, config.vocab_size, C, 1))
    return out


def drafter_weights(kind: DrafterKind, drafter) -> dict[str, tuple[int, int, int]]:
    """{name: (n, k, calls per forward)} of a drafter's own projections, lm_head and feature fusion
    (`fc`): a draft model's (`drafter` the model or its `ModelConfig`), an EAGLE-3 head's or a
    DFlash drafter's (`drafter` the model, for its `config` and `spec`). An EAGLE-3 layer's qkv
    reads [embedding ; hidden] (2C); a DFlash drafter drafts through the target's lm_head."""
    if kind is DrafterKind.MODEL:
        return {s.name: (s.n, s.k, s.count) for s in projection_shapes(getattr(drafter, "config", drafter), 1, True)}
    c, spec = drafter.config, drafter.spec
    out = {s.name: (s.n, s.k, s.count) for s in projection_shapes(c, 1, False)}
    C = c.hidden_size
    if kind is DrafterKind.EAGLE3:
        out["qkv"] = ((c.num_heads + 2 * c.num_kv_heads) * c.head_dim, 2 * C, c.num_layers)
        out["fc"] = (C, len(spec.layer_ids) * spec.target_hidden_size, 1)
        out["lm_head"] = (spec.draft_vocab_size, C, 1)
    else:
        out["fc"] = (C, len(spec.target_layer_ids) * C, 1)
    return out


def drafter_round(kind: DrafterKind, system: System, batch: int, draft_forwards: int) -> list[tuple[str, int, int]]:
    """(name, rows, forwards per round) of the drafter's own projections in one decode round: a
    draft model's catch-up over batch x window rows (its lm_head on the roots), then its
    `draft_forwards - 1` expansions over batch x topk; an EAGLE-3 head's catch-up over batch x
    (depth + 1) rows through `fc` and its layer (lm_head on the roots), then its expansions; a
    DFlash drafter's context (`fc` and its layers' projections) and its block, each over batch x
    block_size rows."""
    blocks = ("qkv", "o", "gate_up", "down")
    expansions = [(n, batch * max(1, system.topk), draft_forwards - 1) for n in (*blocks, "lm_head")]
    if kind is DrafterKind.MODEL:
        return [(n, batch * system.window, 1) for n in blocks] + [("lm_head", batch, 1)] + expansions
    if kind is DrafterKind.EAGLE3:
        catch_up = [(n, batch * (system.depth + 1), 1) for n in (*blocks, "fc")]
        return catch_up + [("lm_head", batch, 1)] + expansions
    rows = batch * system.block_size
    return [(n, rows, 2) for n in blocks] + [("fc", rows, 1)]


def deployment_shapes(target, drafter, system: System, batch: int, tree_nodes: int,
                      draft_forwards: int, drafter_kernels: bool = False) -> list[ProjectionShape]:
    """The projections the incumbent runs (`target` its `ModelConfig`; `drafter` what
    `drafter_weights` reads for the incumbent's drafter, None without one), counted per decode
    round: the target's verification over batch x tree nodes rows; the drafter's own projections
    as `drafter_round` runs them; and each prefill bucket of both models up to MAX_ROWS rows per
    batch row, counted 0 (prefill runs once per request). The drafter's shapes count only with
    `drafter_kernels` (its projections can turn to the kernels: `draft_kernel`; counted 0
    otherwise: tuned, but saving nothing). One shape per (name, rows), its counts summed; the
    search times a size once however many shapes share it."""
    out = [ProjectionShape(s.name, s.m, s.n, s.k, s.count)
           for s in projection_shapes(target, batch * tree_nodes, system.kernel_lm_head)]
    buckets = range(PREFILL_BUCKET, MAX_ROWS + 1, PREFILL_BUCKET)
    for rows in buckets:
        out += [ProjectionShape(f"{s.name}@prefill", s.m, s.n, s.k, 0)
                for s in projection_shapes(target, batch * rows, system.kernel_lm_head)]
    kind = system.drafter
    if drafter is not None and kind in DRAFTER_MODELS and system.speculative and draft_forwards:
        weights, on = drafter_weights(kind, drafter), int(drafter_kernels)
        for name, rows, forwards in drafter_round(kind, system, batch, draft_forwards):
            n, k, calls = weights[name]
            out.append(ProjectionShape(f"drafter.{name}", rows, n, k, calls * forwards * on))
        for rows in buckets:
            out += [ProjectionShape(f"drafter.{name}@prefill", batch * rows, n, k, 0)
                    for name, (n, k, _) in weights.items()]
    merged: dict[tuple[str, int], ProjectionShape] = {}
    for s in out:
        key = (s.name, s.m)
        merged[key] = replace(merged[key], count=merged[key].count + s.count) if key in merged else s
    return list(merged.values())


def is_drafter_shape(shape: ProjectionShape) -> bool:
    """One of the drafter's own projections (`deployment_shapes` names them `drafter.*`)."""
    return shape.name.startswith("drafter.")


def projection_weight(models, n: int, k: int):
    """The first [n, k] weight among the models' blocks' projections, lm_heads and feature fusions
    (`fc`), in order (target first): a shape's weights to time it on."""
    from specpilot.models.transformer import decoder_blocks, projection_names

    for model in models:
        projections = [block.get_submodule(name) for _, block in decoder_blocks(model)
                       for name in projection_names(block)]
        heads = [getattr(model, name, None) for name in ("lm_head", "fc")]
        for module in projections + heads:
            weight = getattr(module, "weight", None)  # an `FP8Linear` holds codes and scales instead
            if weight is not None and tuple(weight.shape) == (n, k):
                return weight
    raise KeyError(f"no projection weight of shape [{n}, {k}]")
