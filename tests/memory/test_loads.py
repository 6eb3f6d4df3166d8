"""Loads in the memory: the v3 migration keeps old databases readable, noise floors and evaluations
carry the load they were measured under, and a stored noise floor is reused only under a
comparable load (injected readings: nothing here depends on how busy this machine is)."""

import json
import sqlite3

from memory_fixtures import CONFIG, evaluation, fingerprint, noise_floor, spec
from specpilot.control.load import FixedProbe, Load
from specpilot.control.rule import Outcome
from specpilot.control.timing_lock import TimingLock
from specpilot.memory import evaluate as memory_evaluate
from specpilot.memory import schema
from specpilot.memory.store import Memory


def load(share=0.05, contended=False, runs=0) -> Load:
    return Load("cpu", 30.0, share, 1.5, 8, runs, contended)


def test_a_version_2_database_is_migrated_and_its_rows_read_with_unknown_load(tmp_path):
    path = tmp_path / "v2.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    assert schema.migrate(conn, upto=2) == 2  # a database as SpecPilot wrote it before loads, with rows
    conn.execute("INSERT INTO deployments VALUES ('f', 'old', '{}', 'then')")
    conn.execute("INSERT INTO systems VALUES ('s', 'old-s', '{}', NULL, NULL, NULL, '{}', 'then')")
    conn.execute("INSERT INTO noise_floors (deployment, procedure, noise, gain, gain_lower, gain_upper, blocks, "
                 "detail, created_at) VALUES ('f', ?, 0.01, 0, -0.01, 0.01, 6, ?, 'then')",
                 (noise_floor().procedure, json.dumps(noise_floor().to_dict())))
    conn.execute("INSERT INTO evaluations (deployment, candidate, incumbent, round, stage, verdict, reasons, gain, "
                 "blocks, guard, detail, created_at) VALUES ('f', 's', 's', 'r', 'single', 'promote', "
                 "'[\"clears-threshold\"]', 0.05, 6, '{}', '{}', 'then')")
    conn.close()
    with Memory(path) as m:
        assert m.schema_version == schema.SCHEMA_VERSION == 3
        old = m.get(1)
        assert old.load is None and not old.contended and old.verdict is Outcome.PROMOTE
        (floor,) = m.noise_floors("f", noise_floor().procedure)
        assert floor.load is None and floor.noise == noise_floor()
        assert m.best_validated("f").record.id == 1  # an old promotion of unknown load still counts
        exported = m.export()
        assert exported["evaluations"][0]["load"] is None and exported["noise_floors"][0]["load"] is None


def test_noise_floors_and_evaluations_carry_their_load(tmp_path):
    fp = fingerprint()
    with Memory(tmp_path / "m.sqlite") as m:
        quiet, busy = load(0.02), load(0.40, contended=True, runs=1)
        first = m.record_noise(fp, noise_floor(), quiet)
        second = m.record_noise(fp, noise_floor(0.01), busy)
        assert [(s.id, s.load) for s in m.noise_floors(fp.digest, noise_floor().procedure)] == \
               [(second, busy), (first, quiet)]
        e = m.record_evaluation(fp, evaluation(spec("a", depth=6)), CONFIG, load=busy)
        assert m.get(e).load == busy and m.get(e).contended and m.get(e).to_dict()["load"] == busy.to_dict()
        assert m.export()["evaluations"][0]["load"]["contended"] is True
        untagged = m.record_evaluation(fp, evaluation(spec("b", depth=7)), CONFIG)
        m.tag_load([e, untagged], quiet)  # fills only what has no load yet
        assert m.get(untagged).load == quiet and m.get(e).load == busy


def test_promotions_timed_under_contention_are_not_validated(tmp_path):
    fp = fingerprint()
    with Memory(tmp_path / "m.sqlite") as m:
        honest = m.record_evaluation(fp, evaluation(spec("a", depth=6), gain=0.05), CONFIG, load=load())
        m.record_evaluation(fp, evaluation(spec("b", depth=7), gain=0.50), CONFIG, load=load(contended=True, runs=1))
        assert m.best_validated(fp.digest).record.id == honest
        assert [r.id for _, r in m.similar_validated(fingerprint(gpu="other"))] == [honest]


