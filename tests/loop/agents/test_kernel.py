"""The kernel agent: off on CPU; on a (simulated) GPU it tunes the deployment's shapes furthest from
their floor, and proposes its table as a knob-level candidate (no git checkout), promoted into the user cache."""

import json
from types import SimpleNamespace

import pytest

from loop_fixtures import context

from specpilot.kernels import configs as kc
from specpilot.kernels import user_cache
from specpilot.kernels.configs import Fallback, WeightFormat
from specpilot.engine.round_shapes import projection_shapes
from specpilot.kernels.search import Trial
from specpilot.kernels.shape_tuning import tune
from specpilot.loop.agents.base import AgentOptions, LoopSetup
from specpilot.loop.agents.kernel import KernelAgent, promote_table
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.models.random_checkpoint import tiny_config
from tests.kernels.simulated_bench import FAST, SLOW, SimulatedBench, W12Bench


def test_off_on_cpu_and_says_why(tmp_path):
    status = KernelAgent().status(LoopSetup(context().deployment, "cpu", "cpu-x86_64", None, tmp_path))
    assert not status.enabled and "cpu" in status.reason


class TransientBench(SimulatedBench):
    """Every candidate is as fast as today's config, but today's first timing of each shape is 10x slow."""

    def time(self, problem, config):
        first = all(nk != (problem.n, problem.k) for nk, _ in self.timed)
        self.timed.append(((problem.n, problem.k), config))
        return Trial(config, us=(3 * problem.n * problem.k * 2 / 4e6 + 200.0) * (10 if first else 1))


def test_a_slow_first_timing_of_todays_config_is_not_a_gain(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    config = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=4)
    timings = tune(projection_shapes(config, rows=8, lm_head=False), TransientBench(), budget_s=60)
    assert not any(t.improved for t in timings)
    assert all(t.current_us == t.best_us for t in timings)
    models = SimpleNamespace(target=SimpleNamespace(config=config))
    ctx = context(scratch=tmp_path / "scratch", models=models)
    assert KernelAgent(AgentOptions(kernel_budget_s=60)).propose_with(ctx, TransientBench()) == []
    assert not user_cache.candidate_path("nvidia_h200", "x").parent.exists()  # no table written


class CountingBench(SimulatedBench):
    """SimulatedBench counting the timings of its search configs and fallbacks; today's choice can change."""

    def __init__(self, today=SLOW, **kw):
        super().__init__(**kw)
        self.today, self.fallbacks = today, 0

    def current(self, shape):
        return self.today

    def time_fallback(self, problem, fallback):
        self.fallbacks += 1
        return super().time_fallback(problem, fallback)

    def time(self, problem, config):
        trial = super().time(problem, config)  # FAST is also 1% faster elsewhere: a best, not a gain
        return Trial(config, us=trial.us * 0.99) if config == FAST and trial.us and not trial.error else trial


def test_shapes_searched_in_full_without_a_gain_are_not_searched_again_while_they_run_that_choice(
        tmp_path, monkeypatch):
    """Every round searched every shape again (about 24 s a round at concurrency 8 on the H200, for
    nothing found): a shape searched in full that nothing beat is recorded per GPU and versions, and
    skipped while it runs the same choice; one that improved, or ran out of budget, is searched again."""
    from dataclasses import replace

    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    config = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=4)
    models = SimpleNamespace(target=SimpleNamespace(config=config))
    agent = KernelAgent(AgentOptions(kernel_budget_s=60))
    lines = []
    ctx = context(scratch=tmp_path / "scratch", models=models, log=lines.append)
    first = CountingBench()
    (p,) = agent.propose_with(ctx, first)  # 'down' at 8 rows improves with FAST
    timings = {(t["shape"]["name"], t["shape"]["m"]): t for t in p.details["timings"]}
    assert all(t["complete"] for t in timings.values()) and len(first.timed) > len(timings)
    searched = json.loads(user_cache.searched_path("nvidia_h200").read_text())
    recorded = {(e["m"], e["n"], e["k"]) for e in searched["entries"]}
    keys = {(kc.m_bucket(t["shape"]["m"]), t["shape"]["n"], t["shape"]["k"]) for t in timings.values()}
    assert recorded == keys - {(8, 256, 1024)}  # all but the improved 'down' at 8 rows
    again = CountingBench()
    (q,) = agent.propose_with(replace(ctx, round_label="test/r2"), again)  # only the improved shape is searched again
    assert {(t["shape"]["name"], t["shape"]["m"]) for t in q.details["timings"]} == {("down", 8)}
    assert {nk for nk, _ in again.timed} == {(256, 1024)}
    assert any(line.startswith(f"kernel: {len(timings) - 1} of {len(timings)} shape(s) searched in full before")
               for line in lines)
    # a cuBLAS incumbent's table: the skipped shapes keep their recorded best, so the table is the
    # first one, the same candidate (judged once: the memory knows its hash)
    assert q.candidate.system.kernel_table == p.candidate.system.kernel_table and q.hash == p.hash
    table = user_cache.resolve(p.candidate.system.kernel_table, "nvidia_h200")
    assert any(e.get("config") == FAST.to_dict() and (e["m"], e["n"], e["k"]) != (8, 256, 1024)
               for e in json.loads(table.read_text())["entries"])  # a best that was no gain, kept
    other = CountingBench(today=FAST)  # another choice today (a promoted table): searched again
    agent.propose_with(ctx, other)
    assert len({nk for nk, _ in other.timed}) == len({(t["shape"]["n"], t["shape"]["k"]) for t in timings.values()})
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "fresh"))
    assert KernelAgent(AgentOptions(kernel_budget_s=0)).propose_with(ctx, CountingBench()) == []
    assert not user_cache.searched_path("nvidia_h200").exists()  # no budget: nothing searched in full, none recorded


