"""EAGLE-3 heads and DFlash drafters built for the other target families — Gemma-3, Gemma-4 (per-layer
inputs and wider global heads; KV-shared layers) and Qwen3-MoE, from checkpoints transformers saved —
load in their public layouts and keep speculation exact (CPU float32):

1. Features: the target's capture at a drafter's ids is transformers' `hidden_states` there (EAGLE-3:
   the inputs of its layer ids, SpecForge's output ids in `eagle_config` when not the default;
   DFlash: `hidden_states[id + 1]`, the last layer's final-normed).
2. Speculation equals AR: chains and trees of each drafter on each target. With oracle drafters (the
   real head or drafter runs, then the AR continuation is proposed) rounds accept long paths; after
   them the EAGLE-3 head's cache and root hidden, and the DFlash drafter's context K/V, equal those
   built from transformers' hidden states of the committed tokens.
3. `specpilot generate --target DIR --drafter DIR`: a chain and a 16-node tree give AR's tokens.
4. A drafter built for another target (width, vocabulary, layer ids, depth) is one `error:` line and
   exit 2, before anything is generated.
5. DFlash's `input_embedding_scale` (here Gemma's sqrt(C)), `output_multiplier` and
   `final_logit_softcapping`: written, read back and drafted with as the public reference computes
   them.
"""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from specpilot.cli import main
from specpilot.config import TreeConstruction
from specpilot.engine.drafters.dflash import DFlashDrafter
from specpilot.engine.drafters.eagle3 import Eagle3Drafter
from specpilot.engine.generator import Generator
from specpilot.engine.state import DecodeState
from specpilot.engine.steps import chunk_forward
from specpilot.models.dflash import random_dflash
from specpilot.models.dflash_checkpoint import load_dflash, read_dflash_config, write_dflash
from specpilot.models.eagle3 import default_layer_ids, random_eagle3
from specpilot.models.eagle3_checkpoint import load_eagle3, write_eagle3
from specpilot.models.loading import load_model
from tests.engine.test_eagle3_lossless import OracleDrafter as Eagle3Oracle

transformers = pytest.importorskip("transformers")
from tests.models import test_gemma, test_moe  # noqa: E402  (they need transformers too)

NEW_TOKENS = 24
# target -> (transformers checkpoint writer, EAGLE-3 layer ids (None: the default), DFlash target layer ids)
TARGETS = {
    "gemma3": (lambda d: test_gemma.hf_checkpoint(d, "gemma3"), (1, 2, 3), (0, 3)),
    "gemma4": (lambda d: test_gemma.hf_checkpoint(d, "gemma4"), None, (1, 2)),
    "gemma4_shared": (lambda d: test_gemma.hf_checkpoint(d, "gemma4_shared"), (1, 3, 5), (1, 4, 5)),
    "qwen3_moe": (lambda d: test_moe.hf_checkpoint(d, "qwen3_moe", sparse_scale=0.3), None, (0, 2)),
}


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """Per target: transformers' model, ours, and an EAGLE-3 head and a DFlash drafter written for it in
    the public layouts and loaded back (a Gemma DFlash drafter states Gemma's embedding scale)."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for name, (write, eagle_ids, dflash_ids) in TARGETS.items():
        hf = write(root / name)
        target = load_model(root / name)
        c = target.config
        write_eagle3(random_eagle3(c, layer_ids=eagle_ids, seed=3), root / f"{name}-eagle3", dtype=torch.float32)
        drafter = random_dflash(c, num_layers=2, block_size=8, target_layer_ids=dflash_ids, mask_token_id=5, seed=3)
        if c.sliding_window:  # Gemma: the block sees the embedding scale the trunk's layer 0 sees
            drafter.spec = replace(drafter.spec, input_embedding_scale=c.hidden_size**0.5)
        write_dflash(drafter, root / f"{name}-dflash", dtype=torch.float32)
        e3, df = root / f"{name}-eagle3", root / f"{name}-dflash"
        out[name] = SimpleNamespace(hf=hf, target=target, dir=root / name, eagle3_dir=e3, dflash_dir=df,
                                    head=load_eagle3(e3, target), dflash=load_dflash(df, target))
    return out


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(11)
    return [torch.randint(1, 4096, (n,), generator=g).tolist() for n in (1, 6, 13, 21)]  # past the window of 8


@pytest.fixture(scope="module")
def ar_outputs(families, prompts):
    return {name: Generator(f.target).generate(prompts, NEW_TOKENS).outputs for name, f in families.items()}


def hidden_states(hf, tokens: list[int]) -> tuple[torch.Tensor, ...]:
    """transformers' hidden states [T,C] of one sequence (entry 0: the embedding; the last final-normed)."""
    with torch.no_grad():
        return tuple(h[0] for h in hf(torch.tensor([tokens]), output_hidden_states=True).hidden_states)


