"""`SystemRunner`: one system of one deployment behind the controller's worker contract.

The controller builds it inside an isolated worker process from an `ArmSpec`-like object with
`deployment` (path or shipped name), `system` (knob dict incl. name) and `device`, then calls
`warmup` and `generate`. Timing is measured by the controller from outside this process.
"""

from __future__ import annotations

from specpilot.config import Deployment, Regime, System, load_deployment
from specpilot.engine.generator import Generator
from specpilot.engine.serving import Request, ServingEngine
from specpilot.engine.session import Session


def run_regime(generator: Generator, regime: Regime, prompts: list[list[int]], max_new_tokens: int,
               stop_at_eos: bool = True) -> tuple[list[list[int]], dict]:
    """Outputs per prompt and their timing, served as the regime serves requests: static batches
    of `regime.batch`, or continuous batching in `regime.batch` slots (then the one span timed is
    the whole serving run, prefills included, and there are no CUDA-event times; `saturated_s` and
    `saturated_tokens` are its stretches with every slot taken, `ServingResult.saturated_*`, and
    None under static batches)."""
    B = regime.batch
    timing = {"wall_s": 0.0, "wall_prefill_s": 0.0, "gpu_s": 0.0, "gpu_prefill_s": 0.0, "decode_s": 0.0}
    outputs: list[list[int]] = []
    if regime.continuous:
        served = ServingEngine(generator, B).run([Request(tuple(p), max_new_tokens) for p in prompts], stop_at_eos)
        outputs = [r.output for r in served.requests]
        timing.update(wall_s=served.seconds, decode_s=served.seconds, gpu_s=float("nan"), gpu_prefill_s=float("nan"),
                      saturated_s=served.saturated_seconds, saturated_tokens=served.saturated_tokens)
    else:
        timing.update(saturated_s=None, saturated_tokens=None)
        for i in range(0, len(prompts), B):
            result = generator.generate(prompts[i : i + B], max_new_tokens, stop_at_eos=stop_at_eos)
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


class SystemRunner:
    def __init__(self, spec):
        deployment = load_deployment(spec.deployment)
        self.system = system_of(deployment, spec.system)
        self.session = Session.load(deployment, device=getattr(spec, "device", None))
        self.generator = self.session.generator(self.system)

    def warmup(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        self.generate(prompts, max_new_tokens)

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Outputs per prompt, served as the deployment's regime serves them."""
        return run_regime(self.generator, self.session.deployment.regime, prompts, max_new_tokens)[0]


class SessionRunner:
    """Every system of one deployment in one process, all sharing the session's loaded weights.

    The runner of a *shared* worker (`specpilot.control.shared`): it stays up across comparisons,
    builds a generator per system on first use (keeping the `keep` most recent), and times its own
    requests — prefill apart from decode, by CUDA events where there is a GPU and by the wall clock
    as well. Its timings are trusted only because its code is the controller's own: a code-patch
    candidate never runs here.
    """

    def __init__(self, spec, keep: int = 8):
        self.deployment = load_deployment(spec.deployment)
        self.session = Session.load(self.deployment, device=getattr(spec, "device", None))
        self.keep = keep
        self._recent: list[str] = []  # system fingerprints, least recently used first

    def system(self, knobs: dict) -> System:
        return system_of(self.deployment, knobs)

    def generator(self, knobs: dict):
        system = self.system(knobs)
        key = system.fingerprint()
        if key in self._recent:
            self._recent.remove(key)
        self._recent.append(key)
        while len(self._recent) > self.keep:
            self.session.forget(self._recent.pop(0))
        return self.session.generator(system)

    def warm(self, knobs: dict, prompts: list[list[int]], max_new_tokens: int) -> None:
        self.run(knobs, prompts, max_new_tokens, stop_at_eos=False)

    def run(self, knobs: dict, prompts: list[list[int]], max_new_tokens: int, stop_at_eos: bool = True) -> dict:
        """Outputs per prompt and the request's timing, served as the regime serves them."""
        outputs, timing = run_regime(self.generator(knobs), self.deployment.regime, prompts, max_new_tokens,
                                     stop_at_eos)
        return {"outputs": outputs, "timing": timing}
