"""`specpilot generate` end to end, and one clear error line per kind of bad input."""

import json
import shutil

import pytest

from specpilot.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_compare_ar_and_save(capsys, target_dir, drafter_dir, tmp_path):
    out_file = tmp_path / "out.jsonl"
    code, out, err = run(capsys, "generate", "--target", str(target_dir), "--drafter", str(drafter_dir),
                         "--prompt", "def add(a, b):", "--prompt", "Question: 2+2?", "--max-new-tokens", "24",
                         "--depth", "3", "--topk", "2", "--tree-budget", "5", "--compare-ar", "--save-jsonl", str(out_file))
    assert code == 0, err
    assert out.startswith("def add(a, b):")
    assert "identical to AR" in err and "mean accepted length" in err
    lines = [json.loads(x) for x in out_file.read_text().splitlines()]
    assert len(lines) == 2 and all(len(x["output_ids"]) == 24 for x in lines)
    code, _, err = run(capsys, "generate", "--target", str(target_dir), "--prompt", "x", "--save-jsonl", str(out_file))
    assert code == 2 and "already exists" in err  # nothing already written is lost


def test_generate_json_ngram(capsys, target_dir):
    code, out, _ = run(capsys, "generate", "--target", str(target_dir), "--prompt", "a b a b a b", "--max-new-tokens",
                       "16", "--json", "--compare-ar")
    report = json.loads(out)
    assert report["knobs"]["drafter"] == "ngram" and report["identical_to_ar"] and report["tokens"] == 16


def one_error_line(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if x]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_missing_target(capsys):
    code, _, err = run(capsys, "generate", "--target", "/no/such/model", "--prompt", "x")
    assert code == 2 and "is not a directory" in one_error_line(err)


def test_corrupt_checkpoint(capsys, target_dir, tmp_path):
    d = shutil.copytree(target_dir, tmp_path / "c")
    (d / "model.safetensors").write_bytes(b"\x00" * 100)
    code, _, err = run(capsys, "generate", "--target", str(d), "--prompt", "x")
    assert code == 2 and "unreadable safetensors" in one_error_line(err)


def test_unsupported_architecture(capsys, target_dir, tmp_path):
    d = shutil.copytree(target_dir, tmp_path / "c")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    cfg["model_type"] = "mamba"
    (d / "config.json").write_text(json.dumps(cfg))
    code, _, err = run(capsys, "generate", "--target", str(d), "--prompt", "x")
    assert code == 2 and "unsupported architecture 'MambaForCausalLM'" in one_error_line(err)


def test_drafter_tokenizer_mismatch(capsys, target_dir, drafter_dir, tmp_path):
    d = shutil.copytree(drafter_dir, tmp_path / "d")
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (d / "tokenizer.json").write_text(json.dumps(tok))
    code, _, err = run(capsys, "generate", "--target", str(target_dir), "--drafter", str(d), "--prompt", "x")
    assert code == 2 and "differs from the target's" in one_error_line(err)


def test_prompt_longer_than_context(capsys, target_dir):
    code, _, err = run(capsys, "generate", "--target", str(target_dir), "--prompt", "word " * 3000, "--max-new-tokens", "8")
    assert code == 2 and "exceeds the model's context" in one_error_line(err)


@pytest.mark.parametrize("flag,value,message", [
    ("--tree-budget", "0", "tree_budget must be >= 1"),
    ("--depth", "0", "depth must be >= 1"),
    ("--max-new-tokens", "0", "--max-new-tokens must be >= 1"),
    ("--fault", "logit-bias:2", "unknown fault"),
])
def test_impossible_settings(capsys, target_dir, flag, value, message):
    code, _, err = run(capsys, "generate", "--target", str(target_dir), "--prompt", "x", flag, value)
    assert code == 2 and message in one_error_line(err)


@pytest.mark.parametrize("flag, value, knob", [("--attention", "split_kv", "attention = 'split_kv'"),
                                               ("--draft-kernel", "triton", "draft_kernel = 'triton'")])
def test_triton_kernels_on_a_cpu_without_the_interpreter_are_one_error_line(capsys, target_dir, drafter_dir,
                                                                            monkeypatch, flag, value, knob):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code, _, err = run(capsys, "generate", "--target", str(target_dir), "--drafter", str(drafter_dir), "--prompt",
                       "x", "--device", "cpu", flag, value)
    assert code == 2 and f"{knob} needs a CUDA device" in one_error_line(err)
