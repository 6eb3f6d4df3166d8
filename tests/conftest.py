"""Shared fixtures: small random checkpoints written once per test session (CPU, float32)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from specpilot.models.random_checkpoint import tiny_config, write_random_checkpoint, write_truncated_drafter


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def interpreter(monkeypatch):
    """interpret(module, kernel): TRITON_INTERPRET=1 for this test, with `module`'s `kernel`
    interpreted; the test is skipped on a GPU machine (Triton is imported compiled there) and where
    Triton or `module` was imported compiled before the interpreter could be set."""

    def interpret(module: str, kernel: str) -> None:
        pytest.importorskip("triton")
        if torch.cuda.is_available():
            pytest.skip("the interpreter runs on CPU machines only (on a GPU Triton is imported compiled)")
        from triton.language import standard
        from triton.runtime.interpreter import InterpretedFunction

        monkeypatch.setenv("TRITON_INTERPRET", "1")
        found = getattr(importlib.import_module(module), kernel)
        if not (isinstance(standard.zeros, InterpretedFunction) and isinstance(found, InterpretedFunction)):
            pytest.skip("triton was imported compiled before TRITON_INTERPRET=1 could be set")

    return interpret


BENCH = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="session")
def bench_script():
    """load(name): `scripts/<name>.py` imported as a module (the GPU drivers are scripts, not
    package modules), freshly each call; the test is skipped in a checkout without scripts/."""

    def load(name: str):
        path = BENCH / f"{name}.py"
        if not path.is_file():
            pytest.skip(f"no {path.relative_to(BENCH.parent)} in this checkout")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses resolve their module's annotations through it
        try:
            spec.loader.exec_module(module)
        finally:
            del sys.modules[name]
        return module

    return load


@pytest.fixture(scope="module")
def full_precision():
    """float32 matmuls in float32 (no TF32) while these tests run."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    yield
    torch.backends.cuda.matmul.allow_tf32 = before[0]
    torch.set_float32_matmul_precision(before[1])


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A SpecPilot home (memory, runs, scratch, locks) of the test's own, with no coding agent."""
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECPILOT_MEMORY", raising=False)
    monkeypatch.delenv("SPECPILOT_CODING_AGENT", raising=False)
    return tmp_path / "home"


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory):
    """Every test process (each xdist worker) its own SpecPilot home: no test reads or writes the
    user's ~/.specpilot, and parallel workers never share timing locks or a memory."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECPILOT_HOME", str(tmp_path_factory.mktemp("specpilot-home")))
        yield


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """CI and dev machines have two cores; intra-op threads on these tiny models only contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpt")


@pytest.fixture(scope="session")
def target_dir(ckpt_root):
    return write_random_checkpoint(ckpt_root / "target", tiny_config(), seed=0)


@pytest.fixture(scope="session")
def drafter_dir(ckpt_root, target_dir):
    """Shares the target's first two of three blocks: accepts often, not always."""
    return write_truncated_drafter(target_dir, ckpt_root / "drafter", num_layers=2)


@pytest.fixture(scope="session")
def llama_dir(ckpt_root):
    return write_random_checkpoint(ckpt_root / "llama", tiny_config("llama", tie_word_embeddings=True), seed=1)


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(1234)


def random_prompts(n: int, seed: int = 0, lo: int = 1, hi: int = 40, vocab: int = 4096) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi, (n,), generator=g)
    return [torch.randint(1, vocab, (int(L),), generator=g).tolist() for L in lens]


def random_requests(n: int, seed: int, max_len: int, new_tokens: tuple[int, int], one_token_at: int):
    """n serving `Request`s: prompts of 2..max_len tokens (request `one_token_at` a 1-token prompt),
    token limits in new_tokens[0]..new_tokens[1]."""
    from specpilot.engine.serving import Request

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        L = 1 if i == one_token_at else int(torch.randint(2, max_len + 1, (1,), generator=g))
        out.append(Request(tuple(torch.randint(1, 4096, (L,), generator=g).tolist()),
                           max_new=int(torch.randint(new_tokens[0], new_tokens[1] + 1, (1,), generator=g))))
    return out


@pytest.fixture
def make_prompts():
    """random_prompts(n, seed=0, lo=1, hi=40): token-id prompts of random lengths."""
    return random_prompts
