"""`gate` (force + compare) and `controller_gate` (what the controller loads by name)."""

from __future__ import annotations

import pytest

from specpilot.errors import ConfigError
from specpilot.guard.config import GuardConfig
from specpilot.guard.gate import gate, rejection_reason, scorer_of
from specpilot.guard.verdict import compare

from .conftest import MAX_NEW

CONFIG = GuardConfig(resamples=2000)


def test_gate_forces_records_and_reuses_a_forced_stock(session, records, forced):
    v = gate(session, records("tree-bias"), records("ar"), CONFIG)
    assert v == compare(forced("tree-bias"), forced("ar"), CONFIG)
    assert gate(session.target, records("tree-bias"), forced("ar"), CONFIG) == v  # a Transformer works too
    assert scorer_of(session) is session.target
    assert rejection_reason(v).startswith("token forcing: mismatch rate")
    assert rejection_reason(gate(session, records("tree"), forced("ar"), CONFIG)) == ""


def test_gate_checks_prompts_before_forcing(session, records):
    with pytest.raises(ConfigError, match="not for the same prompts"):
        gate(session, records("tree")[:3], records("ar"), CONFIG)


@pytest.fixture(scope="module")
def deployment_file(tmp_path_factory, checkpoints):
    path = tmp_path_factory.mktemp("dep") / "guard-test.toml"
    path.write_text(f'name = "guard-test"\ntarget = "{checkpoints["target"]}"\ndrafter = "{checkpoints["drafter"]}"\n'
                    "[regime]\nbatch = 8\n")
    return str(path)


def test_controller_gate_against_stock_ar(deployment_file, records, prompts):
    control = pytest.importorskip("specpilot.control.gate")
    from specpilot.control.arm import ArmSpec

    assert control.load_gate().__name__ == "controller_gate"  # the controller's default name resolves

    def request(name):
        outputs = tuple(r.output_ids for r in records(name))
        spec = ArmSpec(deployment_file, {"name": name}, device="cpu")
        return control.GateRequest(deployment_file, spec, spec, tuple(map(tuple, prompts)), outputs, outputs, MAX_NEW)

    ok = control.load_gate()(request("tree"))
    assert ok.passed and ok.summary["baseline"] == "stock-ar" and ok.summary["candidate"]["mismatches"] == 0
    bad = control.load_gate()(request("tree-unverified"))
    assert not bad.passed and "large-margin" in bad.reason and bad.summary["violated"] == ["rate", "large-margin"]
