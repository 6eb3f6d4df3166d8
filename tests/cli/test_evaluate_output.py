"""`specpilot evaluate` defaults to the fixture deployment, its --help states each default once, and
its text (and `memory show`) gives the guard's numbers as one readable line, not a JSON blob."""

from __future__ import annotations

import json
import math
import re

import pytest

from specpilot.cli import main
from specpilot.cli.evaluate import format_evaluation, format_gate
from specpilot.control.arm import ArmSpec
from specpilot.control.config import ControllerConfig, Placement, Stage
from specpilot.control.controller import Costs, Evaluation
from specpilot.control.gate import GateResult
from specpilot.control.rule import Decision, Outcome, Reason
from specpilot.control.stats import GainEstimate, NoiseFloor
from specpilot.errors import ConfigError
from specpilot.memory.fingerprint import DeploymentFingerprint
from specpilot.memory.store import Memory

TOKEN_FORCING = {  # what `control.gate.controller_gate` stores: the verdict's fields
    "guard": "token-forcing", "baseline": "stock-ar", "passed": False, "violated": ["rate"],
    "candidate": {"sequences": 4, "tokens": 512, "mismatches": 9, "near_ties": 8, "large_margin": 1, "rate": 9 / 512,
                  "max_near_tie_nats": 0.3, "max_margin_nats": 2.5, "sequences_with_mismatch": 3},
    "stock": {"sequences": 4, "tokens": 512, "mismatches": 2, "near_ties": 2, "large_margin": 0, "rate": 2 / 512,
              "max_near_tie_nats": 0.1, "max_margin_nats": 0.1, "sequences_with_mismatch": 2},
    "rate": {"candidate_rate": 9 / 512, "stock_rate": 2 / 512, "difference": 7 / 512, "lower": 0.006, "upper": 0.02,
             "standard_error": 0.004, "confidence": 0.95, "resamples": 10000, "paired": True,
             "candidate_sequences": 4, "stock_sequences": 4},
    "rate_margin": 0.005, "rate_test": "excess", "near_tie_nats": 0.5, "large_margin_allowance": 0,
    "dtype": "bfloat16", "cautions": ["few-sequences"], "difference": 7 / 512, "bound": 0.006,
}


def test_token_forcing_summary_is_one_readable_line():
    line = format_gate(TOKEN_FORCING)
    assert "\n" not in line and "{" not in line
    assert line == ("token forcing vs stock AR (bfloat16 scorer): mismatches candidate 9/512 = 1.758%, "
                    "stock AR 2/512 = 0.391%; difference +1.367 pp, lower 95% bound +0.600 pp vs margin 0.50 pp; "
                    "large-margin mismatches 1 vs 0")


def test_other_gates_show_their_plain_numbers():
    summary = {"gate": "always-pass", "prompts": 4, "identical_outputs": 3, "identical_rate": 0.75,
               "nested": {"ignored": 1}}
    assert format_gate(summary) == "gate=always-pass, prompts=4, identical_outputs=3, identical_rate=0.75"
    assert format_gate({}) == ""
    assert "n/a" in format_gate({**TOKEN_FORCING, "bound": math.nan})  # NaN survives the memory's JSON


def evaluation(gate: GateResult) -> Evaluation:
    est = GainEstimate((0.05, 0.04, 0.06, 0.05, 0.045), resamples=500)
    noise = NoiseFloor(GainEstimate((0.001, -0.001, 0.0005, 0.0, -0.0005), resamples=500), "p")
    decision = Decision(Outcome.REJECT, (Reason.GUARD_FAILED,), 0.02, est.lower_bound(0.025), 0.025, 1, 1, 0.01)
    return Evaluation(ArmSpec("fx", {"name": "stock"}), ArmSpec("fx", {"name": "deep", "depth": 8}), Stage.SINGLE,
                      Placement.ALTERNATE, decision, noise, gate, est, None, Costs(total=3.0, blocks=est.n))


def guard_line(text: str) -> str:
    return next(x for x in text.splitlines() if x.strip().startswith("guard"))


def test_evaluation_text_and_memory_show(tmp_path, capsys):
    e = evaluation(GateResult(False, TOKEN_FORCING, "token forcing: rate"))
    line = guard_line(format_evaluation(e, "fx"))
    assert line == f"  guard       FAILED: {format_gate(TOKEN_FORCING)} (token forcing: rate)"
    path = tmp_path / "m.sqlite"
    fp = DeploymentFingerprint("fx", (), (), "ngram", (1, 1), "cpu")
    with Memory(path) as memory:
        entry = memory.record_evaluation(fp, e, ControllerConfig())
    assert main(["memory", "show", str(entry), "--memory", str(path)]) == 0
    assert guard_line(capsys.readouterr().out) == line
    assert main(["memory", "show", str(entry), "--memory", str(path), "--json"]) == 0
    stored = json.loads(capsys.readouterr().out)  # --json keeps every number
    assert stored["detail"]["evaluation"]["gate"]["summary"] == TOKEN_FORCING


def test_deployment_defaults_to_fixture(monkeypatch, tmp_path, capsys):
    from specpilot.memory import evaluate as library

    seen = []

    def stop(deployment, *args, **kwargs):
        seen.append(deployment)
        raise ConfigError("stopped here")

    monkeypatch.setattr(library, "evaluate_candidate", stop)
    assert main(["evaluate", "--candidate", "stock", "--devices", "cpu", "--memory", str(tmp_path / "m.sqlite")]) == 2
    assert seen == ["fixture"] and "stopped here" in capsys.readouterr().err


def test_help_states_each_default_once(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    for flag in ("--request-size N", "--max-new-tokens N", "--deployment DEPLOYMENT", "--blocks N"):
        entry = text.split(f" {flag} ", 2)[-1].split(" --", 1)[0]  # the help entry, after the usage line
        assert entry.count("(default") == 1, (flag, entry)
    assert "the deployment's max_new_tokens" in text and "(default: 256)" not in text
