"""`specpilot generate` sampling flags: N samples per prompt batched with seeds seed..seed+N-1,
reproducible by seed, greedy by default, and one clear error line per bad value."""

import json

import pytest

from specpilot.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def generate(capsys, target_dir, drafter_dir, *flags):
    code, out, err = run(capsys, "generate", "--target", str(target_dir), "--drafter", str(drafter_dir),
                         "--prompt", "def add(a, b):", "--prompt", "Question:", "--max-new-tokens", "12",
                         "--depth", "3", "--topk", "2", "--tree-budget", "5", "--json", *flags)
    assert code == 0, err
    return json.loads(out)


def test_samples_are_batched_rows_with_consecutive_seeds(capsys, target_dir, drafter_dir, tmp_path):
    flags = ("--temperature", "0.9", "--top-p", "0.95", "--top-k", "40", "--min-p", "0.01", "--seed", "7")
    report = generate(capsys, target_dir, drafter_dir, *flags, "--samples", "3", "--compare-ar")
    assert report["sampling"]["seeds"] == [7, 8, 9, 7, 8, 9]  # per prompt, its N samples
    assert report["sampling"]["top_k"] == 40 and report["sampling"]["min_p"] == 0.01
    texts = report["texts"]
    assert len(texts) == 6 and len(set(texts[:3])) > 1  # independent samples differ
    assert "identical_to_ar" not in report and report["speedup_vs_ar"] > 0  # sampled: equal in law only
    # the first sample of a run with --seed 8 is the second sample above, whatever its batch
    again = generate(capsys, target_dir, drafter_dir, *flags[:-1], "8", "--samples", "1")
    assert again["texts"] == [texts[1], texts[4]]
    # text output: every sample printed under its header
    code, out, err = run(capsys, "generate", "--target", str(target_dir), "--prompt", "x", "--max-new-tokens", "4",
                         "--temperature", "1", "--samples", "2", "--seed", "3")
    assert code == 0 and "[sample 1/2, seed 3]" in out and "[sample 2/2, seed 4]" in out
    assert "sampled: temperature 1" in err


def test_temperature_zero_is_greedy(capsys, target_dir, drafter_dir):
    greedy = generate(capsys, target_dir, drafter_dir, "--compare-ar")
    assert greedy["identical_to_ar"] and "sampling" not in greedy
    assert generate(capsys, target_dir, drafter_dir, "--temperature", "0", "--seed", "4")["texts"] == greedy["texts"]


@pytest.mark.parametrize("flags,message", [
    (("--temperature", "-1"), "temperature must be"),
    (("--temperature", "1", "--top-p", "0"), "top_p must be in (0, 1]"),
    (("--temperature", "1", "--top-k", "-2"), "top_k must be an integer >= 0"),
    (("--temperature", "1", "--min-p", "2"), "min_p must be in [0, 1]"),
    (("--temperature", "1", "--seed", "-5"), "seed must be an integer >= 0"),
    (("--temperature", "1", "--samples", "0"), "--samples must be >= 1"),
    (("--samples", "2",), "needs --temperature > 0"),
])
def test_bad_sampling_values_are_one_error_line(capsys, flags, message):
    code, _, err = run(capsys, "generate", "--target", "/no/such/model", "--prompt", "x", *flags)
    lines = [x for x in err.strip().splitlines() if x]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
