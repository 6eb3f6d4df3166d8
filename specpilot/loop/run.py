"""A whole loop run: set up, measure the noise floor, run rounds within the budget, measure, report.

    setup      fingerprint the deployment, open the memory, build the controller (local workers,
               the token-forcing gate, the benchmark prompt source), ask each agent once whether it
               is on, load the models in this process (profiles, the guard's scorer, the final
               benchmark: one copy, shared with the guard); all of it fixed for the run, in one
               frozen `RunContext` (`context.py`)
    lock       the timing lock of the devices and the memory (`control.timing_lock`), held from
               loading the models to the end: a second run waits for it (`wait_s`), or with
               `--no-wait` / on timeout runs without it, and what it times is marked contended
               (taken when it comes free, between rounds); the budget does not count the wait
               (a run that waited says how long, and what is left)
    noise      the stock-vs-stock noise floor for this deployment and timing procedure: from the
               memory when one was measured under a comparable load (`memory.evaluate.reusable_noise`),
               else measured now and stored with its load; checked again before a round times its
               candidates against the load the last round ran under, and re-chosen when that
               changed (a round with nothing new to time measures no noise; `noise.py`)
    resume     the incumbent is the memory's best validated system (`state.py`)
    seeds      what similar deployments validated, rebuilt on this deployment (`seeds.py`): each
               one offered or skipped is a journal line with its similarity; the offered ones
               are timed first in the run's first round
    rounds     `rounds.run_round` until the run has `rounds` completed rounds, the budget would be
               overrun by the next one (the final measurement's time is reserved, `budget.py`) or
               could time none of the last one's candidates (each is timed only when it fits), or
               `patience` rounds in a row had nothing new to time; each round's evaluations are
               tagged in the memory with the load the round ran under. Before the first round a
               budgeted run says what fits (`budget_plan.py`, which states the budget's rule). What
               a round changes is its `RoundState`: each round gives the next
    final      the last incumbent's cost table (the "after" of the gap breakdown), and stock and the
               final system against AR in one benchmark run (`final.py`); with a budget, each only
               when its estimate fits in what is left (else skipped, with a line saying so)
    report     report.json, report.md, the plots (`report.py`, `plots.py`)
Ctrl-C stops the work and still writes the report (without the final benchmark if it was cut; the
first Ctrl-C is acknowledged at once, `interrupt.py`); so does a round that cannot be decided (the
incumbent's workers fail: `StopReason.ERROR`, with the error in the journal). A killed run leaves
its journal and the memory consistent, and `--resume` continues it. Worktrees are removed at the end.

On CPU the loop runs torch single-threaded in this process, as its workers do (`runner.py`).

Owns: `LoopResult`, `run_loop` and the order of the steps. Does not own any step, nor the journal's
text (`reporter.py`).
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import TextIO

from specpilot.control.load import LoadProbe
from specpilot.errors import SpecPilotError
from specpilot.loop.budget import (
    compile_seconds,
    compiles,
    final_seconds,
    fitting_candidates,
    round_seconds,
)
from specpilot.loop.config import LoopConfig, StopReason
from specpilot.loop.context import RunContext, RunOptions, open_run
from specpilot.loop.noise import NoiseChoice, choose_noise, noise_for_round
from specpilot.loop.rounds import RoundOutcome, RoundState, run_round
from specpilot.loop.state import RunPaths
from specpilot.loop.systems import Incumbent


@dataclass(frozen=True)
class LoopResult:
    paths: RunPaths
    stop: StopReason
    incumbent: Incumbent
    rounds: tuple[RoundOutcome, ...]
    report: dict
    files: tuple


def run_loop(config: LoopConfig, options: RunOptions = RunOptions(), stream: TextIO | None = None,
             probe: LoadProbe | None = None) -> LoopResult:
    """Run the loop; returns where it wrote its report and what it found. `probe` reads the
    machine's load (default: /proc)."""
    import torch

    from specpilot.loop.report import write_report

    with ExitStack() as stack:
        stack.callback(torch.set_num_threads, torch.get_num_threads())
        ctx = open_run(config, options, stream, probe, stack)
        start = ctx.start
        state = RoundState(index=start.next_round, done=start.rounds_done, incumbent=start.incumbent,
                           noise=choose_noise(ctx, force=options.remeasure_noise))
        state, stop = run_rounds(ctx, state)
        after, final, stop = finish(ctx, state, stop)
        files, report = write_report(paths=ctx.paths, journal=ctx.journal, deployment=ctx.deployment,
                                     fp=ctx.fingerprint, config=config, ccfg=ctx.controller_config,
                                     noise=state.noise.floor, start=start, incumbent=state.incumbent, after=after,
                                     final=final, stop=stop, memory=ctx.memory, device=ctx.device)
        ctx.report.wrote(files)
        return LoopResult(paths=ctx.paths, stop=stop, incumbent=state.incumbent, rounds=state.outcomes, report=report,
                          files=tuple(files))


