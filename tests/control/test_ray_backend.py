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
from specpilot.control.rule import Reason  # noqa: E402
from specpilot.control.arm import ArmSpec  # noqa: E402
from specpilot.control.stats import GainEstimate, NoiseFloor  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # a local Ray instance and its actors

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
    return ArmSpec("fixture", {"name": name, "seconds": seconds}, workdir=WORKDIR, factory=f"fake_runners:{kind}")


def test_round_on_ray_actors(backend):
    assert backend.placement is Placement.ALTERNATE and backend.device_name().startswith("cpu")
    noise = NoiseFloor(GainEstimate((0.001, -0.001, 0.0005, -0.0005, 0.0), resamples=999),
                       CONFIG.procedure_key(backend.placement))
    controller = Controller(CONFIG, backend, ALWAYS_PASS, random_prompts, "fixture")
    result = controller.evaluate_round(arm("stock", 0.01),
                                       [arm("fast", 0.004), arm("slow", 0.02), arm("broken", 0.01, "BuildFailRunner")],
                                       noise)
    fast, slow, broken = result.evaluations
    # Which candidate wins depends on how busy the machine is; what the actors guarantee does not:
    # every block timed on their clock, each arm's time at least its runner's sleep.
    for e, seconds in ((fast, 0.004), (slow, 0.02)):
        assert e.estimate is not None, (e.decision, e.error)
        assert e.estimate.n == len(e.timings) == CONFIG.blocks
        assert e.estimate.lower <= e.estimate.gain <= e.estimate.upper
        for block in e.timings:
            assert sum(block["incumbent"][0]) >= 0.01 * CONFIG.block_prompts
            assert sum(block["candidate"][0]) >= seconds * CONFIG.block_prompts
    assert result.winner in (None, 0, 1)
    assert [e.screening is not None for e in result.evaluations] == [i == result.winner for i in range(3)]
    assert broken.decision.reasons == (Reason.WORKER_FAILED,) and "cannot load the model" in broken.error
