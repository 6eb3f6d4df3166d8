"""`SessionRunner`: the runner inside every worker process, behind the controller's worker contract.

It holds the systems of one deployment over one loaded session (`control/arm.py` states the
contract: `warm` and `run`, each naming its system by knob dict). An isolated worker
(`control/pair.py`) builds it from one arm's spec and asks it for that system only, timed by the
controller from outside; a shared worker (`control/shared.py`) asks one runner for every knob-only
system of a comparison, all over one copy of the weights, and uses the times it reports.

With `workspaces` (the loop's GPU workers, `loop/runner.py`) a system's first warm-up also builds
every decoding workspace a timed request can need (`warm_workspaces`). The generator keeps one
workspace (KV cache, CUDA graphs, warmed prefill shapes) per (batch, capacity), the capacity
rounded up from prompt + new tokens + the tree's slack; the first request whose prompt lands in a
new capacity builds one — graph capture and a pass over every padded prefill shape — inside its
timed span. That costs several times the request's own time, more for a candidate whose deeper
tree needs more slack: one such block outweighs a real gain, so no timed request may build a
workspace (`scripts/first_request.py` measures a first request against its repeat).

Owns: serving a block of prompts as the deployment's regime serves them, the per-system
generators and their warm-up. Does not own timing from outside or what is sent when (`control/`).
"""

from __future__ import annotations

import hashlib

from specpilot.config import Deployment, Regime, Sampling, System, load_deployment
from specpilot.engine.generator import Generator
from specpilot.engine.sampling import SamplingParams
from specpilot.engine.serving import Request, ServingEngine
from specpilot.engine.session import Session
from specpilot.errors import ConfigError


def sampling_params(sampling: Sampling, seed: int | None = None) -> SamplingParams | None:
    """The `SamplingParams` of one request under `sampling` with `seed`; None when greedy (the greedy rounds)."""
    if sampling.greedy:
        return None
    return SamplingParams(float(sampling.temperature), sampling.top_k, float(sampling.top_p), float(sampling.min_p),
                          seed)


def prompt_seeds(prompts: list[list[int]]) -> list[int]:
    """Seeds for prompts that came without any (warm-up, a caller that sends none): a function of
    each prompt's tokens and its place in the request, so a repeat samples alike."""
    return [int.from_bytes(hashlib.sha256(f"{i}:{list(p)}".encode()).digest()[:8], "big") >> 1
            for i, p in enumerate(prompts)]


def regime_sampling(regime: Regime, prompts: list[list[int]], seeds: list[int] | None = None) -> list | None:
    """Per-prompt `SamplingParams` of a sampled regime (`seeds`, one per prompt, else `prompt_seeds`);
    None when the regime is greedy (the greedy rounds, exactly as before sampling existed)."""
    if not regime.sampled:
        return None
    seeds = prompt_seeds(prompts) if seeds is None else [int(s) for s in seeds]
    if len(seeds) != len(prompts):
        raise ConfigError(f"{len(seeds)} sampling seeds for {len(prompts)} prompts")
    return [sampling_params(regime.sampling, s) for s in seeds]


def run_regime(generator: Generator, regime: Regime, prompts: list[list[int]], max_new_tokens: int,
               stop_at_eos: bool = True, seeds: list[int] | None = None) -> tuple[list[list[int]], dict]:
    """Outputs per prompt and their timing, served as the regime serves requests: static batches
    of `regime.batch`, or continuous batching in `regime.batch` slots (then the one span timed is
    the whole serving run, prefills included, and there are no CUDA-event times; `saturated_s` and
    `saturated_tokens` are its stretches with every slot taken, `ServingResult.saturated_*`, and
    None under static batches). A sampled regime samples every prompt with its seed (`regime_sampling`)."""
    B = regime.batch
    timing = {"wall_s": 0.0, "wall_prefill_s": 0.0, "gpu_s": 0.0, "gpu_prefill_s": 0.0, "decode_s": 0.0}
    outputs: list[list[int]] = []
    sampling = regime_sampling(regime, prompts, seeds)
    if regime.continuous:
        requests = [Request(tuple(p), max_new_tokens, None, sampling[i] if sampling else None)
                    for i, p in enumerate(prompts)]
        served = ServingEngine(generator, B).run(requests, stop_at_eos)
        outputs = [r.output for r in served.requests]
        timing.update(wall_s=served.seconds, decode_s=served.seconds, gpu_s=float("nan"), gpu_prefill_s=float("nan"),
                      saturated_s=served.saturated_seconds, saturated_tokens=served.saturated_tokens)
    else:
        timing.update(saturated_s=None, saturated_tokens=None)
        for i in range(0, len(prompts), B):
            kw = {"sampling": sampling[i : i + B]} if sampling else {}
            result = generator.generate(prompts[i : i + B], max_new_tokens, stop_at_eos=stop_at_eos, **kw)
            outputs += result.outputs
            timing["wall_s"] += result.seconds
            timing["wall_prefill_s"] += result.prefill_seconds
            timing["gpu_s"] += result.gpu_seconds
            timing["gpu_prefill_s"] += result.gpu_prefill_seconds
            timing["decode_s"] += result.decode_seconds
    timing["tokens"] = sum(len(o) for o in outputs)
    return outputs, {k: (v if v == v else None) for k, v in timing.items()}


