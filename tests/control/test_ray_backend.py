"""The Ray backend on CPU with a local Ray instance (skipped when Ray is not installed).

Each pair session is a Ray actor that starts the two arms' worker processes and times whole
blocks itself; two candidates of a round are evaluated by two actors at once.
"""

import pytest

ray = pytest.importorskip("ray")

from fake_runners import WORKDIR, random_prompts  # noqa: E402
from specpilot.control.backends.base import make_backend  # noqa: E402
from specpilot.control.config import ControllerConfig, Placement  # noqa: E402
from specpilot.control.controller import Controller  # noqa: E402
from specpilot.control.gate import ALWAYS_PASS  # noqa: E402
from specpilot.control.rule import Reason, Verdict  # noqa: E402
from specpilot.control.spec import RunnerSpec  # noqa: E402
from specpilot.control.stats import GainEstimate, NoiseFloor  # noqa: E402

CONFIG = ControllerConfig(blocks=6, requests_per_block=2, extra_blocks=0, max_new_tokens=8, resamples=999,
                          warmup_requests=1, request_timeout_s=30, startup_timeout_s=120)


@pytest.fixture(scope="module")
def backend():
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield make_backend("ray", use_gpus=False, max_parallel=2)
    finally:
        ray.shutdown()


def arm(name, seconds, kind="SpeedRunner"):
    return RunnerSpec("fixture", {"name": name, "seconds": seconds}, workdir=WORKDIR, factory=f"fake_runners:{kind}")


def test_round_on_ray_actors(backend):
    assert backend.placement is Placement.ALTERNATE and backend.device_name().startswith("cpu")
    noise = NoiseFloor(GainEstimate((0.001, -0.001, 0.0005, -0.0005, 0.0), resamples=999),
                       CONFIG.procedure_key(backend.placement))
    controller = Controller(CONFIG, backend, ALWAYS_PASS, random_prompts, "fixture")
    result = controller.evaluate_round(arm("stock", 0.01),
                                       [arm("fast", 0.004), arm("slow", 0.02), arm("broken", 0.01, "BuildFailRunner")],
                                       noise)
    fast, slow, broken = result.evaluations
    assert result.winner == 0 and fast.verdict is Verdict.PROMOTE and fast.screening is not None
    assert slow.verdict is not Verdict.PROMOTE and slow.estimate.gain < 0
    assert broken.decision.reasons == (Reason.WORKER_FAILED,) and "cannot load the model" in broken.error
