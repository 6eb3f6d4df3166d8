"""Memory: recording, reading back, queries (best validated, similar deployments), export."""

import json

import pytest

from memory_fixtures import CONFIG, evaluation, fingerprint, noise_floor, spec
from specpilot.control.rule import Reason, Outcome
from specpilot.errors import SpecPilotError
from specpilot.memory.records import knob_diff, system_hash
from specpilot.memory.schema import MemoryStoreError
from specpilot.memory.store import Memory


@pytest.fixture
def memory(tmp_path):
    with Memory(tmp_path / "m.sqlite") as m:
        yield m


def test_record_and_read_back_everything(memory):
    fp = fingerprint()
    noise_id = memory.record_noise(fp, noise_floor())
    e = evaluation(spec("deeper", depth=8), gain=0.07)
    entry = memory.record_evaluation(fp, e, CONFIG, round="r1", patch="--- a\n+++ b\n", noise_id=noise_id,
                                     commit="abc123")
    r = memory.get(entry)
    assert (r.deployment, r.deployment_name, r.round, r.verdict, r.reasons) == (
        fp.digest, "fx", "r1", Outcome.PROMOTE, (Reason.CLEARS_THRESHOLD,))
    assert r.gain == pytest.approx(e.estimate.gain) and (r.gain_lower, r.gain_upper) == e.estimate.interval
    assert r.noise == pytest.approx(noise_floor().value) and r.threshold == 0.015 and r.blocks == 6
    assert r.guard_passed is True and r.guard["summary"] == {"mismatch_rate": 0.007}
    assert r.candidate.name == "deeper" and r.candidate.patch.startswith("---")
    assert r.candidate.parent == system_hash(spec("stock").system)
    assert r.candidate.diff == {"depth": [5, 8]}
    assert r.detail["commit"] == "abc123" and r.detail["config"] == CONFIG.to_dict()
    assert r.evaluation().to_dict() == e.to_dict()
    got = memory.noise_floor(fp.digest, noise_floor().procedure)
    assert got[0] == noise_id and got[1] == noise_floor()
    assert memory.noise_floor(fp.digest, "other procedure") is None
    with pytest.raises(SpecPilotError, match="no memory entry 99"):
        memory.get(99)


def test_guard_failures_are_remembered_untimed(memory):
    entry = memory.record_evaluation(fingerprint(), evaluation(spec("lossy", fault="x"), passed=False), CONFIG)
    r = memory.get(entry)
    assert r.verdict is Outcome.REJECT and r.guard_passed is False and r.gain is None and r.blocks == 0


def test_system_identity_ignores_names_and_includes_patches():
    assert system_hash({"name": "a", "depth": 6}) == system_hash({"name": "b", "depth": 6})
    assert system_hash({"depth": 6}) != system_hash({"depth": 6}, patch="diff")
    assert knob_diff({"name": "s", "depth": 5, "topk": 4}, {"name": "c", "depth": 6, "topk": 4}) == {"depth": [5, 6]}


def test_entries_filters(memory):
    a, b = fingerprint("alpha"), fingerprint("beta", gpu="NVIDIA H100")
    memory.record_evaluation(a, evaluation(spec("s1", depth=6)), CONFIG)
    memory.record_evaluation(a, evaluation(spec("s2", depth=7), gain=-0.02, verdict=Outcome.REJECT), CONFIG)
    memory.record_evaluation(b, evaluation(spec("s3", depth=8)), CONFIG)
    assert [r.candidate.name for r in memory.entries()] == ["s3", "s2", "s1"]
    assert [r.candidate.name for r in memory.entries("alpha")] == ["s2", "s1"]
    assert [r.candidate.name for r in memory.entries(b.digest[:6])] == ["s3"]
    assert [r.candidate.name for r in memory.entries(verdict=Outcome.REJECT)] == ["s2"]
    assert len(memory.entries(limit=1)) == 1


def test_best_validated_follows_the_chain_of_promotions(memory):
    fp = fingerprint()
    stock, s1, s2, s3 = spec("stock"), spec("s1", depth=6), spec("s2", depth=7), spec("s3", depth=8)
    memory.record_evaluation(fp, evaluation(s1, stock, gain=0.05), CONFIG)
    memory.record_evaluation(fp, evaluation(s2, s1, gain=0.03), CONFIG)  # on top of s1
    memory.record_evaluation(fp, evaluation(s3, stock, gain=0.06), CONFIG)  # alone: smaller than 1.05 * 1.03
    memory.record_evaluation(fp, evaluation(spec("bad", depth=9), s2, gain=0.5, passed=False), CONFIG)
    memory.record_evaluation(fingerprint(gpu="other"), evaluation(spec("elsewhere", depth=3), gain=0.9), CONFIG)
    best = memory.best_validated(fp.digest)
    assert best.record.candidate.name == "s2"
    assert best.cumulative_gain == pytest.approx((1 + best.record.gain) * (1 + memory.entries(
        verdict=Outcome.PROMOTE)[-1].gain) - 1)
    assert memory.best_validated("0" * 16) is None