def close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    # the same float32 math; attention over a cache of another size sums in another order
    assert (ours - ref).abs().max() <= 1e-4 * max(ref.abs().max(), 1.0), what


@pytest.mark.parametrize("name", list(TARGETS))
def test_captured_features_are_transformers_hidden_states(families, name):
    f = families[name]
    L = f.target.config.num_layers
    _, eagle_ids, _ = TARGETS[name]
    assert f.head.spec.layer_ids == (eagle_ids or default_layer_ids(L))  # the file's convention, read back
    tokens = torch.randint(0, 4096, (1, 30), generator=torch.Generator().manual_seed(1))
    hs = hidden_states(f.hf, tokens[0].tolist())
    for ids, capture, offset in ((f.head.spec.layer_ids, f.head.feature_layers, 0),
                                 (f.dflash.spec.target_layer_ids, f.dflash.feature_layers, 1)):
        with torch.no_grad():
            _, feats = chunk_forward(f.target, f.target.new_cache(1, 48), tokens, torch.zeros(1, dtype=torch.long),
                                     capture=capture)
        close(feats[0], torch.cat([hs[i + offset] for i in ids], -1), f"{name} {ids}")


# (drafter, depth or tree construction, topk or node budget, budget)
CASES = {"eagle3-chain": ("eagle3", 5, 1, 5), "eagle3-tree16": ("eagle3", 4, 4, 16),
         "dflash-chain": ("dflash", TreeConstruction.CHAIN, 7, 0),
         "dflash-tree16": ("dflash", TreeConstruction.BEST_FIRST, 16, 0)}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(TARGETS))
def test_speculation_equals_ar(families, prompts, ar_outputs, name, case):
    f = families[name]
    kind, a, b, c = CASES[case]
    if kind == "eagle3":
        drafters = {a: Eagle3Drafter(f.head, f.target, a, b, c)}
    else:
        drafters = {7: DFlashDrafter(f.dflash, f.target, 8, b, a)}
    assert Generator(f.target, drafters).generate(prompts, NEW_TOKENS).outputs == ar_outputs[name]


def committed(state) -> list[list[int]]:
    return [state.tokens[b, :n].tolist() for b, n in enumerate(state.seq_lens.tolist())]


def hf_features(hf, rows: list[list[int]], ids: tuple[int, ...], offset: int) -> list[torch.Tensor]:
    """Per row [len - 1, n*C]: transformers' hidden states at `ids` (+ offset) of every committed token
    but the root (what a drafter's prompt slots hold)."""
    out = []
    for row in rows:
        hs = hidden_states(hf, row)
        out.append(torch.cat([hs[i + offset][: len(row) - 1] for i in ids], -1))
    return out


@pytest.mark.parametrize("name", list(TARGETS))
def test_long_accepted_paths_keep_the_eagle3_head_on_transformers_features(families, prompts, ar_outputs, name):
    f = families[name]
    full = [p + o for p, o in zip(prompts, ar_outputs[name])]
    drafter = Eagle3Oracle(f.head, f.target, 6, 2, 6, continuation=full)
    gen = Generator(f.target, {6: drafter})
    result = gen.generate(prompts, NEW_TOKENS)
    assert result.outputs == ar_outputs[name] and result.mean_accepted_length > 4
    state = next(iter(gen.workspaces.values())).state
    rows = committed(state)
    scratch = Eagle3Drafter(f.head, f.target, 1, 1, 1)
    with torch.inference_mode():
        scratch.start(rows, state, hf_features(f.hf, rows, f.head.spec.layer_ids, 0))
        for b, row in enumerate(rows):
            n = len(row) - 1
            close(drafter.cache.kv.k[0][b, :, :n], scratch.cache.kv.k[0][b, :, :n], f"{name} row {b} K")
            close(drafter.cache.kv.v[0][b, :, :n], scratch.cache.kv.v[0][b, :, :n], f"{name} row {b} V")
        last = state.rounds == state.rounds.max()  # a finished row's root hidden is no longer kept
        close(drafter.cache.root_hidden[last], scratch.cache.root_hidden[last], f"{name} root hidden")


