"""The kernel agent: off on CPU; on a (simulated) GPU it tunes the deployment's shapes furthest from
their floor, and proposes its table as a knob-level candidate (no git checkout), promoted into the user cache."""

import json
from types import SimpleNamespace

import pytest

from loop_fixtures import context

from specpilot.kernels import configs as kc
from specpilot.kernels import user_cache
from specpilot.kernels.configs import Fallback, KernelPath, LaunchConfig, WeightFormat
from specpilot.kernels.search import Problem, Trial
from specpilot.loop.agents.base import AgentOptions, LoopSetup
from specpilot.loop.agents.kernel import (
    GpuKernelBench,
    KernelAgent,
    deployment_shapes,
    projection_shapes,
    projection_weight,
    promote_table,
    table_document,
    tune,
)
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.models.random_checkpoint import tiny_config

SLOW = LaunchConfig(KernelPath.GEMV, block_n=4, block_k=512)  # today's choice: no candidate of the search
FAST = kc.candidates(8)[1]  # a candidate of every shape at M = 8
BROKEN = kc.candidates(8)[0]


class SimulatedBench:
    """Today's config is SLOW everywhere; FAST is 2x faster on 'down' only; BROKEN fails the check;
    every other config the search tries is as fast as SLOW; decode then cuBLAS is 3x faster on the
    (n, k) sizes of `unpack_fast` and 2x slower elsewhere (the bench's weights are plain: one path)."""

    device_name = "NVIDIA H200"
    weight_format = WeightFormat.DENSE
    sm_count = 132

    def __init__(self, unpack_fast=()):
        self.timed = []
        self.unpack_fast = set(unpack_fast)

    def time_fallback(self, problem, fallback):
        assert fallback is Fallback.UNPACK_CUBLAS
        base = 3 * problem.n * problem.k * 2 / 4e6 + 200.0
        return base / 3 if (problem.n, problem.k) in self.unpack_fast else base * 2

    def current(self, shape):
        return SLOW

    def floor_us(self, shape):
        return shape.n * shape.k * 2 / 4e6  # 4 TB/s

    def time(self, problem, config):
        self.timed.append(((problem.n, problem.k), config))
        if config == BROKEN:
            return Trial(config, worst_error_over_bound=3.0, error="exceeds the error bound")
        base = 3 * problem.n * problem.k * 2 / 4e6 + 200.0  # launch-bound: far above the floor
        return Trial(config, us=base / 2 if (config == FAST and (problem.n, problem.k) == (256, 1024)) else base)


def test_off_on_cpu_and_says_why(tmp_path):
    status = KernelAgent().status(LoopSetup(context().deployment, "cpu", "cpu-x86_64", None, tmp_path))
    assert not status.enabled and "cpu" in status.reason


def test_shapes_are_tuned_in_order_of_their_excess_and_only_improvements_enter_the_table():
    config = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=4)
    shapes = projection_shapes(config, rows=8, lm_head=False)
    assert [(s.name, s.m, s.n, s.k, s.count) for s in shapes] == [  # 4 heads, 2 kv heads of 16
        ("qkv", 8, 128, 256, 4), ("o", 8, 256, 64, 4), ("gate_up", 8, 2048, 256, 4), ("down", 8, 256, 1024, 4)]
    bench = SimulatedBench()
    timings = tune(shapes, bench, budget_s=60)
    excess = [t.excess_us for t in timings]
    assert excess == sorted(excess, reverse=True)
    assert [t.shape.name for t in timings if t.improved] == ["down"]
    for t in timings:  # the search's configs, each once; today's before and after the search only
        mine = [c for nk, c in bench.timed if nk == (t.shape.n, t.shape.k)]
        assert t.tried == len(mine) - 2 > 2 and mine.count(SLOW) == 2 and len(set(mine)) == len(mine) - 1
        assert mine[0] == mine[-1] == SLOW and BROKEN in mine and FAST in mine
    existing = {("dense", 1, 4096, 4096): SLOW}
    doc = table_document("NVIDIA H200", "dense", existing, timings)
    keys = [(e["format"], e["m"], e["n"], e["k"]) for e in doc["entries"]]
    assert keys == [("dense", 1, 4096, 4096), ("dense", 8, 256, 1024)] and doc["entries"][1]["config"] == FAST.to_dict()
    assert tune(shapes, SimulatedBench(), budget_s=0)[0].tried == 0  # no budget: today's configs only


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