def test_similar_deployments_first(memory):
    here = fingerprint("new", torch="2.14")
    same_models_other_gpu = fingerprint("h100", gpu="NVIDIA H100")
    other_models = fingerprint("other", target=(("config.json", "d" * 64), ("model.safetensors", "b" * 64)))
    assert here.similarity(here) == 1.0
    assert here.similarity(same_models_other_gpu) == pytest.approx(0.75)
    assert here.similarity(other_models) == pytest.approx(0.55)
    memory.record_evaluation(same_models_other_gpu, evaluation(spec("a", depth=6), gain=0.02), CONFIG)
    memory.record_evaluation(other_models, evaluation(spec("b", depth=7), gain=0.30), CONFIG)
    memory.record_evaluation(other_models, evaluation(spec("c", depth=8), gain=-0.1, verdict=Outcome.REJECT), CONFIG)
    memory.record_evaluation(here, evaluation(spec("d", depth=9), gain=0.1), CONFIG)  # the same deployment: excluded
    found = memory.similar_validated(here)
    assert [(round(s, 2), r.candidate.name) for s, r in found] == [(0.75, "a"), (0.55, "b")]
    assert [r.candidate.name for _, r in memory.similar_validated(here, min_similarity=0.6)] == ["a"]


def test_workload_and_versions_lower_similarity_without_blocking_it(memory):
    from dataclasses import replace

    here = fingerprint("here")
    longer = replace(here, name="longer", max_new_tokens=512)
    bumped = replace(here, name="bumped", versions={**here.versions, "specpilot": "0.1.1"})
    assert 1.0 > here.similarity(longer) > here.similarity(bumped) >= 0.9
    assert here.differences(longer) == "same target and drafter, max_new_tokens 256 vs 512"
    assert here.differences(bumped) == "same target and drafter, specpilot 0.1.0 vs 0.1.1"
    assert here.differences(fingerprint("h100", gpu="NVIDIA H100")) == \
        "same target and drafter, NVIDIA H200 vs NVIDIA H100"
    for fp in (longer, bumped):
        memory.record_noise(fp, noise_floor())
    assert [(round(s, 3), d, fp.name) for s, d, fp in memory.similar_deployments(here)] == [
        (0.975, longer.digest, "longer"), (0.95, bumped.digest, "bumped")]


def test_export_is_plain_json(memory, tmp_path):
    fp = fingerprint()
    memory.record_noise(fp, noise_floor())
    memory.record_evaluation(fp, evaluation(spec("s1", depth=6)), CONFIG)
    data = json.loads(json.dumps(memory.export()))
    assert data["schema_version"] == memory.schema_version
    assert [len(data[k]) for k in ("deployments", "systems", "noise_floors", "evaluations")] == [1, 2, 1, 1]
    assert data["evaluations"][0]["detail"]["evaluation"]["candidate"]["system"]["name"] == "s1"
    assert data["deployments"][0]["components"]["gpu"] == "NVIDIA H200"


def _without_ids(data: dict) -> dict:
    """An export less what a merge renumbers (row ids, noise ids) and the export's own time."""
    out = {}
    for table in ("deployments", "systems", "noise_floors", "evaluations"):
        out[table] = sorted(json.dumps({k: v for k, v in row.items() if k not in ("id", "noise_id")}, sort_keys=True)
                            for row in data[table])
    return out


