"""tools/ is a folder of scripts, not a package: make its modules importable by these tests.

`smoke_run` runs `tools/train_fixture.py --smoke` once per session (fixed step counts, so the
result does not depend on the machine's speed) for the tests that need a trained fixture.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

SMOKE_ARGS = ["--smoke", "--target-steps", "30", "--drafter-steps", "20"]


def run_smoke(root: Path) -> Path:
    """Run the smoke training into root/out (packed parts + log); returns that directory."""
    env = dict(os.environ, OMP_NUM_THREADS="1")  # 2 shared cores: one thread avoids OpenMP stalls
    cmd = [sys.executable, str(TOOLS / "train_fixture.py"), *SMOKE_ARGS,
           "--out", str(root / "out"), "--work-dir", str(root / "work")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return root / "out"


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> Path:
    """The unpacked smoke fixture directory (target/, drafter/, training_log.json, ...)."""
    import fixture_pack

    root = tmp_path_factory.mktemp("smoke")
    fixture_pack.unpack(run_smoke(root), root / "fixture")
    return root / "fixture"


@pytest.fixture(scope="session")
def smoke_runner():
    """`run_smoke` itself, for tests that need a second run (determinism)."""
    return run_smoke
