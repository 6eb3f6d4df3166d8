"""The report's reading of the journal."""

import torch

from specpilot.loop.journal import Event, EventKind
from specpilot.loop.report import rounds_from_journal


def event(kind, round, **data):
    return Event(kind, round, 0.0, "2026-12-01T00:00:00+00:00", kind.value, data)


def test_a_stop_before_a_round_is_not_a_round():
    """The loop stops before round 6 when it would not fit (run4 on the H200 rendered a phantom
    'Round 6: incumbent None (cut short)' from that stop event)."""
    events = [event(EventKind.MEASURE, 5, incumbent={"name": "stock"}), event(EventKind.ROUND_END, 5, seconds=44.0),
              event(EventKind.STOP, 6, reason="budget")]
    rounds = rounds_from_journal(events)
    assert [r["index"] for r in rounds] == [5]
    assert rounds[0]["completed"]


def test_a_round_cut_short_stays_in_the_report():
    events = [event(EventKind.MEASURE, 1, incumbent={"name": "stock"}), event(EventKind.PROPOSALS, 1, counts={"knob": 3})]
    (only,) = rounds_from_journal(events)
    assert only["index"] == 1 and not only["completed"] and only["proposals"] == {"knob": 3}


def test_patches_are_summarised_by_their_files_and_lines_never_as_no_change():
    from specpilot.cli.run import summary
    from specpilot.loop.patches import summarize
    from specpilot.loop.report import render_patches

    patch = ("diff --git a/specpilot/engine/steps.py b/specpilot/engine/steps.py\nindex 1..2 100644\n"
             "--- a/specpilot/engine/steps.py\n+++ b/specpilot/engine/steps.py\n@@ -1,2 +1,1 @@\n-x\n-y\n+z\n")
    s = summarize(patch).to_dict()
    gain = {"gain": 0.2, "gain_lower": 0.1, "gain_upper": 0.3}
    evaluation = {"candidate": "coding:r1#1", "agent": "coding", "gap": "overhead", "patch_summary": s,
                  "verdict": "promote", "reasons": ["clears-threshold"], "entry_id": 4, **gain}
    rejected = {**evaluation, "candidate": "coding:r1#2", "verdict": "reject", "reasons": ["guard-failed"],
                "gain": None, "gain_lower": None, "gain_upper": None, "entry_id": 5}
    report = {"deployment": {"name": "fx", "device": "cpu"}, "run": {"stop": "rounds", "out": "/tmp/x"},
              "final": None, "rounds": [{"index": 1, "evaluations": [evaluation, rejected]}],
              "final_system": {"name": "coding:r1#1", "changes_from_stock": {"patch": [False, True]},
                               "patch_summary": s},
              "promotions": [{"round": "r1", "name": "coding:r1#1", "changes": {}, "patch_summary": s,
                              "patch_diff": patch, "entry_id": 4, **gain}]}
    text = summary(report)
    line = "patch specpilot/engine/steps.py (+1 -2)"
    assert "no change" not in text and f"final system 'coding:r1#1': {line}" in text
    assert f"promoted in r1: coding:r1#1 ({line}) +20.0% [+10.0%, +30.0%]" in text
    assert f"patch not promoted in round 1: coding:r1#2 ({line}) reject (guard-failed) n/a" in text
    md = "\n".join(render_patches(report))
    assert ("| 1 | `coding:r1#2` | coding | overhead | `specpilot/engine/steps.py` (+1 -2) | **reject** "
            "(guard-failed)") in md
    assert f"Promoted `coding:r1#1` (entry 4, +20.0% [+10.0%, +30.0%]): {line}" in md and "+z" in md


def test_a_run_without_its_final_benchmark_says_why():
    """A run whose final measurement failed (an H200 run on fixture-x16-batch, whose AR twin was
    invalid) rendered 'interrupted, or disabled'; the report now carries the stop errors and names
    them. Checked on the committed H200 report with its final benchmark taken out."""
    import json
    from pathlib import Path

    from specpilot.loop.report import render_markdown

    path = Path(__file__).resolve().parents[2] / "results" / "loop" / "fixture-x16-batch" / "report.json"
    report = json.loads(path.read_text())
    assert report["final"] is not None
    report["final"] = None
    report["run"]["errors"] = ["the final measurement failed: system 'ar': no"]
    assert "No final benchmark in this run: the final measurement failed: system 'ar': no." in render_markdown(report)
    report["run"]["errors"] = []
    assert "No final benchmark in this run: interrupted, or disabled." in render_markdown(report)


def test_the_summary_names_undecided_gains_and_the_errors_that_stopped_the_run():
    """An undecided candidate whose whole interval lies above 0 is a gain not yet certified (on the
    H200, EAGLE-3 at +6.2% [+1.9%, +11.4%] under a 2% bar): the summary names it; one whose interval
    reaches below 0, or a rejected one, it does not."""
    from specpilot.cli.run import summary

    def ev(name, verdict, gain, low, high, bound):
        return {"candidate": name, "changes": {"tree_budget": [7, 16]}, "incumbent": "stock", "verdict": verdict,
                "gain": gain, "gain_lower": low, "gain_upper": high, "lower_bound": bound, "threshold": 0.02}

    rounds = [{"index": 1, "evaluations": [ev("small", "need-more-data", 0.03, 0.01, 0.05, 0.005),
                                           ev("big", "need-more-data", 0.06, 0.02, 0.11, 0.008),
                                           ev("unsure", "need-more-data", 0.02, -0.01, 0.05, -0.02),
                                           ev("slow", "reject", 0.03, 0.01, 0.05, 0.005)]}]
    report = {"deployment": {"name": "fx", "device": "cpu"}, "final": None, "rounds": rounds, "promotions": [],
              "run": {"stop": "error", "out": "/tmp/x", "errors": ["stopping: round 2 failed: boom"]},
              "final_system": {"name": "stock", "changes_from_stock": {}}}
    lines = summary(report).splitlines()
    undecided = [line for line in lines if line.startswith("  undecided")]
    assert [line.split(": ")[1].split(" ")[0] for line in undecided] == ["big", "small"]  # largest gain first
    assert undecided[0].endswith("+6.0% [+2.0%, +11.0%] over stock; lower bound +0.8% < bar +2.0%: a later round "
                                 "(--resume) may time it again")
    assert "  stopping: round 2 failed: boom" in lines


