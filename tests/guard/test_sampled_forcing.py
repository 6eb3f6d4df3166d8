"""The sampling guard on the engine's own sampled outputs, through `specpilot guard --temperature`.

Stock is sampled AR; the candidates are a draft-model tree verified by exact rejection sampling
(passes) and the same tree with a fault injected into the engine (`engine.faults`): a broken
rejection rule, the drafter's temperature on the target, and the article's logit bias (+2 on
every 7th id) from the 16th generated token on (the article's 2048, scaled to these short runs).
Each side: ROWS prompts x NEW tokens, seeds per row.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from specpilot.cli import main
from specpilot.engine.drafters.draft_model import DraftModelDrafter
from specpilot.engine.generator import Generator
from specpilot.engine.sampling import SamplingParams
from specpilot.guard.records import OutputRecord, read_records, write_records
from specpilot.guard.sampled_forcing import sampled_pit
from specpilot.guard.sampling import SamplingGuardConfig, uniformity
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import write_noisy_drafter

ROWS, NEW = 32, 48  # 1536 tokens per side
PARAMS = SamplingParams(1.0, top_k=20, top_p=0.9)
STOCK_SEED = 20_000  # stock's rows: seeds 20000..; the candidates': 0..
FLAGS = ("--temperature", "1.0", "--top-k", "20", "--top-p", "0.9")


@pytest.fixture(scope="module")
def engine(target_dir, tmp_path_factory):
    target = load_model(target_dir)
    drafter = load_model(write_noisy_drafter(target_dir, tmp_path_factory.mktemp("noisy") / "drafter"))
    g = torch.Generator().manual_seed(21)
    prompts = [torch.randint(1, 4096, (int(n),), generator=g).tolist() for n in torch.randint(1, 9, (ROWS,), generator=g)]
    root = tmp_path_factory.mktemp("sampled_guard")
    written = {}

    def outputs(name: str, fault: str | None = None, seed0: int = 0) -> str:
        path = root / f"{name}-{fault or 'exact'}-{seed0}.jsonl"
        if path in written:
            return written[path]
        gen = Generator(target, {3: DraftModelDrafter(drafter, 3, 3, 8)} if name != "ar" else {}, fault=fault)
        rows = [replace(PARAMS, seed=seed0 + i) for i in range(ROWS)]
        result = gen.generate(prompts, NEW, stop_at_eos=False, sampling=rows)
        write_records(path, [OutputRecord(tuple(p), tuple(o)) for p, o in zip(prompts, result.outputs)])
        written[path] = str(path)
        return str(path)

    return target, target_dir, outputs


def guard(target_dir, candidate, stock, *extra):
    return main(["guard", "--target", str(target_dir), "--candidate", candidate, "--stock", stock,
                 "--device", "cpu", *FLAGS, *extra])


def test_stock_u_values_are_uniform(engine):
    target, _, outputs = engine
    u = sampled_pit(target, read_records(outputs("ar")), PARAMS)
    assert u.shape == (ROWS * NEW,) and not torch.isnan(u).any()
    assert uniformity(u, SamplingGuardConfig()).p_value > 0.01


def test_exact_speculative_sampling_passes(engine, capsys):
    _, target_dir, outputs = engine
    stock = outputs("ar", seed0=STOCK_SEED)
    assert guard(target_dir, outputs("tree"), stock, "--json") == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["passed"] and verdict["candidate"]["scored"] == ROWS * NEW and "few-tokens" in verdict["cautions"]


@pytest.mark.parametrize("fault", ["sampling-rule:correction-from-p", "target-temperature:0.7",
                                   "logit-bias:2:every=7:after=16"])
def test_faulted_engines_are_rejected(engine, capsys, fault):
    _, target_dir, outputs = engine
    code = guard(target_dir, outputs("tree", fault), outputs("ar", seed0=STOCK_SEED), "--json")
    verdict = json.loads(capsys.readouterr().out)
    assert code == 1 and not verdict["passed"] and "stock-nonuniform" not in verdict["cautions"]


def test_bad_sampling_settings_are_one_error_line(engine, capsys):
    _, target_dir, outputs = engine
    stock = outputs("ar")
    code = main(["guard", "--target", str(target_dir), "--candidate", stock, "--stock", stock, "--device", "cpu",
                 "--temperature", "1", "--top-p", "1.5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: sampling: top_p") and not math.isnan(code)