def system_of(deployment: Deployment, knobs: dict) -> System:
    """The system an arm's knob dict (its "name" included) names: the knobs over the deployment's stock."""
    knobs = dict(knobs)
    name = knobs.pop("name", "candidate")
    return deployment.stock.with_knobs(knobs, name)


class SessionRunner:
    """Systems of one deployment in one process, all sharing the session's loaded weights.

    Builds a generator per system on first use (keeping the `keep` most recent) and times its own
    requests — prefill apart from decode, by CUDA events where there is a GPU and by the wall clock
    as well. A shared worker trusts those times only because its code is the controller's own: a
    code-patch candidate runs in an isolated worker, timed from outside.
    """

    def __init__(self, spec, keep: int = 8, workspaces: bool = False):
        self.deployment = load_deployment(spec.deployment)
        self.system(spec.system)  # knobs the engine refuses fail the build, not the first request
        self.session = Session.load(self.deployment, device=getattr(spec, "device", None))
        self.keep = keep
        self.workspaces = workspaces
        self.warmed: dict[str, list[int]] = {}  # system fingerprint -> prompt lengths of its workspace warm-up
        self._recent: list[str] = []  # system fingerprints, least recently used first

    def system(self, knobs: dict) -> System:
        return system_of(self.deployment, knobs)

    def generator(self, knobs: dict) -> Generator:
        system = self.system(knobs)
        key = system.fingerprint()
        if key in self._recent:
            self._recent.remove(key)
        self._recent.append(key)
        while len(self._recent) > self.keep:
            old = self._recent.pop(0)
            self.session.forget(old)
            self.warmed.pop(old, None)  # a rebuilt generator has no workspaces: warm them again
        return self.session.generator(system)

    def warm(self, knobs: dict, prompts: list[list[int]], max_new_tokens: int) -> None:
        """One untimed request (EOS ignored); with `workspaces`, a system's first also builds its workspaces."""
        self.run(knobs, prompts, max_new_tokens, stop_at_eos=False)
        key = self.system(knobs).fingerprint()
        if self.workspaces and key not in self.warmed:
            self.warmed[key] = warm_workspaces(self.generator(knobs), self.deployment.regime.batch, prompts,
                                               max_new_tokens, self.deployment.regime)

    def run(self, knobs: dict, prompts: list[list[int]], max_new_tokens: int, stop_at_eos: bool = True,
            seeds: list[int] | None = None) -> dict:
        """Outputs per prompt and the request's timing, served as the regime serves them (a sampled
        regime: each prompt with its seed of `seeds`, the request pair's, `control.blocks.request_seeds`)."""
        outputs, timing = run_regime(self.generator(knobs), self.deployment.regime, prompts, max_new_tokens,
                                     stop_at_eos, seeds)
        return {"outputs": outputs, "timing": timing}


# The name `evaluate --runner` has always defaulted to (`control.arm.DEFAULT_RUNNER`): it enters each
# arm's fingerprint, and so the prompts the controller draws for it.
SystemRunner = SessionRunner


def workspace_lengths(generator, max_new_tokens: int) -> list[int]:
    """The shortest prompt length of each of the generator's smallest workspace capacities (as many
    as it keeps at once), for `max_new_tokens` new tokens; [] when the generator does not say."""
    capacity_for = getattr(generator, "capacity_for", None)
    keep = getattr(generator, "max_workspaces", 0)
    limit = getattr(generator, "max_positions", 0)
    if capacity_for is None or keep < 1 or limit < 1:
        return []
    lengths, last = [], None
    for length in range(1, limit + 1):
        try:
            cap = capacity_for(length, max_new_tokens)
        except ConfigError:  # prompt + new tokens beyond the context: no longer prompt fits either
            break
        if cap != last:
            if len(lengths) == keep:
                break
            lengths.append(length)
            last = cap
    return lengths


def warm_workspaces(generator, batch: int, prompts: list[list[int]], max_new_tokens: int,
                    regime: Regime | None = None) -> list[int]:
    """Generate `batch` prompts once at the shortest prompt length of each workspace capacity the
    generator keeps (the smallest `max_workspaces` of them, which hold every prompt of the shipped
    sets), largest first so the common small ones are the most recently used; the prompts are the
    warm-up prompt's tokens repeated, never a timed prompt; under a sampled `regime`, sampled (so
    the sampled rounds' graphs are the ones captured). Returns the lengths run."""
    seed = next((list(p) for p in prompts if p), None)
    if seed is None:
        return []
    lengths = workspace_lengths(generator, max_new_tokens)
    for length in reversed(lengths):
        prompt = (seed * (length // len(seed) + 1))[:length]
        rows = [prompt] * batch
        sampling = regime_sampling(regime, rows) if regime is not None else None
        generator.generate(rows, max_new_tokens, **({"sampling": sampling} if sampling else {}))
    return lengths