def run_rounds(ctx: RunContext, state: RoundState) -> tuple[RoundState, StopReason]:
    """Rounds from `state` until one of the module docstring's stops; (the last state, why)."""
    c, report = ctx.config, ctx.report
    stop = StopReason.ROUNDS

    def round_noise() -> NoiseChoice:  # asked by a round once it has candidates to time
        nonlocal state  # the floor chosen stays in force even when the round then fails
        state = replace(state, noise=noise_for_round(ctx, state))
        return state.noise

    try:
        while state.done < c.rounds:
            if state.cost is None and state.outcomes and not ctx.budget.fits(state.measure_s + state.reserve):
                stop = StopReason.BUDGET  # a promoted incumbent's cost table comes first: it does not fit
                report.no_time_to_measure(stop, state.index, state.measure_s, state.reserve, c.final,
                                          ctx.budget.left())
                break
            state = measured(ctx, state)
            state = replace(state, reserve=final_reserve(ctx, state.cost, state))
            estimate, candidates = round_size(ctx, state)
            if not candidates:
                stop = StopReason.BUDGET
                report.no_round_fits(stop, state.index, estimate, state.reserve, c.final, ctx.budget.left())
                break
            with ctx.lock.window() as window:
                outcome = run_round(ctx, state, candidates, round_noise)
            ctx.memory.tag_load([x.entry_id for x in outcome.evaluated], window.load)
            if window.load.contended and outcome.evaluated:
                report.contended(state.index, window.load)
            state = state.after(outcome, window.load)
            if outcome.left_out and outcome.nothing_new:
                stop = StopReason.BUDGET  # not one of its candidates fitted: the next round's would not either
                report.no_candidate_fits(stop, state.index - 1, state.reserve, c.final, ctx.budget.left())
                break
            if state.idle >= c.patience:
                stop = StopReason.CONVERGED
                report.converged(stop, state.idle, state.index - 1)
                break
        else:
            report.rounds_done(stop, state.done, state.index - 1)
    except KeyboardInterrupt:
        stop = StopReason.INTERRUPTED
        report.interrupted(stop, state.index)
    except SpecPilotError as err:  # e.g. the incumbent's workers failed: nothing can be compared
        stop = StopReason.ERROR
        report.round_failed(stop, state.index, err)
    return state, stop


def measured(ctx: RunContext, state: RoundState) -> RoundState:
    """`state` with its incumbent's cost table (measured now unless known), remembering the longest
    time a measurement took (what the budget expects the next to take)."""
    if state.cost is not None:
        return state
    t0 = time.monotonic()
    cost = ctx.measure(state.incumbent.candidate)
    return replace(state, cost=cost, measure_s=max(state.measure_s, time.monotonic() - t0))


