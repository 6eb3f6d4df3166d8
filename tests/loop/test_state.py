"""Run directories and resuming: never overwrite a report; round numbers and the incumbent on resume."""

import pytest
from loop_fixtures import CONFIG, STOCK, evaluation, fingerprint

from specpilot.errors import ConfigError
from specpilot.loop.journal import EventKind, Journal
from specpilot.loop.state import prepare_run, promotion_chain, resume_point
from specpilot.loop.systems import Candidate
from specpilot.memory.store import Memory


def test_a_directory_holding_a_run_is_refused_unless_resumed(home, tmp_path):
    paths = prepare_run(None, "fx", resume=False)
    assert paths.out.parent == home / "runs" / "loop" and paths.out.name.endswith("-fx") and paths.scratch.is_dir()
    (paths.out / "report.md").write_text("x")
    with pytest.raises(ConfigError, match="already holds files"):
        prepare_run(paths.out, "fx", resume=False)
    with pytest.raises(ConfigError, match="holds no loop run"):
        prepare_run(paths.out, "fx", resume=True)
    Journal(paths.journal).emit(EventKind.START, "start")
    assert prepare_run(paths.out, "fx", resume=True).run_id == paths.run_id


def test_resume_numbers_rounds_from_the_journal_and_takes_the_incumbent_from_the_memory(home, tmp_path):
    paths = prepare_run(tmp_path / "run", "fx", resume=False)
    fp = fingerprint()
    wider = STOCK.with_changes(name="wider", tree_budget=12)
    deeper = wider.with_changes(name="deeper", depth=6)
    with Memory(tmp_path / "m.sqlite") as memory:
        fresh = resume_point(paths, memory, fp.digest, STOCK, None, resume=False)
        assert fresh.incumbent.is_stock and fresh.next_round == 1 and "starting from stock" in fresh.note
        memory.record_evaluation(fp, evaluation(wider, gain=0.2), CONFIG, round="run/r1")
        memory.record_evaluation(fp, evaluation(deeper, wider, gain=0.1), CONFIG, round="run/r2")
        journal = Journal(paths.journal)
        for kind, rnd in ((EventKind.MEASURE, 1), (EventKind.ROUND_END, 1), (EventKind.MEASURE, 2),
                          (EventKind.ROUND_END, 2), (EventKind.MEASURE, 3)):  # killed in round 3
            journal.emit(kind, "", rnd)
        point = resume_point(paths, memory, fp.digest, STOCK, None, resume=True)
        assert (point.next_round, point.rounds_done, len(point.previous)) == (3, 2, 5)
        inc = point.incumbent
        assert inc.name == "deeper" and inc.entry_id == 2 and inc.round == "run/r2"
        assert inc.cumulative_gain == pytest.approx(
            (1 + memory.get(1).gain) * (1 + memory.get(2).gain) - 1, rel=1e-12)
        assert inc.lineage == {Candidate(STOCK).hash, Candidate(wider).hash}
        assert [r.id for r in promotion_chain(memory, fp.digest, inc)] == [1, 2]


def test_resuming_against_a_memory_that_lacks_the_runs_entries_is_refused(home, tmp_path):
    """On a fresh machine (another $SPECPILOT_HOME) a resumed run would restart from stock under its
    old round numbers without a word: it is refused, naming the memory its journal recorded."""
    paths = prepare_run(tmp_path / "run", "fx", resume=False)
    fp = fingerprint()
    wider = STOCK.with_changes(name="wider", tree_budget=12)
    journal = Journal(paths.journal)
    journal.emit(EventKind.START, "start", memory=str(tmp_path / "old.sqlite"))
    with Memory(tmp_path / "old.sqlite") as old:
        entry = old.record_evaluation(fp, evaluation(wider, gain=0.2), CONFIG, round="run/r1")
        journal.emit(EventKind.EVALUATION, "", 1, entry_id=entry, hash=Candidate(wider).hash)
        assert resume_point(paths, old, fp.digest, STOCK, None, resume=True).incumbent.name == "wider"
    with Memory(tmp_path / "new.sqlite") as new:
        with pytest.raises(ConfigError, match=f"recorded memory entries {entry}, which .*new.sqlite does not hold; "
                                              f"they were written to .*old.sqlite: pass --memory .*old.sqlite, or import "
                                              f"its export into this one"):
            resume_point(paths, new, fp.digest, STOCK, None, resume=True)
        other = new.record_evaluation(fp, evaluation(STOCK.with_changes(name="x", depth=3), gain=0.1), CONFIG)
        assert other == entry  # the same id holding another system is no match either
        with pytest.raises(ConfigError, match="does not hold"):
            resume_point(paths, new, fp.digest, STOCK, None, resume=True)
        assert resume_point(paths, new, fp.digest, STOCK, None, resume=False).incumbent.name == "x"  # a new run: fine
    with Memory(tmp_path / "old.sqlite") as old, Memory(tmp_path / "elsewhere.sqlite") as elsewhere:
        elsewhere.import_export(old.export())  # `specpilot memory import` of the old machine's export
        assert resume_point(paths, elsewhere, fp.digest, STOCK, None, resume=True).incumbent.name == "wider"