def test_on_a_gpu_it_is_on_without_a_git_checkout(tmp_path):
    pytest.importorskip("triton")
    status = KernelAgent().status(LoopSetup(context().deployment, "cuda", "NVIDIA H200", None, tmp_path))
    assert status.enabled and str(tmp_path) not in status.reason


def test_the_tuned_table_is_a_knob_level_candidate_promoted_into_the_user_cache(tmp_path, monkeypatch):
    """No git checkout: the table goes to a candidate file of the user cache, the candidate is the
    incumbent with kernel = triton and kernel_table = that file's id; decode then cuBLAS enters the
    table where it is faster (here on the drafter's down projection, so the draft model turns to
    the kernels too: draft_kernel = triton); promoting merges the file."""
    from specpilot.kernels import configs

    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(configs, "RECHECK_S", 0.0)  # the promotion below is seen at once
    configs.tuned_table.cache_clear()
    target = tiny_config(hidden_size=256, intermediate_size=1024)
    drafter = tiny_config(hidden_size=128, intermediate_size=512, num_layers=1)
    models = SimpleNamespace(target=SimpleNamespace(config=target), drafter_model=SimpleNamespace(config=drafter))
    ctx = context(checkout=None, scratch=tmp_path / "scratch", models=models)
    bench = SimulatedBench(unpack_fast={(128, 512)})  # the drafter's down: [C=128, I=512]
    (p,) = KernelAgent(AgentOptions(kernel_budget_s=60)).propose_with(ctx, bench)
    inc = ctx.incumbent.candidate
    assert p.candidate.system.diff(inc.system).keys() == {"kernel", "kernel_table", "draft_kernel"}
    assert p.candidate.patch is None and p.candidate.workdir is None
    assert p.candidate.system.kernel.value == "triton" and p.gap.value == "verify-kernels"
    table_id = p.candidate.system.kernel_table  # an id: the same table under whichever home runs it
    table = user_cache.resolve(table_id, "nvidia_h200")
    assert "/" not in table_id and table == user_cache.candidate_path("nvidia_h200", table_id) and table.is_file()
    doc = json.loads(table.read_text())
    assert doc["versions"] == user_cache.versions() and p.details["table"] == str(table)
    entries = {(e["format"], e["m"], e["n"], e["k"]): e for e in doc["entries"]}
    assert entries[("dense", 8, 256, 1024)]["config"] == FAST.to_dict()  # the target's down at 8 rows
    assert entries[("dense", 4, 128, 512)] == {"format": "dense", "m": 4, "n": 128, "k": 512, "path": "unpack_cublas"}
    assert entries[("dense", 64, 128, 512)]["path"] == "unpack_cublas"  # the drafter's prefill bucket too
    assert p.rationale.startswith("tuned kernels for ") and "down@8 " in p.rationale
    timings = p.details["timings"]  # a cuBLAS incumbent: every shape's best enters, cuBLAS ("unpack") where it won
    assert inc.system.kernel.value == "cublas" and entries.keys() == {
        ("dense", 1 << (t["shape"]["m"] - 1).bit_length(), t["shape"]["n"], t["shape"]["k"]) for t in timings}
    table_knob = p.candidate.system.kernel_table
    assert configs.choose(WeightFormat.DENSE, 4, 128, 512, "NVIDIA H200", table_knob) is Fallback.UNPACK_CUBLAS
    assert configs.choose(WeightFormat.DENSE, 4, 128, 512, "NVIDIA H200") is not Fallback.UNPACK_CUBLAS
    cache = promote_table(inc.system, p.candidate.system, "NVIDIA H200")
    assert cache == user_cache.cache_path("nvidia_h200")
    assert configs.choose(WeightFormat.DENSE, 4, 128, 512, "NVIDIA H200") is Fallback.UNPACK_CUBLAS  # every run now
    assert configs.choose_config(WeightFormat.DENSE, 8, 256, 1024, "NVIDIA H200") == FAST
    assert promote_table(p.candidate.system, p.candidate.system, "NVIDIA H200") is None  # nothing new
    configs.tuned_table.cache_clear()


