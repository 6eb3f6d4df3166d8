"""`quantize_model` quantizes a loaded decoder as `specpilot fp8 convert` quantizes its directory:
the FP8 model it builds and the converted directory's load are tensor for tensor equal (one
quantizer, `quantize_tensors`), for block-wise and per-channel scales, dense and hybrid, with
projections whose rows are not whole 128-row blocks; a target stored quantized already is one line."""

from __future__ import annotations

import pytest
import torch

from specpilot.cli import main
from specpilot.errors import CheckpointError
from specpilot.models.fp8_checkpoint import quantize_model
from specpilot.models.fp8_linear import E4M3, FP8Linear
from specpilot.models.loading import load_model
from specpilot.models.random_checkpoint import (
    tiny_config,
    tiny_hybrid_config,
    write_random_checkpoint,
    write_random_hybrid,
)
from tests.models.test_fp8_linear import DIMS, logits


def assert_same_model(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Every tensor bit for bit (e4m3 codes as bytes), every FP8 projection's block and scheme equal."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        x, y = sa[name], sb[name]
        assert x.dtype == y.dtype, name
        if x.dtype == E4M3:
            x, y = x.view(torch.uint8), y.view(torch.uint8)
        assert torch.equal(x, y), name
    fa, fb = ([(n, m.block_k, m.activation) for n, m in model.named_modules() if isinstance(m, FP8Linear)]
              for model in (a, b))
    assert fa == fb and fa


@pytest.mark.parametrize("per_channel", [False, True], ids=["block", "channel"])
@pytest.mark.parametrize("family", ["dense", "hybrid"])
def test_the_loader_quantizes_as_fp8_convert_does(tmp_path, capsys, family, per_channel):
    if family == "dense":  # q 160 rows, k/v 80: fused q|k|v rows are not the parts' 128-row blocks
        src = write_random_checkpoint(tmp_path / "src", tiny_config(**DIMS))
    else:
        src = write_random_hybrid(tmp_path / "src", tiny_hybrid_config())
    argv = ["fp8", "convert", str(src), str(tmp_path / "fp8")] + (["--per-channel"] if per_channel else [])
    assert main(argv) == 0
    capsys.readouterr()
    converted = load_model(tmp_path / "fp8")
    loaded = quantize_model(load_model(src), per_channel, "cpu", torch.float32, "test")
    assert_same_model(loaded, converted)
    assert torch.equal(logits(loaded), logits(converted))


def test_a_target_stored_quantized_is_one_line(tmp_path, capsys):
    src = write_random_checkpoint(tmp_path / "src", tiny_config(**DIMS))
    assert main(["fp8", "convert", str(src), str(tmp_path / "fp8")]) == 0
    capsys.readouterr()
    with pytest.raises(CheckpointError, match="stored quantized already") as err:
        quantize_model(load_model(tmp_path / "fp8"), False, "cpu", torch.float32, "test")
    assert "\n" not in str(err.value)