def final_reserve(ctx: RunContext, cost, state: RoundState) -> float:
    """The final measurement's estimate from the incumbent's cost table `cost` (0 without a final),
    with a compile warm-up (as this run's rounds saw them) for each of stock and the incumbent that
    compiles."""
    if not ctx.config.final:
        return 0.0
    incumbent = state.incumbent
    systems = {c.hash: c for c in (ctx.stock, incumbent.candidate)}.values()
    compile_s = sum(compiles(c.knobs) for c in systems) * compile_seconds(state.compile_opens, ctx.device)
    return final_seconds(cost, ctx.bench, ctx.deployment.regime.batch, ctx.device, ctx.final_may_patch(incumbent),
                         compile_s, heldout=ctx.heldout_bench)


def round_size(ctx: RunContext, state: RoundState) -> tuple[float, int]:
    """(the next round's estimate, the candidates it may time within the budget: 0 when not even
    one's round fits); before the first round, says what fits."""
    c, report, budget, reserve = ctx.config, ctx.report, ctx.budget, state.reserve
    past = [o.seconds for o in state.outcomes if not o.nothing_new]
    per_evaluation, parallelism = state.noise.per_evaluation, ctx.backend.parallelism
    # proposing: the kernel agent tunes kernels for up to its budget (a first round's estimate)
    propose_s = c.kernel_budget_s if any(a.name == "kernel" for a in ctx.agents) else 0.0
    estimate = round_seconds(past, per_evaluation, c.max_candidates, parallelism, propose_s)
    if state.first and budget.seconds is None:
        report.no_budget(c.rounds - state.done, estimate, reserve, c.final)
    candidates = c.max_candidates
    if not budget.fits(estimate + reserve):
        candidates = fitting_candidates(past, per_evaluation, c.max_candidates, parallelism, budget.left() - reserve,
                                        propose_s)
    if state.first and budget.seconds is not None:  # what fits, said before the first round
        report.plan(budget.left(), c.rounds - state.done, estimate, reserve if c.final else None, candidates,
                    c.max_candidates)
    if 0 < candidates < c.max_candidates:
        report.fewer_candidates(state.index, candidates, c.max_candidates, estimate, reserve, c.final, budget.left())
    return estimate, candidates


def finish(ctx: RunContext, state: RoundState, stop: StopReason):
    """After the rounds: the final system's cost table (the report's "after"; the rounds' when they
    measured it) and the final measurement, each only when it fits in the budget's time left;
    returns (after, final, stop)."""
    report, after, final = ctx.report, state.cost, None
    if stop is StopReason.INTERRUPTED:
        return after, final, stop
    try:
        if after is None and ctx.budget.fits(state.measure_s + state.reserve):
            try:  # the final system's cost table, for the report; the final runs without it
                after = measured(ctx, state).cost
            except SpecPilotError as err:
                report.cost_table_failed(stop, err)
        elif after is None:
            report.no_time_for_cost_table(state.measure_s, ctx.config.final)
        if ctx.config.final:
            reserve = state.reserve if after is None else final_reserve(ctx, after, state)
            if ctx.budget.fits(reserve):
                final = run_final(ctx, state.incumbent)
            else:
                report.final_skipped(stop, reserve, ctx.budget.left())
    except KeyboardInterrupt:
        stop = StopReason.INTERRUPTED
        report.final_interrupted(stop)
    except SpecPilotError as err:
        report.final_failed(stop, err)
    return after, final, stop


def run_final(ctx: RunContext, incumbent: Incumbent):
    """Stock and the final system against AR in one benchmark run, then on the held-out prompts
    (`final.measure_final`)."""
    from specpilot.loop.final import describe_config, measure_final

    cfg, held, same = ctx.bench, ctx.heldout_bench, incumbent.candidate.hash == ctx.stock.hash
    also = "" if same or held is None else f"; then on {held.n_prompts} held-out prompts (never seen by the loop)"
    ctx.report.final_start("" if same else f" and {incumbent.name!r}", describe_config(cfg) + also)
    final = measure_final(ctx.session, ctx.deployment, ctx.deployment_file, ctx.stock, incumbent.candidate, cfg,
                          ctx.paths.scratch, heldout_prompts=ctx.config.final_heldout_prompts)
    ctx.report.final(final)
    return final