def test_the_stored_noise_floor_is_reused_only_under_a_comparable_load(tmp_path):
    fp, procedure = fingerprint(), noise_floor().procedure
    with Memory(tmp_path / "m.sqlite") as m:
        assert memory_evaluate.reusable_noise(m, fp, procedure, load())[0] is None
        untagged = m.record_noise(fp, noise_floor())
        hit, why = memory_evaluate.reusable_noise(m, fp, procedure, load())
        assert hit is None and f"noise floor {untagged}" in why and "no load record" in why
        quiet = m.record_noise(fp, noise_floor(), load(0.05))
        hit, why = memory_evaluate.reusable_noise(m, fp, procedure, load(0.10))
        assert hit.id == quiet and why.startswith("from the memory")
        busy = m.record_noise(fp, noise_floor(), load(0.60))
        # the newest is busy, the machine is quiet again: the older quiet one is taken
        assert memory_evaluate.reusable_noise(m, fp, procedure, load(0.0))[0].id == quiet
        assert memory_evaluate.reusable_noise(m, fp, procedure, load(0.55))[0].id == busy
        hit, why = memory_evaluate.reusable_noise(m, fp, procedure, load(0.30))
        assert hit is None and "60% of the CPU then and 30% now" in why
        hit, why = memory_evaluate.reusable_noise(m, fp, procedure, load(0.05, contended=True, runs=1))
        assert hit is None and "another timing run is active now" in why
        m.record_noise(fp, noise_floor(), load(0.05, contended=True, runs=1))
        assert memory_evaluate.reusable_noise(m, fp, procedure, load(0.05))[0].id == quiet


class FakeController:
    """What `memory.evaluate.noise_floor` needs of a controller: a procedure and a noise measurement."""

    procedure = noise_floor().procedure

    def __init__(self):
        self.measured = 0

    def measure_noise(self, stock):
        self.measured += 1
        return noise_floor(0.001 * self.measured)


def test_noise_floor_is_measured_again_when_the_load_changes(tmp_path):
    fp, probe, controller = fingerprint(), FixedProbe(share=0.05), FakeController()
    with Memory(tmp_path / "m.sqlite") as m, \
            TimingLock(["cpu"], m.path, home=tmp_path / "home", probe=probe, say=lambda line: None) as lock:
        first, _, measured, why = memory_evaluate.noise_floor(controller, m, fp, spec("stock"), lock=lock)
        assert measured and "none stored" in why and m.noise_floors(fp.digest, controller.procedure)[0].load.\
            other_cpu_share == 0.05
        again, _, measured, why = memory_evaluate.noise_floor(controller, m, fp, spec("stock"), lock=lock)
        assert (again, measured) == (first, False) and why.startswith("from the memory")
        probe.share = 0.5  # somebody else started compiling
        busy, _, measured, why = memory_evaluate.noise_floor(controller, m, fp, spec("stock"), lock=lock)
        assert measured and busy != first and "5% of the CPU then and 50% now" in why
        probe.share = 0.08
        back, _, measured, _ = memory_evaluate.noise_floor(controller, m, fp, spec("stock"), lock=lock)
        assert (back, measured) == (first, False) and controller.measured == 2
        _, _, measured, why = memory_evaluate.noise_floor(controller, m, fp, spec("stock"), remeasure=True, lock=lock)
        assert measured and "asked to measure it again" in why


def test_a_contended_run_measures_its_own_noise_floor_and_marks_it(tmp_path):
    fp, controller = fingerprint(), FakeController()
    with Memory(tmp_path / "m.sqlite") as m:
        m.record_noise(fp, noise_floor(), load(0.0))
        with TimingLock(["cpu"], m.path, home=tmp_path / "home", probe=FixedProbe(), say=lambda line: None):
            second = TimingLock(["cpu"], m.path, home=tmp_path / "home", probe=FixedProbe(), wait_s=0,
                                say=lambda line: None)
            assert second.acquire() is False
            noise_id, _, measured, why = memory_evaluate.noise_floor(controller, m, fp, spec("stock"), lock=second)
            second.release()
        assert measured and "another timing run is active now" in why
        assert m.noise_floors(fp.digest, controller.procedure)[0].load.contended