def test_one_tuned_table_is_timed_per_incumbent(tmp_path, monkeypatch):
    """Once a table was timed against the incumbent (here undecided at +1.1%), no table is proposed
    against it again, and the search is skipped; a new incumbent gets one."""
    from loop_fixtures import CONFIG, STOCK, evaluation, fingerprint

    from specpilot.control.rule import Outcome
    from specpilot.loop.recall import Recall
    from specpilot.memory.store import Memory

    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    kc.tuned_table.cache_clear()
    target = tiny_config(hidden_size=256, intermediate_size=1024)
    drafter = tiny_config(hidden_size=128, intermediate_size=512, num_layers=1)
    models = SimpleNamespace(target=SimpleNamespace(config=target), drafter_model=SimpleNamespace(config=drafter))
    agent = KernelAgent(AgentOptions(kernel_budget_s=60))
    (p,) = agent.propose_with(context(models=models), SimulatedBench(unpack_fast={(128, 512)}))
    here = fingerprint("fx")
    with Memory(tmp_path / "m.sqlite") as memory:
        memory.record_evaluation(here, evaluation(p.candidate.system, STOCK, gain=0.011,
                                                  verdict=Outcome.NEED_MORE_DATA), CONFIG)
        recall = Recall.snapshot(memory, here)
    lines: list[str] = []

    class Untouched(SimulatedBench):
        def current(self, shape):
            raise AssertionError("searched again")

    ctx = context(models=models, recall=recall, log=lines.append)
    assert agent.propose_with(ctx, Untouched()) == []
    assert any("a tuned table was timed against this incumbent already (+1.1%, need-more-data" in x for x in lines)
    wider = Incumbent(Candidate(STOCK.with_changes(name="wider", tree_budget=24, topk=8)))
    assert len(agent.propose_with(context(models=models, recall=recall, incumbent=wider),
                                  SimulatedBench(unpack_fast={(128, 512)}))) == 1
    kc.tuned_table.cache_clear()


class DrafterOnlyBench(SimulatedBench):
    """No config beats today's on any size; decode then cuBLAS is 3x faster on `unpack_fast`."""

    def time(self, problem, config):
        trial = super().time(problem, config)
        return Trial(config, us=3 * problem.n * problem.k * 2 / 4e6 + 200.0) if trial.us else trial


def test_a_gain_on_the_draft_models_shapes_alone_turns_only_the_draft_model_to_the_kernels(tmp_path, monkeypatch):
    """The drafter's shapes count (per draft forward) while it drafts with the draft model: a gain
    there is a draft-kernels candidate that leaves the target on cuBLAS; a W12 bench (the target's
    planes) counts none of them."""
    from specpilot.config import Kernel

    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    target = tiny_config(hidden_size=256, intermediate_size=1024)
    drafter = tiny_config(hidden_size=128, intermediate_size=512, num_layers=1)
    models = SimpleNamespace(target=SimpleNamespace(config=target), drafter_model=SimpleNamespace(config=drafter))
    ctx = context(checkout=None, scratch=tmp_path / "scratch", models=models)
    (p,) = KernelAgent(AgentOptions(kernel_budget_s=60)).propose_with(ctx, DrafterOnlyBench(unpack_fast={(128, 512)}))
    inc = ctx.incumbent.candidate.system
    assert p.candidate.system.diff(inc).keys() == {"draft_kernel", "kernel_table"}
    assert p.candidate.system.kernel is Kernel.CUBLAS and p.candidate.system.draft_kernel is Kernel.TRITON
    assert p.gap.value == "draft-kernels" and "drafter.down@" in p.rationale
    downs = [t["shape"]["count"] for t in p.details["timings"] if t["shape"]["name"] == "drafter.down"]
    assert sum(downs) == 1 * ctx.cost.profile.draft_forwards  # one layer, each draft forward (catch-up, expansions)
    entries = json.loads(user_cache.resolve(p.candidate.system.kernel_table, "nvidia_h200").read_text())["entries"]
    drafter_sizes = {(s.n, s.k) for s in projection_shapes(drafter, 4, True)}
    assert entries and all((e["n"], e["k"]) in drafter_sizes for e in entries)  # the drafter's turn only
    on_w12 = Incumbent(Candidate(inc.with_changes(name="w12", kernel=Kernel.TRITON, w12=True)))
    ctx = context(incumbent=on_w12, checkout=None, scratch=tmp_path / "scratch", models=models)
    (q,) = KernelAgent(AgentOptions(kernel_budget_s=60)).propose_with(ctx, W12Bench())
    counts = [t["shape"]["count"] for t in q.details["timings"] if t["shape"]["name"].startswith("drafter.")]
    assert counts and not any(counts) and q.candidate.system.draft_kernel is Kernel.CUBLAS


