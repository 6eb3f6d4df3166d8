"""The worker-side runners serve a block of prompts as the deployment's regime says."""

from types import SimpleNamespace

import pytest

from specpilot.config import shipped_deployments_dir
from specpilot.engine.runner import SessionRunner
from specpilot.errors import ConfigError


def deployment(tmp_path, regime: str) -> str:
    text = (shipped_deployments_dir() / "fixture.toml").read_text().replace("[regime]\nbatch = 1\n", regime)
    assert text.count("[regime]") == 1
    path = tmp_path / "d.toml"
    path.write_text(text)
    return str(path)


PROMPTS = [[5, 9, 11, 3], [7] * 20, [2], [100, 200, 300, 400, 500, 600], [42] * 9, [8, 8, 9, 9, 10]]


def test_continuous_regime_serves_the_block_with_the_static_outputs(tmp_path):
    (tmp_path / "static").mkdir()
    static_spec = SimpleNamespace(deployment=deployment(tmp_path / "static", "[regime]\nbatch = 2\n"), system={},
                                  device="cpu")
    static = SessionRunner(static_spec)
    spec = SimpleNamespace(deployment=deployment(tmp_path, "[regime]\nbatch = 2\ncontinuous = true\n"), device="cpu",
                           system={"segment_tokens": 6})
    served = SessionRunner(spec)
    assert served.session.deployment.regime.continuous
    static_out = static.run({}, PROMPTS, 12)
    expected = static_out["outputs"]
    out = served.run({"segment_tokens": 6}, PROMPTS, 12)
    assert out["outputs"] == expected
    timing = out["timing"]
    assert timing["gpu_s"] is None and timing["decode_s"] == timing["wall_s"] > 0
    assert timing["tokens"] == sum(len(o) for o in expected)
    # six prompts in two slots: prompts waited while every slot was taken
    assert timing["saturated_s"] > 0 and 0 < timing["saturated_tokens"] < timing["tokens"]
    assert served.run({}, PROMPTS[:2], 12)["timing"]["saturated_tokens"] == 0  # never a wait
    static_timing = static_out["timing"]
    assert static_timing["saturated_s"] is None and static_timing["saturated_tokens"] is None


def test_continuous_must_be_a_boolean(tmp_path):
    from specpilot.config import load_deployment

    with pytest.raises(ConfigError):
        load_deployment(deployment(tmp_path, "[regime]\nbatch = 2\ncontinuous = 1\n"))
