"""A whole loop run: set up, measure the noise floor, run rounds within the budget, measure, report.

    setup      fingerprint the deployment, open the memory, build the controller (local workers,
               the token-forcing gate, the benchmark prompt source), ask each agent once whether it
               is on, load the models in this process (profiles, the guard's scorer, the final
               benchmark: one copy, shared with the guard)
    lock       the timing lock of the devices and the memory (`control.timing_lock`), held from
               loading the models to the end: a second run waits for it (`wait_s`), or with
               `--no-wait` / on timeout runs without it, and what it times is marked contended
               (taken when it comes free, between rounds); the budget does not count the wait
               (a run that waited says how long, and what is left)
    noise      the stock-vs-stock noise floor for this deployment and timing procedure: from the
               memory when one was measured under a comparable load (`memory.evaluate.reusable_noise`),
               else measured now and stored with its load; checked again before a round times its
               candidates against the load the last round ran under, and re-chosen when that
               changed (a round with nothing new to time measures no noise)
    resume     the incumbent is the memory's best validated system (`state.py`)
    seeds      what similar deployments validated, rebuilt on this deployment (`seeds.py`): each
               one offered or skipped is a journal line with its similarity; the offered ones
               are timed first in the run's first round
    rounds     `rounds.run_round` until the run has `rounds` completed rounds, the budget would be
               overrun by the next one (the final measurement's time is reserved, `budget.py`), or
               `patience` rounds in a row had nothing new to time; each round's evaluations are
               tagged in the memory with the load the round ran under. Before the first round a
               budgeted run says what fits (`budget_plan.py`, which states the budget's rule)
    final      the last incumbent's cost table (the "after" of the gap breakdown), and stock and the
               final system against AR in one benchmark run (`final.py`); with a budget, each only
               when its estimate fits in what is left (else skipped, with a line saying so)
    report     report.json, report.md, the plots (`report.py`, `plots.py`)
Ctrl-C stops the work and still writes the report (without the final benchmark if it was cut); so
does a round that cannot be decided (the incumbent's workers fail: `StopReason.ERROR`, with the
error in the journal). A killed run leaves its journal and the memory consistent, and `--resume`
continues it. Worktrees are removed at the end.

On CPU the loop runs torch single-threaded in this process, as its workers do (`runner.py`).

Owns: `RunOptions`, `LoopResult`, `run_loop` and the order of the steps. Does not own any step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TextIO

from specpilot.config import load_deployment
from specpilot.control.gate import DEFAULT_GATE, load_gate
from specpilot.control.load import LoadProbe, not_comparable
from specpilot.control.prompts import DEFAULT_PROMPT_SOURCE, derived_seed, load_prompt_source
from specpilot.control.rule import promotion_threshold
from specpilot.control.timing_lock import DEFAULT_WAIT_S, TimingLock
from specpilot.errors import SpecPilotError
from specpilot.loop.agents.base import AgentOptions, LoopSetup, make_proposers
from specpilot.loop.budget import Budget, evaluation_seconds, final_seconds, fitting_candidates, round_seconds
from specpilot.loop.budget_plan import plan_line, waited_line
from specpilot.loop.config import LoopConfig, StopReason, controller_config
from specpilot.loop.journal import EventKind, Journal
from specpilot.loop.measure import measure, measure_in_worktree
from specpilot.loop.rounds import RoundInputs, RoundOutcome, run_round
from specpilot.loop.runner import CPU_THREADS, LOOP_RUNNER
from specpilot.loop.state import RunPaths, prepare_run, resume_point, round_label
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.loop.worktree import Checkout, package_checkout, remove


@dataclass(frozen=True)
class RunOptions:
    """Inputs of a run besides `LoopConfig` (the CLI's other flags)."""

    deployment: str | None = None  # file or shipped name; None = the default deployment
    out: str | None = None
    resume: bool = False
    memory: str | None = None  # None = $SPECPILOT_MEMORY or $SPECPILOT_HOME/memory.sqlite
    devices: tuple[str, ...] | None = None  # None = every visible GPU, else the CPU
    gate: str = DEFAULT_GATE
    prompt_source: str = DEFAULT_PROMPT_SOURCE
    runner: str = LOOP_RUNNER
    remeasure_noise: bool = False  # measure the noise floor again even if the memory has one
    quiet: bool = False
    wait_s: float = DEFAULT_WAIT_S  # how long to wait for another timing run's lock (0: --no-wait)


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

    run = _Run(config, options, stream, probe)
    threads = torch.get_num_threads()
    if run.device == "cpu":
        torch.set_num_threads(CPU_THREADS)
    try:
        return run.execute()
    finally:
        run.close()
        torch.set_num_threads(threads)


class _Run:
    def __init__(self, config: LoopConfig, options: RunOptions, stream: TextIO | None, probe: LoadProbe | None):
        from specpilot.control.backends.local import LocalBackend, visible_devices
        from specpilot.memory.store import Memory

        self.config, self.options = config, options
        self.budget = Budget(config.budget_s)
        self.measure_s = 0.0  # the longest cost-table measurement so far: what the next one should take
        self.reserve = 0.0  # the final measurement's latest estimate (0 without one)
        self.deployment_file = options.deployment or "fixture"
        self.deployment = load_deployment(self.deployment_file)
        self.devices = tuple(options.devices or visible_devices())
        self.device = "cuda" if self.devices[0].startswith("cuda") else "cpu"
        self.ccfg = controller_config(config, self.deployment)
        self.agents = make_proposers(config.agents, AgentOptions(
            config.coding_command, config.coding_timeout_s, config.coding_agents, config.kernel_budget_s))
        self.memory = Memory(options.memory)  # before any directory: a refused memory leaves none behind
        try:
            self.paths = prepare_run(options.out, self.deployment.name, options.resume)
            self.journal = Journal(self.paths.journal, stream, quiet=options.quiet)
            self.backend = LocalBackend(devices=list(self.devices), placement=self.ccfg.placement)
        except BaseException:
            self.memory.close()
            raise
        root = package_checkout()
        self.checkout = Checkout.capture(root) if root else None
        self.stock = Candidate(self.deployment.stock)
        self.lock = TimingLock(self.devices, self.memory.path, wait_s=options.wait_s, say=self.journal.say,
                               probe=probe)
        self.last_load = None  # the load the last round ran under (None before the first)

    def close(self) -> None:
        self.lock.release()
        self.memory.close()
        self.backend.close()
        if self.checkout is not None:
            for path in sorted(self.paths.scratch.iterdir()):
                if path.is_dir() and (path / ".git").exists():
                    remove(self.checkout.root, path)

    # ---- the steps ---------------------------------------------------------------------------
    def execute(self) -> LoopResult:
        from specpilot.control.controller import Controller
        from specpilot.loop.progress import ObservedBackend
        from specpilot.loop.report import write_report
        from specpilot.memory.fingerprint import fingerprint_deployment

        j, dep = self.journal, self.deployment
        self.fp = fingerprint_deployment(dep, self.backend.device_name(), cache=self.memory)
        self.source = load_prompt_source(dep, self.options.prompt_source)
        self.controller = Controller(self.ccfg, ObservedBackend(self.backend, j), load_gate(self.options.gate),
                                     self.source, self.deployment_file)
        self.start = resume_point(self.paths, self.memory, self.fp.digest, dep.stock, self.checkout,
                                  self.options.resume)
        self._announce()
        self.setup = LoopSetup(dep, self.device, self.backend.device_name(), self.checkout, self.paths.scratch)
        self.enabled = tuple(a for a in self.agents if self._agent_on(a))
        self._patches_stored: bool | None = None  # the memory holds a patched candidate (`_final_may_patch`)
        self.seeds = self._seeds()
        self.lock.acquire()
        self._uncount_wait()
        self.session = shared_session(self.deployment_file, dep, self.devices[0])
        j.say(f"loaded {dep.name} in this process (profiles, the guard's scorer, the final benchmark)")
        self._noise(force=self.options.remeasure_noise)
        self.batches = profile_batches(self.source, dep, self.config)
        incumbent, outcomes, stop, cost = self._rounds()
        after, final, stop = self._finish(incumbent, cost, stop)
        files, report = write_report(self.paths, j, dep, self.fp, self.config, self.ccfg, self.noise, self.start,
                                     incumbent, after, final, stop, self.memory)
        j.emit(EventKind.REPORT, "wrote " + ", ".join(str(f) for f in files), 0, files=[str(f) for f in files])
        return LoopResult(self.paths, stop, incumbent, tuple(outcomes), report, tuple(files))

    def _announce(self) -> None:
        c, dep, start = self.config, self.deployment, self.start
        budget = f"budget {c.budget_minutes:g} min" if c.budget_minutes else "no time budget"
        self.journal.emit(
            EventKind.START, f"specpilot run: deployment {dep.name!r} [{self.fp.digest}] on "
            f"{self.backend.device_name()} ({len(self.devices)} device(s), {self.backend.placement.value}); "
            f"{c.rounds} round(s), {budget}, timing {c.timing.value}; report in {self.paths.out}\n{start.note}", 0,
            deployment=dep.name, deployment_file=self.deployment_file, fingerprint=self.fp.digest,
            device=self.backend.device_name(), devices=list(self.devices), placement=self.backend.placement.value,
            config=c.to_dict(), controller=self.ccfg.to_dict(), memory=str(self.memory.path),
            resumed=self.options.resume, incumbent=start.incumbent.name, incumbent_entry=start.incumbent.entry_id,
            next_round=start.next_round, rounds_done=start.rounds_done)

    def _finish(self, incumbent: Incumbent, cost, stop: StopReason):
        """After the rounds: the final system's cost table (the report's "after"; `cost` when the
        rounds measured it) and the final measurement, each only when it fits in the budget's time
        left; returns (after, final, stop)."""
        j, after, final = self.journal, cost, None
        if stop is StopReason.INTERRUPTED:
            return after, final, stop
        try:
            if after is None and self.budget.fits(self.measure_s + self.reserve):
                try:  # the final system's cost table, for the report; the final runs without it
                    after = self._measure_timed(incumbent.candidate)
                except SpecPilotError as err:
                    j.emit(EventKind.STOP, f"measuring the final system's cost table failed: {err}", 0,
                           reason=stop.value, error=str(err))
            elif after is None:
                j.say(f"budget: no time left to measure the final system's cost table (~{self.measure_s:.0f} s"
                      f"{' before the final measurement' if self.config.final else ''}): the report goes without "
                      "its gaps after the run")
            if self.config.final and self._final_fits(incumbent, after, stop):
                final = self._final(incumbent)
        except KeyboardInterrupt:
            stop = StopReason.INTERRUPTED
            j.emit(EventKind.STOP, "interrupted during the final measurement: writing the report without it",
                   0, reason=stop.value)
        except SpecPilotError as err:
            j.emit(EventKind.STOP, f"the final measurement failed: {err}", 0, reason=stop.value, error=str(err))
        return after, final, stop

    def _uncount_wait(self) -> None:
        """Take the wait for another run's timing lock off the budget's clock (`--wait-minutes`
        bounds the wait, `--budget-minutes` the work), and say so when there was one."""
        waited = self.lock.waited_s
        if self.budget.seconds is None or waited <= 0:
            return
        self.budget = Budget(self.budget.left() + waited)  # from now: the budget less the work before the wait
        self.journal.say(waited_line(waited, self.budget.left(), self.config.budget_s))

    def _final_fits(self, incumbent: Incumbent, after, stop: StopReason) -> bool:
        """Whether the final measurement fits in the budget's time left (estimated from the final
        system's cost table when there is one, else the last round's estimate); a line when it does not."""
        from specpilot.loop.final import bench_config

        c = self.config
        if after is not None:
            bench = bench_config(self.deployment, c.final_prompts, c.final_tokens, c.seed)
            self.reserve = final_seconds(after, bench, self.deployment.regime.batch, self.device,
                                         self._final_may_patch(incumbent))
        if self.budget.fits(self.reserve):
            return True
        self.journal.emit(EventKind.STOP, f"skipping the final measurement (~{self.reserve:.0f} s): it would not fit "
                          f"in the {max(0.0, self.budget.left()):.0f} s left of the budget", 0, reason=stop.value,
                          error=f"the final measurement (~{self.reserve:.0f} s) did not fit in the budget's time left",
                          final_estimate_s=self.reserve, left_s=self.budget.left())
        return False

    def _measure_timed(self, c: Candidate):
        """`measure(c)`, remembering the longest time one took (what the budget expects the next to take)."""
        t0 = time.monotonic()
        cost = self.measure(c)
        self.measure_s = max(self.measure_s, time.monotonic() - t0)
        return cost

    def _seeds(self) -> tuple:
        """Proposals rebuilt from similar deployments' validated systems; each seed is a journal line."""
        from specpilot.loop.seeds import find_seeds

        seeds = find_seeds(self.memory, self.fp, self.deployment.stock, self.checkout, self.paths.scratch)
        for seed in seeds:
            self.journal.emit(EventKind.SEED, seed.line(), 0, **seed.to_dict())
        return tuple(s.proposal for s in seeds if s.proposal is not None)

    def _agent_on(self, agent) -> bool:
        """Ask the agent once whether it can run here; log the answer (and why it is off)."""
        status = agent.status(self.setup)
        self.journal.emit(EventKind.AGENT, f"agent {agent.name}: {'on' if status.enabled else 'off'}"
                          + (f" - {status.reason}" if status.reason else ""), 0, agent=agent.name,
                          enabled=status.enabled, reason=status.reason)
        return status.enabled

    def _noise(self, now=None, index: int = 0, force: bool = False) -> None:
        """The noise floor: from the memory when one was measured under a load comparable to `now`
        (default: read now), else measured now (stock against a copy of stock) and stored with its load."""
        from specpilot.control.stats import NoiseFloor
        from specpilot.memory.evaluate import reusable_noise

        stored, costs, note = None, None, "measured now; asked to measure it again (--remeasure-noise)"
        on = ""  # how many request pairs the A/A compared on saturated stretches, when measured now
        if not force:
            stored, note = reusable_noise(self.memory, self.fp, self.controller.procedure,
                                          now or self.lock.current())
        if stored is not None:
            self.noise_id, self.noise, self.noise_load = stored.id, stored.noise, stored.load
        else:
            if index == 0 and self.budget.seconds is not None:
                self.journal.say(f"budget: {self.budget.left():.0f} s left; the noise floor is measured first, "
                                 "which the budget cannot shorten; what fits after it is said before the first round")
            with self.lock.window() as w:
                aa = self.controller.stock_vs_stock(self.stock.runner_spec(self.deployment_file, self.options.runner))
            self.noise, costs, self.noise_load = NoiseFloor(aa.estimate, self.controller.procedure), aa.costs, w.load
            self.noise_id = self.memory.record_noise(self.fp, self.noise, w.load)
            note += f" ({w.load.describe()})"
            sat, pairs = aa.saturated
            on = f", {sat}/{pairs} request pairs on saturated stretches" if sat else ""
        self.per_evaluation = evaluation_seconds(costs, self.ccfg, self.memory, self.fp.digest, self.device)
        est, threshold = self.noise.estimate, promotion_threshold(self.ccfg, self.noise)
        self.journal.emit(
            EventKind.NOISE, f"noise floor {self.noise.value:.2%} ({'measured now' if costs else 'from the memory'}, "
            f"stock vs stock {est.gain:+.2%} [{est.lower:+.2%}, {est.upper:+.2%}] over {est.n} blocks{on}); promotion "
            f"threshold {threshold:.2%} = {self.ccfg.min_gain:.0%} + {self.ccfg.noise_multiplier:g} x noise\n"
            f"  {note}", index, noise=self.noise.to_dict(), noise_id=self.noise_id, measured=costs is not None,
            threshold=threshold, load=self.noise_load.to_dict(), why=note)

    def _noise_for_round(self, index: int) -> tuple:
        """The noise floor round `index` judges its candidates by, and its memory id
        (`RoundInputs.choose_noise`): chosen again first where the load changed (`_check_load`)."""
        self._check_load(index)
        return self.noise, self.noise_id

    def _check_load(self, index: int) -> None:
        """Before a round times its candidates: take the timing lock if it came free, and choose the
        noise floor again when the load now (the last round's) is not comparable to the one it was
        measured under."""
        was_held = self.lock.held
        now = self.lock.current() if self.lock.try_acquire() and not was_held else self.last_load
        if now is None or (now.contended and self.noise_load.contended):
            return  # nothing timed yet, or still contended as the floor was
        why = not_comparable(self.noise_load, now)
        if why is None:
            return
        if not self.budget.fits(self.per_evaluation):
            self.journal.say(f"round {index}: the load changed since the noise floor was measured ({why}); "
                             "no time left to choose it again: keeping it")
            return
        self.journal.say(f"round {index}: the load changed since the noise floor was measured ({why}): "
                         "choosing it again")
        self._noise(now, index)

    def measure(self, c: Candidate):
        """The cost table of `c`: in this process, or from its worktree when it carries a patch."""
        if c.patch:
            return measure_in_worktree(c.workdir, self.deployment_file, c.system, self.batches,
                                       self.config.profile_tokens, str(self.session.device))
        return measure(self.session, c.system, self.batches, self.config.profile_tokens)

    def _final_may_patch(self, incumbent) -> bool:
        """Whether the final system may carry a patch (then it is benched in a process of its own):
        the incumbent has one, the coding agent is on, or the memory holds a patched candidate that
        the integration or seeding could bring back."""
        if self._patches_stored is None:
            self._patches_stored = any(r.candidate.patch for r in self.memory.entries())
        return (incumbent.candidate.patch is not None or self._patches_stored
                or any(a.name == "coding" for a in self.enabled))

    def _rounds(self):
        from specpilot.loop.final import bench_config

        c, j = self.config, self.journal
        incumbent, outcomes, history, idle = self.start.incumbent, [], [], 0
        index, done, cost, stop = self.start.next_round, self.start.rounds_done, None, StopReason.ROUNDS
        bench = bench_config(self.deployment, c.final_prompts, c.final_tokens, c.seed)
        try:
            while done < c.rounds:
                if cost is None and outcomes and not self.budget.fits(self.measure_s + self.reserve):
                    stop = StopReason.BUDGET  # a promoted incumbent's cost table comes first: it does not fit
                    final_text = f" and the final measurement (~{self.reserve:.0f} s)" if c.final else ""
                    j.emit(EventKind.STOP, f"stopping: measuring the new incumbent (~{self.measure_s:.0f} s) for round "
                           f"{index}{final_text} would not fit in the {self.budget.left():.0f} s left", index,
                           reason=stop.value, measure_estimate_s=self.measure_s, final_estimate_s=self.reserve,
                           left_s=self.budget.left())
                    break
                cost = cost or self._measure_timed(incumbent.candidate)
                past = [o.seconds for o in outcomes if not o.nothing_new]
                estimate = round_seconds(past, self.per_evaluation, c.max_candidates, self.backend.parallelism)
                reserve = (final_seconds(cost, bench, self.deployment.regime.batch, self.device,
                                         self._final_may_patch(incumbent)) if c.final else 0.0)
                self.reserve = reserve
                final_text = f" and the final measurement (~{reserve:.0f} s)" if c.final else ""
                if not outcomes and self.budget.seconds is None:
                    total_min = ((c.rounds - done) * estimate + reserve) / 60
                    j.say(f"no time budget: {c.rounds - done} round(s) of ~{estimate:.0f} s{final_text}, about "
                          f"{total_min:.1f} min (estimated from the noise measurement)")
                candidates = c.max_candidates
                if not self.budget.fits(estimate + reserve):
                    candidates = fitting_candidates(past, self.per_evaluation, c.max_candidates,
                                                    self.backend.parallelism, self.budget.left() - reserve)
                if not outcomes and self.budget.seconds is not None:  # what fits, said before the first round
                    j.say(plan_line(self.budget.left(), c.rounds - done, estimate, reserve if c.final else None,
                                    candidates, c.max_candidates))
                if 0 < candidates < c.max_candidates:
                    j.say(f"round {index}: {candidates} candidate(s) instead of {c.max_candidates}: a full round "
                          f"(~{estimate:.0f} s){final_text} would not fit in the {self.budget.left():.0f} s left")
                if not candidates:
                    stop = StopReason.BUDGET
                    j.emit(EventKind.STOP, f"stopping: round {index} (~{estimate:.0f} s){final_text} would not fit "
                           f"in the {self.budget.left():.0f} s left", index,
                           reason=stop.value, round_estimate_s=estimate, final_estimate_s=reserve,
                           left_s=self.budget.left())
                    break
                with self.lock.window() as window:
                    outcome = run_round(RoundInputs(
                        index, round_label(self.paths.run_id, index), self.setup, incumbent, self.stock, self.enabled,
                        self.controller, self.ccfg, self.noise, self.noise_id, self.memory, self.fp,
                        self.deployment_file, self.options.runner, candidates, self.measure, self.session, cost,
                        tuple(history), c.seed, self.seeds if not outcomes else (), c.slots,
                        lambda i=index: self._noise_for_round(i)), j)
                self.last_load = window.load
                self.memory.tag_load([x.entry_id for x in outcome.evaluated], window.load)
                if window.load.contended and outcome.evaluated:
                    j.say(f"round {index} was timed under contention ({window.load.describe()}): its verdicts are "
                          "stored as contended, and later rounds and runs do not take them as final")
                history.append((outcome.incumbent_before.candidate.system, outcome.cost))
                outcomes.append(outcome)
                done, index = done + 1, index + 1
                cost = None if outcome.promoted else outcome.cost
                incumbent = outcome.incumbent_after
                idle = idle + 1 if outcome.nothing_new else 0
                if idle >= c.patience:
                    stop = StopReason.CONVERGED
                    j.emit(EventKind.STOP, f"stopping: {idle} round(s) in a row with nothing new to time", index - 1,
                           reason=stop.value)
                    break
            else:
                j.emit(EventKind.STOP, f"stopping: {done} round(s) done", index - 1, reason=stop.value)
        except KeyboardInterrupt:
            stop = StopReason.INTERRUPTED
            j.emit(EventKind.STOP, "interrupted: writing the report without the final benchmark", index,
                   reason=stop.value)
        except SpecPilotError as err:  # e.g. the incumbent's workers failed: nothing can be compared
            stop = StopReason.ERROR
            j.emit(EventKind.STOP, f"stopping: round {index} failed: {err}", index, reason=stop.value, error=str(err))
        return incumbent, outcomes, stop, cost

    def _final(self, incumbent: Incumbent):
        from specpilot.loop.final import bench_config, describe_config, measure_final, serving_line
        from specpilot.loop.report import format_speedup

        c = self.config
        cfg = bench_config(self.deployment, c.final_prompts, c.final_tokens, c.seed)
        also = "" if incumbent.candidate.hash == self.stock.hash else f" and {incumbent.name!r}"
        self.journal.say(f"final measurement: AR, stock{also} {describe_config(cfg)}")
        final = measure_final(self.session, self.deployment, self.deployment_file, self.stock, incumbent.candidate,
                              cfg, self.paths.scratch)
        s, f, g = final.stock_speedup, final.final_speedup, final.final_gain
        over = f"; final / stock {format_speedup(g)}" if g else " (the final system is stock)"
        rates = f"\n  {serving_line(final.to_dict())}" if final.serving else ""
        note = f"\n  note: {final.note}" if final.note else ""
        self.journal.emit(EventKind.FINAL, f"speedup over AR (same run, 95% intervals): stock {format_speedup(s)}; "
                          f"final {format_speedup(f)}{over}{rates}{note}", 0, stock_speedup=s, final_speedup=f,
                          final_gain=g, regime="serving" if final.serving else "batch", note=final.note,
                          seconds=final.seconds)
        return final


def profile_batches(source, deployment, config: LoopConfig) -> list[list[list[int]]]:
    """`profile_batches` batches of the regime's size from the controller's prompt source (own stream)."""
    b = deployment.regime.batch
    prompts = source(config.profile_batches * b, derived_seed(config.seed, "prompts", "loop-profile", 0))
    return [prompts[i : i + b] for i in range(0, len(prompts), b)]


def shared_session(deployment_file: str, deployment, device: str):
    """The loop's loaded models. The guard gate scores on a session it caches per (deployment, None)
    (its requests carry unplaced specs), on the default device; when that is the loop's device too,
    the loop uses that very session, so this process holds one copy of the models, not two."""
    from specpilot import env
    from specpilot.engine.session import Session
    from specpilot.guard.gate import cached_session as guard_session

    default = env.default_device()
    if device == str(default) or (default.type == "cuda" and device == "cuda:0" and default.index in (None, 0)):
        return guard_session(deployment_file, None)
    return Session.load(deployment, device=device)