class DFlashOracle(DFlashDrafter):
    """Runs the real block forward, then makes the AR continuation (known in advance) each depth's
    best draft by far (a tied Gemma head's logits spread wide), so rounds accept long paths; its
    context is still written by the real `observe` from the target's features."""

    def __init__(self, *args, continuation, **kw):
        super().__init__(*args, **kw)
        self.continuation = continuation  # per row: prompt + AR output

    def block_logprobs(self, state):
        lp = super().block_logprobs(state)  # [B,K,V]
        bonus = torch.zeros_like(lp)
        for b in range(lp.shape[0]):
            L = int(state.seq_lens[b])
            for k, t in enumerate(self.continuation[b][L : L + lp.shape[1]]):
                bonus[b, k, t] = 1e4
        return torch.log_softmax(lp + bonus, -1)


@pytest.mark.parametrize("name", list(TARGETS))
def test_long_accepted_paths_keep_the_dflash_context_on_transformers_features(families, prompts, ar_outputs, name):
    f = families[name]
    full = [p + o for p, o in zip(prompts, ar_outputs[name])]
    drafter = DFlashOracle(f.dflash, f.target, 8, 12, TreeConstruction.BEST_FIRST, continuation=full)
    gen = Generator(f.target, {7: drafter})
    result = gen.generate(prompts, NEW_TOKENS)
    assert result.outputs == ar_outputs[name] and result.mean_accepted_length > 4
    state = next(iter(gen.workspaces.values())).state
    rows = committed(state)
    scratch = DFlashDrafter(f.dflash, f.target, 8, 8, TreeConstruction.CHAIN)
    with torch.inference_mode():
        scratch.start(rows, state, hf_features(f.hf, rows, f.dflash.spec.target_layer_ids, 1))
        for b, row in enumerate(rows):
            n = len(row) - 1
            for i in range(f.dflash.config.num_layers):
                close(drafter.cache.k[i][b, :, :n], scratch.cache.k[i][b, :, :n], f"{name} row {b} layer {i} K")
                close(drafter.cache.v[i][b, :, :n], scratch.cache.v[i][b, :, :n], f"{name} row {b} layer {i} V")
        close(DFlashDrafter.block_logprobs(drafter, state), scratch.block_logprobs(state), f"{name} block")


SHAPES = {"eagle3": {"chain": ["--depth", "5", "--topk", "1"], "tree16": ["--depth", "4", "--topk", "4",
                                                                         "--tree-budget", "16"]},
          "dflash": {"chain": [], "tree16": ["--tree-construction", "best_first", "--tree-budget", "16"]}}


PROMPT = "def add(a, b):\n    return a + b\n\nprint("


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
@pytest.mark.parametrize("name", ["gemma4", "qwen3_moe"])
def test_generate_with_a_drafter_directory_equals_ar(families, capsys, name, kind):
    f = families[name]
    drafter = f.eagle3_dir if kind == "eagle3" else f.dflash_dir
    for shape, argv in SHAPES[kind].items():
        capsys.readouterr()
        assert main(["generate", "--target", str(f.dir), "--drafter", str(drafter), "--prompt", PROMPT,
                     "--max-new-tokens", "20", "--device", "cpu", "--compare-ar", "--json", *argv]) in (0, None)
        report = json.loads(capsys.readouterr().out)
        assert report["knobs"]["drafter"] == kind and report["identical_to_ar"], shape


