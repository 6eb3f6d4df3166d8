"""scripts/speed_fixture.py (the GPU driver): its plan and checks, without a GPU."""

from pathlib import Path

import pytest

from specpilot.config import load_deployment, load_system

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def driver(bench_script):
    return bench_script("speed_fixture")


@pytest.mark.parametrize("name", ["fixture", "fixture-x16"])
def test_default_plan_fits_the_fixture_deployments(driver, name):
    path = REPO / "deployments" / f"{name}.toml"
    if not path.is_file():
        pytest.skip(f"{path} not written yet")
    ((dep, systems, config),) = driver.plan(driver.parse_args(["--deployments", str(path)]))
    assert [s.name for s in systems] == ["stock", "tree-d6k8n48"]
    assert (config.n_prompts, config.max_new_tokens, len(config.sets)) == (10, driver.DEFAULT_MAX_NEW_TOKENS[name], 5)
    tree = load_system(str(REPO / "scripts" / "systems" / "tree.toml"), load_deployment(str(path)))
    assert tree.diff(dep.stock) == {"depth": [5, 6], "topk": [4, 8], "tree_budget": [7, 48]}


def test_dry_run_checks_prompts_and_refuses_taken_output(driver, tiny_deployment_toml, tmp_path, capsys):
    argv = ["--deployments", str(tiny_deployment_toml), "--n-prompts", "2", "--out", str(tmp_path), "--dry-run"]
    assert driver.main(argv) == 0
    err = capsys.readouterr().err
    assert "tiny" in err and "2 prompts x 5 sets x 6 new tokens" in err and "checks out" in err
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "results.json").write_text("{}")
    assert driver.main(argv) == 2
    assert "already exist" in capsys.readouterr().err
