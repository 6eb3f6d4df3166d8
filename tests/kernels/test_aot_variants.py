"""Every kernel variant compiles for sm_90 (H100/H200) -- checked without a GPU.

The interpreter tests run the kernels' Python but never compile them; this runs
`python -m specpilot.kernels.aot --quick` in a fresh process (the `aot` fixture), which compiles
the candidate configs to cubins with Triton's bundled ptxas. A file of its own, so that a second
test worker can run the SASS checks (`test_aot_compile.py`) beside it.
"""

import pytest

pytestmark = pytest.mark.slow  # AOT compilation: minutes on two cores


def test_every_kernel_variant_compiles_for_sm90(aot):
    run = aot("--quick", needs="ptxas")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "kernel variants compiled for sm_90" in run.stdout
