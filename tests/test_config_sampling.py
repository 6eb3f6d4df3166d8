"""A deployment regime's sampling settings: validated with one line, read and written as TOML, and
left out of every fingerprint while greedy (so greedy deployments keep the fingerprints they had)."""

from dataclasses import replace

import pytest

from specpilot.config import Deployment, Regime, Sampling, load_deployment, shipped_deployments_dir
from specpilot.engine.runner import sampling_params
from specpilot.errors import ConfigError
from specpilot.memory.fingerprint import fingerprint_deployment


def write(tmp_path, regime: str):
    text = (shipped_deployments_dir() / "fixture.toml").read_text().replace("[regime]\nbatch = 1\n", regime)
    assert text.count("[regime]") == 1
    path = tmp_path / "d.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("line, message", [
    ("temperature = -0.5", "regime temperature must be a finite number >= 0, 0 = greedy (got -0.5)"),
    ("temperature = nan", "regime temperature must be a finite number >= 0"),
    ('temperature = "hot"', "regime temperature must be a finite number >= 0, 0 = greedy (got 'hot')"),
    ("top_k = -1", "regime top_k must be an integer >= 0, 0 = off (got -1)"),
    ("top_k = 2.5", "regime top_k must be an integer >= 0, 0 = off (got 2.5)"),
    ("top_p = 0", "regime top_p must be in (0, 1], 1 = off (got 0)"),
    ("top_p = 1.5", "regime top_p must be in (0, 1], 1 = off (got 1.5)"),
    ("min_p = 2", "regime min_p must be in [0, 1], 0 = off (got 2)"),
    ("temprature = 0.7", "unknown regime field(s) temprature"),
])
def test_a_bad_sampling_value_is_one_error_line(tmp_path, line, message):
    path = write(tmp_path, f"[regime]\nbatch = 1\n{line}\n")
    with pytest.raises(ConfigError) as err:
        load_deployment(str(path))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_regime_sampling_defaults_to_greedy_and_reads_what_is_set(tmp_path):
    assert Regime().sampling == Sampling() and not Regime().sampled and sampling_params(Sampling(), 5) is None
    dep = load_deployment(str(write(tmp_path, "[regime]\nbatch = 2\ntemperature = 1\ntop_k = 40\nmin_p = 0.05\n")))
    assert dep.regime.sampled and dep.regime.sampling == Sampling(1, 40, 1.0, 0.05)
    params = sampling_params(dep.regime.sampling, seed=9)
    assert (params.temperature, params.top_k, params.top_p, params.min_p, params.seed) == (1.0, 40, 1.0, 0.05, 9)
    assert dep.regime.sampling.describe() == "sampled: temperature 1, top-k 40, min-p 0.05"


@pytest.mark.parametrize("name", ["fixture", "fixture-sampled", "fixture-x16-eagle3-sampled", "fixture-x16-batch"])
def test_a_deployment_reads_back_from_its_toml(tmp_path, name):
    dep = load_deployment(name)
    path = tmp_path / f"{name}.toml"
    path.write_text(dep.to_toml())
    again = Deployment.from_toml(path)
    assert replace(again, source="") == replace(dep, source="")


def test_the_shipped_sampled_deployments_sample_as_their_greedy_twins_would_decode():
    sampled, greedy = load_deployment("fixture-x16-eagle3-sampled"), load_deployment("fixture-x16-eagle3")
    assert sampled.regime.sampling == Sampling(temperature=0.7, top_p=0.95)
    assert replace(sampled, name=greedy.name, regime=greedy.regime, source="") == replace(greedy, source="")
    small = load_deployment("fixture-sampled")
    assert small.regime.sampling == Sampling(temperature=0.7, top_p=0.95) and small.target_expand == 1


def test_fingerprints_hold_sampling_only_when_it_is_set():
    greedy, sampled = load_deployment("fixture"), load_deployment("fixture-sampled")
    # a greedy deployment's fields are what they were before the regime had sampling knobs
    assert greedy.fingerprint_fields()["regime"] == {"batch": 1, "continuous": False}
    assert sampled.fingerprint_fields()["regime"] == {"batch": 1, "continuous": False, "temperature": 0.7,
                                                      "top_p": 0.95}
    fp_greedy = fingerprint_deployment(greedy, "cpu", versions={"torch": "x"})
    fp_sampled = fingerprint_deployment(sampled, "cpu", versions={"torch": "x"})
    assert fp_greedy.regime == {"batch": 1}  # the memory's digest of a greedy deployment is unchanged
    assert fp_sampled.regime == {"batch": 1, "temperature": 0.7, "top_p": 0.95}
    assert fp_greedy.digest != fp_sampled.digest
    assert "temperature None vs 0.7" in fp_greedy.differences(fp_sampled)