@pytest.mark.parametrize("target,drafter,message", [
    ("gemma3_narrow", "qwen3_moe-eagle3", "EAGLE-3 head target_hidden_size 64 != target hidden_size 32"),
    ("gemma3_narrow", "gemma4-dflash", "DFlash drafter hidden_size 64 != target hidden_size 32"),
    ("gemma3_small_vocab", "qwen3_moe-eagle3", "EAGLE-3 head vocab_size 4096 != target vocab_size 2048"),
    ("gemma3_small_vocab", "gemma4_shared-dflash", "DFlash drafter vocab_size 4096 != target vocab_size 2048"),
    ("qwen3_moe", "gemma4_shared-eagle3", "ids [1, 3, 5] (layer inputs) name layer(s) [3, 5] outside the target's 3"),
    ("qwen3_moe", "gemma4_shared-dflash", "name layer(s) [4, 5] outside the target's 3 layers"),
    ("gemma3", "qwen3_moe-dflash", "built for a target of 3 layers (num_target_layers); this target has 4"),
    ("qwen3_moe", "gemma3-eagle3", "name layer(s) [3] outside the target's 3 layers"),
])
def test_a_drafter_for_another_target_is_one_error_line(families, tmp_path_factory, capsys, target, drafter, message):
    root = families["gemma3"].dir.parent
    extra = {"gemma3_narrow": dict(hidden_size=32), "gemma3_small_vocab": dict(vocab_size=2048)}
    if target in extra and not (root / target).is_dir():
        test_gemma.hf_checkpoint(root / target, "gemma3", **extra[target])
    capsys.readouterr()
    code = main(["generate", "--target", str(root / target), "--drafter", str(root / drafter), "--prompt", "x",
                 "--device", "cpu", "--max-new-tokens", "2"])
    lines = [x for x in capsys.readouterr().err.splitlines() if x]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert message in lines[0]


def test_dflash_embedding_and_head_scales_are_the_public_references(families, tmp_path):
    """A Gemma drafter's `input_embedding_scale` (sqrt(C)), with an output multiplier and a logit cap:
    written to `dflash_config`, read back, and drafted with as z-lab's reference does: raw embedding
    rows (root and mask token alike) times the scale, the target's lm_head times the multiplier,
    then capped; the engine's block equals the training forward on those inputs."""
    f = families["gemma3"]
    C = f.target.config.hidden_size
    assert f.dflash.spec.input_embedding_scale == C**0.5
    model = random_dflash(f.target.config, num_layers=1, block_size=4, mask_token_id=9, seed=5)
    model.spec = replace(model.spec, input_embedding_scale=8.0, output_multiplier=0.5, final_logit_softcapping=3.0)
    write_dflash(model, tmp_path / "d", dtype=torch.float32)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())["dflash_config"]
    assert cfg == {"target_layer_ids": list(model.feature_layers), "mask_token_id": 9, "input_embedding_scale": 8.0,
                   "output_multiplier": 0.5, "final_logit_softcapping": 3.0}
    assert read_dflash_config(tmp_path / "d")[1] == model.spec
    loaded = load_dflash(tmp_path / "d", f.target)
    table = f.target.embed_tokens.weight
    assert torch.equal(loaded.mask_embedding, table[9] * 8.0)
    seq = torch.randint(1, 4096, (11,), generator=torch.Generator().manual_seed(2)).tolist()
    state = DecodeState.allocate(1, 32, 8, "cpu")
    state.reset([seq], (), 8)
    drafter = DFlashDrafter(loaded, f.target, 4, 3, TreeConstruction.CHAIN)
    hs = hidden_states(f.hf, seq)
    feats = torch.cat([hs[i + 1] for i in loaded.spec.target_layer_ids], -1)[None, :-1]  # [1,10,nC]
    with torch.inference_mode():
        drafter.start([seq], state, [feats[0]])
        ours = drafter.block_logprobs(state)  # [1,3,V]
        noise = torch.cat([table[seq[-1]][None] * 8.0, table[9][None].expand(3, -1) * 8.0])[None]  # [1,4,C]
        ctx_pos, pos = torch.arange(10)[None], torch.arange(10, 14)[None]
        mask = torch.ones(1, 1, 4, 14, dtype=torch.bool)
        hidden = loaded.forward_dense(feats, ctx_pos, noise, pos, mask)
        logits = 3.0 * torch.tanh(f.target.lm_head(hidden[:, 1:]) * 0.5 / 3.0)
    assert (ours - torch.log_softmax(logits, -1)).abs().max() < 1e-4


@pytest.mark.parametrize("change,message", [
    ({"input_embedding_scale": 0}, "input_embedding_scale = 0.0 must be finite and > 0"),
    ({"output_multiplier": "x"}, "output_multiplier must be a number"),
    ({"final_logit_softcapping": -1}, "final_logit_softcapping = -1.0 must be finite and >= 0"),
])
def test_bad_dflash_scales_are_one_line(families, tmp_path, change, message):
    from specpilot.errors import CheckpointError

    write_dflash(random_dflash(families["gemma3"].target.config, num_layers=1, mask_token_id=1), tmp_path / "d",
                 dtype=torch.float32)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    cfg["dflash_config"].update(change)
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=message) as err:
        read_dflash_config(tmp_path / "d")
    assert "\n" not in str(err.value)