def test_an_export_imported_elsewhere_holds_the_same_records_and_twice_adds_nothing(memory, tmp_path):
    fp = fingerprint()
    first = memory.record_noise(fp, noise_floor())
    deep = memory.record_evaluation(fp, evaluation(spec("deep", depth=8), gain=0.12), CONFIG, round="r1",
                                    noise_id=first)
    wide = spec("wide", depth=8, topk=8)
    memory.record_evaluation(fp, evaluation(wide, spec("deep", depth=8), gain=0.05), CONFIG, round="r2", noise_id=first)
    memory.record_evaluation(fp, evaluation(spec("lossy", fault="x"), passed=False), CONFIG, round="r2")
    data = json.loads(json.dumps(memory.export()))
    with Memory(tmp_path / "other.sqlite") as other:
        own = other.record_noise(fingerprint("b", gpu="NVIDIA H100"), noise_floor(0.01))  # ids there are taken already
        assert other.import_export(data) == {"deployments": 1, "systems": 4, "noise_floors": 1, "evaluations": 3,
                                             "held": 0, "kernel_tables": 0}
        merged = other.export()
        assert _without_ids(merged)["evaluations"] == _without_ids(data)["evaluations"]
        assert _without_ids(merged)["systems"] == _without_ids(data)["systems"]
        # the evaluations point at the imported noise floor, renumbered past the one already there
        (noise,) = [n for n in merged["noise_floors"] if n["deployment"] == fp.digest]
        assert noise["id"] != own and {e["noise_id"] for e in merged["evaluations"]} == {noise["id"], None}
        best = other.best_validated(fp.digest)  # the chain of promotions, as on the machine it came from
        assert best.record.candidate.name == "wide" and best.cumulative_gain == pytest.approx(
            memory.best_validated(fp.digest).cumulative_gain)
        assert other.import_export(data) == {"deployments": 0, "systems": 0, "noise_floors": 0, "evaluations": 0,
                                             "held": 1 + 4 + 1 + 3, "kernel_tables": 0}
        assert len(other.export()["evaluations"]) == 3
    with Memory(tmp_path / "fresh.sqlite") as fresh:  # ids free: kept, so a run's journal names the same entries
        fresh.import_export(data)
        assert [(e["id"], e["noise_id"]) for e in fresh.export()["evaluations"]] == [
            (e["id"], e["noise_id"]) for e in data["evaluations"]]
        assert fresh.get(deep).candidate.hash == memory.get(deep).candidate.hash


def test_an_import_that_cannot_be_stored_whole_stores_nothing(memory, tmp_path):
    fp = fingerprint()
    memory.record_evaluation(fp, evaluation(spec("deep", depth=8)), CONFIG, round="r1")
    data = json.loads(json.dumps(memory.export()))
    broken = {**data, "systems": data["systems"][:1]}  # an evaluation names a system the export lacks
    with Memory(tmp_path / "other.sqlite") as other:
        with pytest.raises(MemoryStoreError, match=r"evaluations\[0\] cannot be stored"):
            other.import_export(broken)
        assert other.export()["evaluations"] == other.export()["systems"] == other.export()["deployments"] == []
        with pytest.raises(MemoryStoreError, match="newer than this SpecPilot"):
            other.import_export({**data, "schema_version": data["schema_version"] + 1})
        with pytest.raises(MemoryStoreError, match="not a memory export"):
            other.import_export({"evaluations": []})


def test_the_kernel_tables_systems_name_travel_with_an_export(memory, tmp_path, monkeypatch):
    """A candidate's tuned table is a file of the machine that tuned it: the export carries it, the
    import writes it at the same place under the other machine's home, where the knob finds it
    (by id, or by the first home's path), and an import of a broken one stores nothing."""
    from specpilot.kernels import user_cache

    home_a, home_b = tmp_path / "a", tmp_path / "b"
    monkeypatch.setenv("SPECPILOT_HOME", str(home_a))
    document = {"device": "NVIDIA H200", "entries": [], "versions": user_cache.versions()}
    by_path = user_cache.write_document(user_cache.candidate_path("nvidia_h200", "dense-1"), document)
    user_cache.write_document(user_cache.candidate_path("nvidia_h200", "dense-2"), document)
    fp = fingerprint()
    memory.record_evaluation(fp, evaluation(spec("p", kernel="triton", kernel_table=str(by_path))), CONFIG, round="r1")
    memory.record_evaluation(fp, evaluation(spec("i", kernel="triton", kernel_table="dense-2")), CONFIG, round="r2")
    memory.record_evaluation(fp, evaluation(spec("gone", kernel="triton", kernel_table="dense-9")), CONFIG, round="r3")
    data = json.loads(json.dumps(memory.export()))
    assert sorted(t["table"] for t in data["kernel_tables"]) == sorted([str(by_path), "dense-2"])  # dense-9: no file

    monkeypatch.setenv("SPECPILOT_HOME", str(home_b))  # the other machine, which has no home_a
    __import__("shutil").rmtree(home_a)
    assert user_cache.resolve(str(by_path), "nvidia_h200") == by_path  # nothing here yet: the path as named
    with Memory(tmp_path / "other.sqlite") as other:
        broken = {**data, "kernel_tables": [{"path": "../../etc/x.json", "document": document}]}
        with pytest.raises(MemoryStoreError, match=r"kernel_tables\[0\] is not a bundled kernel table"):
            other.import_export(broken)
        assert other.export()["evaluations"] == [] and not (home_b / "kernels").exists()
        assert other.import_export(data)["kernel_tables"] == 2
        assert other.import_export(data)["kernel_tables"] == 0  # already there: kept
    moved = user_cache.resolve(str(by_path), "nvidia_h200")
    assert moved == user_cache.candidate_path("nvidia_h200", "dense-1") and str(moved).startswith(str(home_b))
    assert user_cache.read_document(moved) == document
    assert user_cache.read_document(user_cache.resolve("dense-2", "nvidia_h200")) == document