def test_the_deployments_shapes_are_the_row_counts_it_runs():
    target = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=4)
    drafter = tiny_config(hidden_size=128, intermediate_size=256, num_layers=1)
    system = context().incumbent.candidate.system.with_changes(topk=8, tree_budget=128, depth=7)
    shapes = deployment_shapes(target, drafter, system, batch=1, tree_nodes=129, draft_forwards=7,
                               drafter_kernels=True)
    rows = {}
    for s in shapes:
        rows.setdefault(s.name, []).append(s.m)
    assert rows["down"] == [129] and "lm_head" not in rows  # verification; lm_head only with kernel_lm_head
    # the catch-up over the window (depth + 1 = 8 rows, the lm_head on the root only), then 6
    # expansions over topk x batch = 8 rows: one shape per row count, counts summed
    assert rows["drafter.qkv"] == [8] and rows["drafter.lm_head"] == [1, 8]
    assert rows["gate_up@prefill"] == rows["drafter.o@prefill"] == [64, 128, 192, 256]  # buckets up to 257 rows
    by_name = {(s.name, s.m): s for s in shapes}
    assert by_name["drafter.down", 8].count == 7 and by_name["down", 129].count == 4
    assert by_name["qkv@prefill", 64].count == 0
    assert by_name["drafter.lm_head", 1].count == 1 and by_name["drafter.lm_head", 8].count == 6
    assert by_name["drafter.lm_head", 8].n == drafter.vocab_size
    narrow = deployment_shapes(target, drafter, system.with_changes(topk=4), 1, 129, 7, drafter_kernels=True)
    counts = {s.m: s.count for s in narrow if s.name == "drafter.down"}
    assert counts == {8: 1, 4: 6}  # the catch-up's window and the expansions' rows apart
    today = deployment_shapes(target, drafter, system, batch=1, tree_nodes=129, draft_forwards=7)
    assert [s.name for s in today] == [s.name for s in shapes]  # tuned all the same
    assert {s.count for s in today if s.name.startswith("drafter.")} == {0}  # the drafter runs cuBLAS today



def test_a_feature_drafters_own_shapes_are_counted_as_it_runs_them():
    """EAGLE-3: its catch-up over batch x (depth + 1) rows through fc and its layer (qkv reads 2C),
    the lm_head on the roots, then depth - 1 expansions over batch x topk; DFlash: its context and
    its block over batch x block_size rows (projections twice, fc once), no lm_head of its own."""
    from specpilot.config import DrafterKind
    from specpilot.models.dflash import DFlashSpec
    from specpilot.models.eagle3 import Eagle3Spec

    target = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=4)
    head = tiny_config(hidden_size=256, intermediate_size=512, num_layers=1)
    eagle3 = SimpleNamespace(config=head, spec=Eagle3Spec((1, 2, 3), 256, 1000))
    system = context().incumbent.candidate.system.with_changes(drafter=DrafterKind.EAGLE3, depth=5, topk=4,
                                                               tree_budget=32)
    shapes = {(s.name, s.m): s for s in deployment_shapes(target, eagle3, system, 2, 33, 5, drafter_kernels=True)}
    qkv_n = (head.num_heads + 2 * head.num_kv_heads) * head.head_dim
    assert (shapes["drafter.qkv", 12].n, shapes["drafter.qkv", 12].k) == (qkv_n, 512)  # 2 x (5 + 1) rows
    assert (shapes["drafter.fc", 12].n, shapes["drafter.fc", 12].k, shapes["drafter.fc", 12].count) == (256, 768, 1)
    assert shapes["drafter.lm_head", 2].count == 1 and shapes["drafter.lm_head", 2].n == 1000
    assert shapes["drafter.down", 8].count == shapes["drafter.lm_head", 8].count == 4  # 2 x topk rows, 4 levels
    assert ("drafter.fc@prefill", 64 * 2) in shapes and ("drafter.fc", 8) not in shapes

    dflash = SimpleNamespace(config=tiny_config(hidden_size=256, intermediate_size=512, num_layers=2),
                             spec=DFlashSpec((1, 3), block_size=8))
    system = system.with_changes(drafter=DrafterKind.DFLASH, block_size=8)
    shapes = {(s.name, s.m): s for s in deployment_shapes(target, dflash, system, 1, 33, 7, drafter_kernels=True)}
    drafted = {name: s.count for (name, m), s in shapes.items() if name.startswith("drafter.") and s.count}
    assert drafted == {"drafter.qkv": 4, "drafter.o": 4, "drafter.gate_up": 4, "drafter.down": 4, "drafter.fc": 1}
    assert shapes["drafter.fc", 8].k == 512 and ("drafter.lm_head", 8) not in shapes
    off = deployment_shapes(target, dflash, system, 1, 33, 7)  # cuBLAS today: tuned, counted 0
    assert {s.count for s in off if s.name.startswith("drafter.")} == {0}


