"""scripts/results_index.py: the rows of results/README.md, README.md's results block, and --check."""

import json

import pytest


@pytest.fixture(scope="module")
def index(bench_script):
    return bench_script("results_index")


def write_json(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def interval(estimate, low, high):
    return {"estimate": estimate, "low": low, "high": high, "level": 0.95, "method": "studentized"}


@pytest.fixture
def tree(tmp_path):
    """A small results/ folder in the shapes the scripts write, and a README with the markers."""
    res = tmp_path / "results"
    write_json(res / "speed" / "fixture" / "results.json", {
        "created": "2026-11-29T13:21:25Z", "environment": {"git_commit": "1a0a580", "device": "cuda:0", "gpu": "NVIDIA H200"},
        "deployment": {"name": "fixture"}, "config": {"level": 0.95},
        "systems": [{"name": "stock", "geomean_speedup": interval(0.88, 0.77, 0.99)},
                    {"name": "tree", "geomean_speedup": interval(1.5, 1.25, 1.75)}]})
    (res / "speed" / "fixture" / "speedup.png").write_bytes(b"png")
    write_json(res / "w12" / "w12_kernels_shipped_4.json", {
        "meta": {"date": "2026-12-02T04:55:59+00:00", "gpu": "NVIDIA H200", "git_commit": "bd33466"},
        "timings": [{"M": 1, "speedup_vs_cublas": {"w12": 1.3}}, {"M": 1, "speedup_vs_cublas": {"w12": 1.2}},
                    {"M": 32, "speedup_vs_cublas": {"w12": 1.2}}, {"M": 32, "speedup_vs_cublas": {}}]})
    (res / "w12" / "w12_kernels_shipped_4.md").write_text("table\n")
    write_json(res / "controller" / "controller_noise_one_gpu_both.json", {
        "date": "2026-11-29T14:48:51+00:00", "commit": "e5c9d4cf545d2d640e8cb85a3673aaabf0761d14+dirty",
        "gpus": ["NVIDIA H200"],
        "modes": [{"variant": "default", "placement": "alternate", "devices": ["cuda:0"], "noise": {"value": 0.03886}},
                  {"variant": "gc", "placement": "alternate", "devices": ["cuda:0"], "noise": {"value": 0.1075}}]})
    write_json(res / "controller" / "timing_probe.json", {
        "date": "2026-12-02T16:28:01+00:00", "commit": "a5d9411", "device": "NVIDIA H200", "deployment": "fixture-x16",
        "controller": {"noise": {"value": 0.00258, "blocks": 12, "block_std": 0.00331},
                       "candidates": [{"wall_s": 19.3}, {"wall_s": 21.6}, {"wall_s": 15.8}],
                       "candidate_wall_s_median": 19.3}})
    (res / "notes.txt").write_text("not a benchmark\n")
    readme = tmp_path / "README.md"
    readme.write_text("# Project\n\nabove\n\n<!-- results:begin -->\nold table\n<!-- results:end -->\n\nbelow\n")
    return res, readme


def test_rows_name_each_result_its_script_and_the_provenance_inside_it(index, tree):
    res, readme = tree
    assert index.main(["--results", str(res), "--readme", str(readme)]) == 0
    rows = [line for line in (res / "README.md").read_text().splitlines() if line.startswith("| `")]
    assert rows == [
        "| `controller/controller_noise_one_gpu_both.json` | noise, isolated workers "
        "| `controller_noise.py` | 2026-11-29 | e5c9d4c+dirty | NVIDIA H200 |",
        "| `controller/timing_probe.json` | timing probe; noise floor and candidate cost | `timing_probe.py` "
        "| 2026-12-02 | a5d9411 | NVIDIA H200 |",
        "| `notes.txt` | - | `-` | - | - | - |",
        "| `speed/fixture/` | speedup over AR | `headline.py (then speed_fixture.py)` | 2026-11-29 | 1a0a580 "
        "| NVIDIA H200 |",
        "| `w12/w12_kernels_shipped_4.{json,md}` | W12 GEMM vs cuBLAS, shipped configs | `w12_kernels.py --shipped` "
        "| 2026-12-02 | bd33466 | NVIDIA H200 |",
    ]
    text = (res / "README.md").read_text()
    assert all(len(line) < 160 for line in text.splitlines())


def test_the_readme_block_is_replaced_with_numbers_read_from_the_files(index, tree):
    res, readme = tree
    index.main(["--results", str(res), "--readme", str(readme)])
    text = readme.read_text()
    before, block = text.split("<!-- results:begin -->\n")
    block, after = block.split("<!-- results:end -->")
    assert before == "# Project\n\nabove\n\n" and after == "\n\nbelow\n"
    assert block.splitlines() == [
        "| result | measured | file |",
        "|---|---|---|",
        "| `fixture` speedup over AR (geomean, 95% CI) | stock 0.88x [0.77, 0.99], tree 1.50x [1.25, 1.75] "
        "| `results/speed/fixture/results.json` |",
        "| W12 GEMM over cuBLAS, projections meeting the target | M=1 >= 1.25x: 1 of 2; M=32 >= 1.15x: 1 of 1 "
        "| `results/w12/w12_kernels_shipped_4.json` |",
        "| controller noise, stock vs stock, default procedure (`fixture-x16`, shared worker) "
        "| 0.258% over 12 blocks (per-block spread 0.331%) | `results/controller/timing_probe.json` |",
        "| knob candidate cost, guard included (median) | 19.3 s over 3 candidates | `results/controller/timing_probe.json` |",
        "| controller noise, isolated workers (code patches), 1 GPU | default 3.89%, gc 10.75% "
        "| `results/controller/controller_noise_one_gpu_both.json` |",
    ]


def test_check_fails_when_a_result_changes_and_passes_after_a_rewrite(index, tree, capsys):
    res, readme = tree
    args = ["--results", str(res), "--readme", str(readme)]
    assert index.main(args + ["--check"]) == 1  # never written
    index.main(args)
    assert index.main(args + ["--check"]) == 0
    data = json.loads((res / "speed" / "fixture" / "results.json").read_text())
    data["systems"][0]["geomean_speedup"]["estimate"] = 0.9
    (res / "speed" / "fixture" / "results.json").write_text(json.dumps(data))
    assert index.main(args + ["--check"]) == 1
    assert "README.md is stale" in capsys.readouterr().err
    (res / "w12" / "more.json").write_text("{}")
    index.main(args)
    assert index.main(args + ["--check"]) == 0


def test_without_markers_the_readme_is_left_alone_and_check_fails(index, tree, capsys):
    res, readme = tree
    readme.write_text("# Project\n\nno table here\n")
    assert index.main(["--results", str(res), "--readme", str(readme)]) == 0
    assert readme.read_text() == "# Project\n\nno table here\n"
    assert "no <!-- results:begin -->" in capsys.readouterr().err
    assert (res / "README.md").is_file()
    assert index.main(["--results", str(res), "--readme", str(readme), "--check"]) == 1


def test_the_committed_index_and_readme_table_are_up_to_date(index, capsys):
    assert index.main(["--check"]) == 0, capsys.readouterr().err


def test_a_provenance_block_inside_meta_and_a_system_timed_against_another_system(index, tmp_path):
    res = tmp_path / "results"
    write_json(res / "w12" / "paths" / "w12_paths.json", {"meta": {"gpu": "NVIDIA H200",
                                                                   "provenance": {"git_commit": "b0f18c4aa"}}})
    write_json(res / "w12" / "tree128" / "results.json", {
        "created": "2026-12-04T16:39:14Z", "environment": {"git_commit": "b0f18c4", "gpu": "NVIDIA H200"},
        "deployment": {"name": "fixture-x16"}, "config": {"level": 0.95},
        "systems": [{"name": "tree", "baseline": None, "geomean_speedup": interval(2.3, 2.1, 2.5)},
                    {"name": "tree-w12", "baseline": "tree", "geomean_speedup": interval(2.26, 2.09, 2.44),
                     "geomean_gain": interval(0.98, 0.958, 0.997)}]})
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results:begin -->\n<!-- results:end -->\n")
    assert index.main(["--results", str(res), "--readme", str(readme)]) == 0
    assert "| `w12/paths/w12_paths.json` | W12's fastest path per shape beside cuBLAS BF16, the 128-node tree's " \
           "shapes, installed | `w12_paths.py --system scripts/systems/tree-d7k8n128.toml --rows 1 129 --budget-s 40 " \
           "--install` | - | b0f18c4 | NVIDIA H200 |" in (res / "README.md").read_text()
    assert "| `fixture-x16` tree-w12 over tree (geomean, 95% CI) | 0.98x [0.96, 1.00] " \
           "| `results/w12/tree128/results.json` |" in readme.read_text()
