"""Live progress: the observed backend passes every call through and prints what goes by."""

import io
from types import SimpleNamespace

from specpilot.control.blocks import Arm
from specpilot.control.config import ControllerConfig, Placement
from specpilot.control.arm import ArmSpec
from specpilot.loop.journal import Journal
from specpilot.loop.progress import ObservedBackend


class FakeSession:
    def __init__(self):
        self.calls = []

    def generate(self, arm, prompts, max_new_tokens):
        self.calls.append(("generate", arm))
        return (("out",),)

    def run_block(self, plan):
        self.calls.append(("block", plan))
        return f"result {plan}"

    def close(self):
        self.calls.append(("close",))


def test_calls_pass_through_and_lines_are_printed():
    session = FakeSession()
    inner = SimpleNamespace(name="local", placement=Placement.ALTERNATE, parallelism=2, device_name=lambda: "cpu",
                            close=lambda: None, open=lambda *a: session)
    stream = io.StringIO()
    backend = ObservedBackend(inner, Journal(None, stream))
    assert (backend.name, backend.placement, backend.parallelism, backend.device_name()) == (
        "local", Placement.ALTERNATE, 2, "cpu")
    config = ControllerConfig(blocks=5, warmup_blocks=1)
    s = backend.open(ArmSpec("d", {"name": "stock"}), ArmSpec("d", {"name": "knob:depth=3"}), config, ())
    assert s.generate(Arm.CANDIDATE, [[1]], 4) == (("out",),) and s.generate(Arm.INCUMBENT, [[1]], 4)
    assert [s.run_block(i) for i in range(6)] == [f"result {i}" for i in range(6)]
    s.close()
    assert session.calls[-1] == ("close",) and len(session.calls) == 9
    text = stream.getvalue()
    assert "[1] knob:depth=3: workers up" in text and "guard outputs generated (1 prompts)" in text
    assert text.count("paired blocks timed") == 3  # every ceil(6 / 3) blocks
    noise = backend.open(ArmSpec("d", {"name": "stock"}), ArmSpec("d", {"name": "stock"}), config, ())
    assert noise is not None and "[2] stock (noise: stock vs stock)" in stream.getvalue()