def test_each_shape_is_timed_on_the_weight_of_its_own_model():
    """The first block's projections, the lm_head and fc of each model, target first."""
    from specpilot.models.eagle3 import random_eagle3
    from specpilot.models.transformer import Transformer

    target = Transformer(tiny_config(hidden_size=64, intermediate_size=128, num_layers=2))
    head = random_eagle3(target.config, layer_ids=(0, 1, 1))
    assert projection_weight([target, head], 128 * 2, 64) is target.layers[0].mlp.gate_up_proj.weight
    qkv = head.midlayer.self_attn.qkv_proj.weight
    assert qkv.shape[1] == 128 and projection_weight([target, head], *qkv.shape) is qkv
    assert projection_weight([target, head], *head.fc.weight.shape) is head.fc.weight
    assert projection_weight([target, head], *target.lm_head.weight.shape) is target.lm_head.weight
    with pytest.raises(KeyError, match=r"\[7, 7\]"):
        projection_weight([target], 7, 7)

@pytest.mark.parametrize("w12", [False, True])
def test_the_bench_times_each_shape_over_copies_of_its_weight_beyond_l2(w12):
    """A shape's calls rotate over the model's weight and fresh copies of it, together past
    L2_COVER_BYTES (a single weight would stay in L2 and time faster than a forward reads it);
    each copy gives the model weight's output."""
    import torch

    from specpilot.kernels import timing
    from specpilot.models.transformer import Transformer

    torch.manual_seed(0)
    target = Transformer(tiny_config(hidden_size=64, intermediate_size=128, num_layers=2)).bfloat16()
    bench = GpuKernelBench(target, None, w12, 1000.0)
    fmt = WeightFormat.W12 if w12 else WeightFormat.DENSE
    problem = Problem(fmt, 256, 64, 3)
    sets = bench._timer.case(problem)[1]
    assert len(sets) == timing.MAX_SETS  # 64 x 256 is far below L2: as many copies as allowed
    planes = [s.lo if w12 else s for s in sets]
    assert len({t.data_ptr() for t in planes}) == len(sets)
    weight = target.layers[0].mlp.gate_up_proj.weight
    if w12:  # the planes of the weight's encoding, copied (decoding them needs the Triton kernels)
        from specpilot.w12 import encode

        first = encode(weight).planes()
        assert all(torch.equal(s.planes()[k], v) for s in sets for k, v in first.items())
        assert all(not s.derived for s in sets)
    else:
        expected = torch.nn.functional.linear(bench._timer.case(problem)[0], weight)  # [3, 256]
        outputs = [c() for c in bench.calls(problem, Fallback.UNPACK_CUBLAS)]
        assert len(outputs) == len(sets)
        assert all(torch.equal(y.view(torch.int16), expected.view(torch.int16)) for y in outputs)
    assert len(bench.calls(problem, LaunchConfig(KernelPath.GEMV, block_n=8, block_k=128, num_warps=2))) == len(sets)
    assert timing.weight_sets(4096, 4096, 4096 * 4096 * 2) == 6  # 33.6 MB each: 6 past 200 MB
    assert timing.weight_sets(151936, 4096, 151936 * 4096 * 2) == timing.MIN_SETS


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