def test_a_gain_on_an_eagle3_heads_shapes_turns_its_kernels_on(tmp_path, monkeypatch):
    """The incumbent drafts with the EAGLE-3 head: its shapes are the session's head's (fc over the
    fused features, qkv over 2C), and a gain there turns `draft_kernel` on, the target untouched."""
    from specpilot.config import DrafterKind, Kernel
    from specpilot.models.eagle3 import Eagle3Spec

    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    target = tiny_config(hidden_size=256, intermediate_size=1024)
    head = SimpleNamespace(config=tiny_config(hidden_size=256, intermediate_size=512, num_layers=1),
                           spec=Eagle3Spec((1, 2, 3), 256, 1000))
    models = SimpleNamespace(target=SimpleNamespace(config=target), eagle3_model=head, drafter_model=None)
    inc = Incumbent(Candidate(context().incumbent.candidate.system.with_changes(name="e3", drafter=DrafterKind.EAGLE3)))
    ctx = context(incumbent=inc, checkout=None, scratch=tmp_path / "scratch", models=models)
    (p,) = KernelAgent(AgentOptions(kernel_budget_s=60)).propose_with(ctx, DrafterOnlyBench(unpack_fast={(256, 768)}))
    assert p.candidate.system.diff(inc.candidate.system).keys() == {"draft_kernel", "kernel_table"}
    assert p.candidate.system.draft_kernel is Kernel.TRITON and p.gap.value == "draft-kernels"
    assert "drafter.fc@" in p.rationale  # [C, 3 x C_t]: the fusion of three target layers' features


def test_on_an_fp8_target_only_the_drafters_shapes_are_tuned(tmp_path, monkeypatch):
    """An FP8 target's projections run the FP8 kernels: its block shapes are left out (a gain there
    turns the BF16 target to the kernels, and nothing on the FP8 one), the drafter's still count."""
    from dataclasses import replace

    from specpilot.config import Kernel

    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "home"))
    target = tiny_config(hidden_size=256, intermediate_size=1024)
    drafter = tiny_config(hidden_size=128, intermediate_size=512, num_layers=1)
    models = SimpleNamespace(target=SimpleNamespace(config=target), drafter_model=SimpleNamespace(config=drafter))
    agent = KernelAgent(AgentOptions(kernel_budget_s=60))
    bf16 = context(checkout=None, scratch=tmp_path / "scratch", models=models)
    (p,) = agent.propose_with(bf16, SimulatedBench())  # FAST on the target's down [256, 1024]
    assert p.candidate.system.kernel is Kernel.TRITON
    lines = []
    fp8 = context(checkout=None, scratch=tmp_path / "scratch", models=models, log=lines.append,
                  deployment=replace(bf16.deployment, target_format="fp8-block"))
    bench = SimulatedBench()
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "fp8-home"))  # nothing recorded as searched
    assert agent.propose_with(fp8, bench) == []
    target_sizes = {(s.n, s.k) for s in projection_shapes(target, 1, False)}
    assert bench.timed and not {nk for nk, _ in bench.timed} & target_sizes
    assert any("the target is FP8" in line for line in lines)
    monkeypatch.setenv("SPECPILOT_HOME", str(tmp_path / "fp8-home-2"))
    (q,) = agent.propose_with(fp8, DrafterOnlyBench(unpack_fast={(128, 512)}))
    assert q.candidate.system.diff(fp8.incumbent.candidate.system).keys() == {"draft_kernel", "kernel_table"}