def test_the_summary_says_when_an_undecided_bound_cleared_the_bar_but_not_the_correction():
    """A candidate whose bound clears the bar alone but not after the round's Holm correction (seen on
    CPU: +11.1% against a +10.3% bar, adjusted p 0.030) is not reported as 'below the bar'."""
    from specpilot.cli.run import why_undecided

    e = {"lower_bound": 0.111, "threshold": 0.103, "adjusted_p": 0.0298,
         "reasons": ["clears-threshold", "not-significant-after-multiplicity"]}
    assert why_undecided(e) == ("lower bound +11.1% clears the bar +10.3% alone, not after correcting for the "
                                "round's other candidates (adjusted p 0.030)")
    assert why_undecided({**e, "lower_bound": 0.09, "reasons": ["undecided"]}) == "lower bound +9.0% < bar +10.3%"
    assert why_undecided({**e, "reasons": ["contaminated"]}) == ("lower bound +11.1% >= bar +10.3%, undecided "
                                                                 "(contaminated)")


def test_the_final_system_says_what_ran_on_the_cpu(target_dir):
    """Issue 56: a CPU run's report listed `cuda_graphs = true` and `kernel = "cublas"` as if they
    ran. Each knob the device did not run as set carries a TOML comment saying what ran (the text
    still loads as the very system the memory keeps), and report.json has them under `on_device`;
    on CUDA nothing is noted. What is noted is what the engine does on a CPU."""
    import tomllib

    from specpilot.config import Deployment, DrafterKind, System
    from specpilot.engine.session import Session
    from specpilot.loop.report import system_toml

    stock = System()
    toml, on_device = system_toml(stock, "cpu")
    assert System.from_dict(tomllib.loads(toml)).fingerprint() == stock.fingerprint()
    lines = {line.split(" = ")[0]: line for line in toml.splitlines()}
    assert lines["cuda_graphs"].startswith("cuda_graphs = true  # on cpu: false (CUDA graphs are captured on CUDA only")
    assert lines["kernel"].startswith('kernel = "cublas"  # on cpu: "torch" (F.linear off CUDA is torch\'s own matmul')
    assert "#" not in lines["depth"] and "#" not in lines["attention"]
    assert set(on_device) == {"cuda_graphs", "kernel", "draft_kernel"}
    assert on_device["cuda_graphs"]["set"] is True and on_device["cuda_graphs"]["ran"] is False
    assert system_toml(stock, "cuda") == (stock.to_toml(), {}) and system_toml(stock, None) == (stock.to_toml(), {})
    ngram = stock.with_changes(name="ngram", drafter=DrafterKind.NGRAM, verify_compile=True)
    assert set(system_toml(ngram, "cpu")[1]) == {"cuda_graphs", "kernel", "verify_compile"}  # no drafter model
    session = Session.load(Deployment(name="tiny", target=str(target_dir), drafter="ngram"), device="cpu")
    from specpilot.engine.steps import verify_step

    generator = session.generator(ngram)
    assert not generator.use_graphs and generator.rounds.steps.verify is verify_step  # eager, uncompiled
    projections = [m for name, m in session._target_for(ngram).named_modules() if name.endswith(("proj", "lm_head"))]
    assert projections and all(type(m) is torch.nn.Linear for m in projections)  # F.linear: torch's matmul


def test_the_report_shows_the_held_out_gain_beside_the_final_gain():
    """report.md and the summary carry the held-out line when the final measurement ran held-out
    prompts; a report from before held-out runs (no such keys) renders as it did."""
    import json
    from pathlib import Path

    from specpilot.cli.run import summary
    from specpilot.loop.report import heldout_line, render_markdown

    path = Path(__file__).resolve().parents[2] / "results" / "loop" / "fixture-x16-batch" / "report.json"
    report = json.loads(path.read_text())
    assert "heldout" not in report["final"] and heldout_line(report["final"]) is None
    assert "eld-out" not in render_markdown(report) and "held-out" not in summary(report)
    iv = {"estimate": 1.08, "low": 1.01, "high": 1.15, "level": 0.95, "method": "bca", "no_interval": None}
    report["final"]["heldout"] = {"prompts": 8, "final_gain": iv, "bench": {},
                                  "final_speedup": {**iv, "estimate": 2.5, "low": 2.3, "high": 2.7},
                                  "stock_speedup": {**iv, "estimate": 2.3, "low": 2.1, "high": 2.5}}
    line = ("held-out prompts (never seen by the loop, 8 prompts): final / stock 1.08x [1.01x, 1.15x]; "
            "final over AR 2.50x [2.30x, 2.70x]")
    assert heldout_line(report["final"]) == line
    assert "Held-out prompts (never seen by the loop, 8 prompts): final / stock 1.08x [1.01x, 1.15x]" in (
        render_markdown(report))
    assert f"  {line}" in summary(report)
    report["final"]["heldout"], report["final"]["heldout_note"] = None, "the held-out run failed: boom"
    assert "held-out prompts (never seen by the loop): the held-out run failed: boom" in summary(report)
