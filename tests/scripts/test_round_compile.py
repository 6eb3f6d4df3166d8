"""scripts/round_compile.py on CPU: each system and its compiled twins on the same prompts (the
twins traced by Dynamo with its "eager" backend: no inductor on CPU), and the table."""

import json

import pytest
import torch

from specpilot.bench.prompts import prompt_ids
from specpilot.config import load_deployment, load_system
from specpilot.engine.session import Session
from specpilot.models import ops


@pytest.fixture
def script(bench_script, monkeypatch):
    monkeypatch.setattr(ops, "STATIC_BACKEND", "eager")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    torch._dynamo.reset()
    yield bench_script("round_compile")
    torch._dynamo.reset()


@pytest.mark.slow
def test_each_system_runs_beside_its_compiled_twins_with_the_same_outputs(script, tmp_path):
    dep = load_deployment("fixture")
    session = Session.load(dep, device="cpu", dtype=torch.float32)
    prompts = [list(p.ids) for p in prompt_ids(dep, session.tokenizer, n_prompts=1)][:1]
    pair = script.run_variants(session, load_system("stock", dep), prompts, 8)
    assert set(pair["summary"]) == {"stock", "stock+draft", "stock+draft+verify"}
    assert {r["system"] for r in pair["rows"]} == set(pair["summary"]) and len(pair["rows"]) == 3
    for twin in pair["twins"].values():
        assert twin["same_outputs"] == 1 and twin["speedup_ms_per_token"]["mean"] > 0
    doc = {"created": "2026-12-04T00:00:00+00:00", "deployment": "fixture", "prompts": 1, "tokens": 8,
           "pairs": [pair], "environment": {"gpu": None, "device": "cpu", "git_commit": "abc", "versions": {"torch": "x"}}}
    json.dumps(doc)
    script.write_md(doc, tmp_path / "r.md")
    text = (tmp_path / "r.md").read_text()
    assert "| stock+draft+verify |" in text and "1/1 |" in text


def test_without_cuda_it_says_so_in_one_line(bench_script, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_script("round_compile").main(["--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == "error: round_compile.py measures on a CUDA device"