class W12Bench(SimulatedBench):
    """W12 weights: today's choice is the rule's (SLOW up to 64 rows, decode at each call above);
    keeping the weight decoded is 3x faster than decoding at each call, and than SLOW, at every size."""

    weight_format = WeightFormat.W12

    def current(self, shape):
        return Fallback.UNPACK_CUBLAS if shape.m > 64 else SLOW

    def time_fallback(self, problem, fallback):
        base = 3 * problem.n * problem.k * 2 / 4e6 + 200.0
        return base / 3 if fallback is Fallback.DECODED_CUBLAS else base


def test_w12_above_the_kernels_rows_takes_the_faster_decoded_path():
    config = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=4)
    timings = tune(projection_shapes(config, rows=129, lm_head=False) + projection_shapes(config, 8, False),
                   W12Bench(), budget_s=60)
    assert len(timings) == 8 and all(t.improved for t in timings)
    assert {t.best["path"] for t in timings} == {"decoded_cublas"}
    assert all(t.complete for t in timings)  # within the budget: every config and fallback timed
    above = [t for t in timings if t.shape.m == 129]
    assert all(t.current == {"path": "unpack_cublas"} and t.tried == 0 for t in above)  # no kernel search there
    doc = table_document("NVIDIA H200", "w12", {}, timings)
    assert {(e["m"], e["path"]) for e in doc["entries"]} == {(256, "decoded_cublas"), (8, "decoded_cublas")}


def test_the_fallbacks_are_timed_before_the_search_spends_the_budget(monkeypatch):
    """A search that uses up the budget (each config timing a second on the agent's clock) leaves
    every shape its decoded-cuBLAS timing: above 64 rows the only choice besides today's."""
    from specpilot.loop.agents import kernel as agent

    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(agent, "time", SimpleNamespace(monotonic=lambda: clock.now))

    class SlowSearchBench(W12Bench):
        def time(self, problem, config):
            clock.now += 1.0
            return super().time(problem, config)

    config = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=4)
    bench = SlowSearchBench()
    timings = tune(projection_shapes(config, rows=129, lm_head=False) + projection_shapes(config, 8, False),
                   bench, budget_s=6)
    assert clock.now > 6  # the search ran past the budget
    assert {t.best["path"] for t in timings} == {"decoded_cublas"}
    # fallbacks timed, configs not searched: complete above 64 rows only (nothing else to time there)
    assert [t.shape.m for t in timings if t.complete] == [129] * 4


def test_the_log_names_each_searched_or_improved_shape_and_counts_the_rest():
    """A line per shape the search took (or that improved), one line for the shapes only timed: at
    concurrency 8 on the H200 the prefill buckets were 36 of 45 lines, each 'over 0 configs'."""
    config = tiny_config(hidden_size=256, intermediate_size=1024, num_layers=4)
    shapes = projection_shapes(config, rows=8, lm_head=False) + projection_shapes(config, rows=512, lm_head=False)
    lines = []
    timings = tune(shapes, SimulatedBench(unpack_fast={(128, 256)}), budget_s=60, log=lines.append)
    searched = [t for t in timings if t.tried or t.improved]
    assert {(t.shape.m, t.shape.name) for t in searched} == {(8, n) for n in ("qkv", "o", "gate_up", "down")} | {
        (512, "qkv")}  # M=512 'qkv': cuBLAS on the decoded weight beats today's config
    assert lines[:-1] == [line for line in lines if " M=" in line] and len(lines) == len(searched) + 1
    assert "(unpack_cublas) over 0 configs" in next(line for line in lines if "M=512" in line)
    assert lines[-1].startswith("kernel: 3 more shape(s) timed but searched by no config")
