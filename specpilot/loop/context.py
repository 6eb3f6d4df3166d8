"""What a loop run fixes before its first round, set up once: `RunContext`, built by `open_run`.

    open     the deployment, the devices, the controller's settings, the agents; the memory (first: a
             refused memory leaves no directory behind), the run's directories and journal, the
             package's checkout, the evaluation backend, the timing lock; torch single-threaded on
             a CPU (as the workers, `runner.py`); from then on a Ctrl-C is acknowledged at once
             (`interrupt.py`)
    setup    fingerprint the deployment, build the controller (the backend observed for progress,
             the token-forcing gate, the benchmark prompt source), find where the run starts
             (`state.resume_point`), say so, ask each agent once whether it is on, rebuild the seeds
             of similar deployments (`seeds.py`), take the timing lock (its wait is not counted by
             the budget), load the models in this process (profiles, the guard's scorer, the final
             benchmark: one copy, shared with the guard)
What changes from round to round is not here: `rounds.RoundState`. The resources (the memory, the
backend, the lock, the worktrees under the scratch directory) are closed by the `ExitStack` given
to `open_run`.

Owns: `RunOptions`, `RunContext`, `open_run`, the loaded session and the profile batches. Does not
own the steps that use them (`run.py`, `rounds.py`, `noise.py`).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from specpilot.config import Deployment, load_deployment
from specpilot.control.config import ControllerConfig
from specpilot.control.gate import DEFAULT_GATE, load_gate
from specpilot.control.load import LoadProbe
from specpilot.control.prompts import DEFAULT_PROMPT_SOURCE, derived_seed, load_prompt_source
from specpilot.control.timing_lock import DEFAULT_WAIT_S, TimingLock
from specpilot.loop.agents.base import AgentOptions, LoopSetup, Proposal, Proposer, make_proposers
from specpilot.loop.budget import Budget
from specpilot.loop.config import LoopConfig, controller_config
from specpilot.loop.cost_model import CostTable
from specpilot.loop.interrupt import acknowledged_interrupts
from specpilot.loop.journal import Journal
from specpilot.loop.measure import measure, measure_in_worktree
from specpilot.loop.reporter import Reporter
from specpilot.loop.runner import CPU_THREADS, LOOP_RUNNER
from specpilot.loop.state import ResumePoint, RunPaths, prepare_run, resume_point, round_label
from specpilot.loop.systems import Candidate, Incumbent
from specpilot.loop.worktree import Checkout, package_checkout, remove
from specpilot.memory.fingerprint import DeploymentFingerprint
from specpilot.memory.store import Memory

if TYPE_CHECKING:
    from specpilot.control.backends.local import LocalBackend
    from specpilot.control.controller import Controller
    from specpilot.engine.session import Session


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
class RunContext:
    """Everything a run fixes before its first round (see the module docstring)."""

    config: LoopConfig
    options: RunOptions
    deployment_file: str  # what workers load
    deployment: Deployment
    devices: tuple[str, ...]
    device: str  # "cuda" or "cpu": the kind of `devices`
    controller_config: ControllerConfig
    budget: Budget  # started with the run, less any wait for the timing lock
    memory: Memory
    paths: RunPaths
    journal: Journal
    backend: LocalBackend
    lock: TimingLock
    checkout: Checkout | None  # the baseline of the worktrees; None outside a git checkout
    fingerprint: DeploymentFingerprint
    controller: Controller  # its backend observed for progress (`progress.py`)
    start: ResumePoint  # the incumbent and the round numbering the run starts from
    setup: LoopSetup  # what the agents are told about the run
    stock: Candidate
    agents: tuple[Proposer, ...]  # the enabled ones
    seeds: tuple[Proposal, ...]  # systems validated on similar deployments, timed first in the first round
    session: Session  # the loaded models, shared with the guard
    batches: list[list[list[int]]]  # the prompts a cost table is profiled on
    patches_stored: bool  # the memory held a patched candidate when the run began (`final_may_patch`)

    @property
    def report(self) -> Reporter:
        """The journal's text (`reporter.py`)."""
        return Reporter(self.journal)

    def round_label(self, index: int) -> str:
        return round_label(self.paths.run_id, index)

    def measure(self, c: Candidate) -> CostTable:
        """The cost table of `c`: in this process, or from its worktree when it carries a patch."""
        if c.patch:
            return measure_in_worktree(c.workdir, self.deployment_file, c.system, self.batches,
                                       self.config.profile_tokens, str(self.session.device))
        return measure(self.session, c.system, self.batches, self.config.profile_tokens)

    @property
    def bench(self):
        """The final measurement's settings (`final.bench_config`)."""
        from specpilot.loop.final import bench_config

        c = self.config
        return bench_config(self.deployment, c.final_prompts, c.final_tokens, c.seed)

    @property
    def heldout_bench(self):
        """The final measurement's held-out run's settings (`final.heldout_config`; None: none)."""
        from specpilot.loop.final import heldout_config

        return heldout_config(self.bench, self.config.final_heldout_prompts)

    def final_may_patch(self, incumbent: Incumbent) -> bool:
        """Whether the final system may carry a patch (then it is benched in a process of its own):
        the incumbent has one, the coding agent is on, or the memory holds a patched candidate that
        the integration or seeding could bring back."""
        return (incumbent.candidate.patch is not None or self.patches_stored
                or any(a.name == "coding" for a in self.agents))


def open_run(config: LoopConfig, options: RunOptions, stream: TextIO | None, probe: LoadProbe | None,
             stack: ExitStack) -> RunContext:
    """Open and set up the run (see the module docstring); what it opens, `stack` closes. `probe`
    reads the machine's load (default: /proc)."""
    import torch

    from specpilot.control.backends.local import LocalBackend, visible_devices
    from specpilot.control.controller import Controller
    from specpilot.loop.progress import ObservedBackend
    from specpilot.memory.fingerprint import fingerprint_deployment

    budget = Budget(config.budget_s)
    deployment_file = options.deployment or "fixture"
    dep = load_deployment(deployment_file)
    devices = tuple(options.devices or visible_devices())
    device = "cuda" if devices[0].startswith("cuda") else "cpu"
    ccfg = controller_config(config, dep)
    proposers = make_proposers(config.agents, AgentOptions(
        config.coding_command, config.coding_timeout_s, config.coding_agents, config.kernel_budget_s))
    memory = Memory(options.memory)  # before any directory: a refused memory leaves none behind
    stack.callback(memory.close)
    paths = prepare_run(options.out, dep.name, options.resume)
    journal = Journal(paths.journal, stream, quiet=options.quiet)
    report = Reporter(journal)
    root = package_checkout()
    checkout = Checkout.capture(root) if root else None
    stack.callback(remove_worktrees, checkout, paths.scratch)  # after the backend's workers are gone
    backend = LocalBackend(devices=list(devices), placement=ccfg.placement)
    stack.callback(backend.close)
    lock = TimingLock(devices, memory.path, wait_s=options.wait_s, say=journal.say, probe=probe)
    stack.callback(lock.release)
    if device == "cpu":
        torch.set_num_threads(CPU_THREADS)  # the caller restores it
    stack.enter_context(acknowledged_interrupts(journal.acknowledge))

    fp = fingerprint_deployment(dep, backend.device_name(), cache=memory)
    source = load_prompt_source(dep, options.prompt_source)
    controller = Controller(ccfg, ObservedBackend(backend, journal), load_gate(options.gate), source,
                            deployment_file)
    start = resume_point(paths, memory, fp.digest, dep.stock, checkout, options.resume)
    report.start(config=config, deployment_file=deployment_file, deployment=dep, fingerprint=fp, backend=backend,
                 devices=devices, paths=paths, controller_config=ccfg, memory=memory, resumed=options.resume,
                 start=start)
    setup = LoopSetup(dep, device, backend.device_name(), checkout, paths.scratch)
    agents = tuple(a for a in proposers if agent_on(a, setup, report))
    seeds = offered_seeds(memory, fp, dep, checkout, paths, report)
    lock.acquire()
    budget = uncount_wait(budget, lock, report, config.budget_s)
    session = shared_session(deployment_file, dep, devices[0])
    report.loaded(dep.name)
    return RunContext(
        config=config, options=options, deployment_file=deployment_file, deployment=dep, devices=devices,
        device=device, controller_config=ccfg, budget=budget, memory=memory, paths=paths, journal=journal,
        backend=backend, lock=lock, checkout=checkout, fingerprint=fp, controller=controller, start=start,
        setup=setup, stock=Candidate(dep.stock), agents=agents, seeds=seeds, session=session,
        batches=profile_batches(source, dep, config),
        patches_stored=config.final and holds_patches(memory))


def holds_patches(memory: Memory) -> bool:
    """Whether the memory holds a patched candidate (read once, as the run opens)."""
    return any(r.candidate.patch for r in memory.entries())


def agent_on(agent: Proposer, setup: LoopSetup, report: Reporter) -> bool:
    """Ask the agent once whether it can run here; log the answer (and why it is off)."""
    status = agent.status(setup)
    report.agent(agent.name, status)
    return status.enabled


def offered_seeds(memory: Memory, fp: DeploymentFingerprint, deployment: Deployment, checkout: Checkout | None,
                  paths: RunPaths, report: Reporter) -> tuple[Proposal, ...]:
    """Proposals rebuilt from similar deployments' validated systems; each seed is a journal line."""
    from specpilot.loop import seeds as loop_seeds

    seeds = loop_seeds.find_seeds(memory, fp, deployment.stock, checkout, paths.scratch)
    for seed in seeds:
        report.seed(seed)
    return tuple(s.proposal for s in seeds if s.proposal is not None)


def uncount_wait(budget: Budget, lock: TimingLock, report: Reporter, budget_s: float | None) -> Budget:
    """The budget with the wait for another run's timing lock taken off its clock (`--wait-minutes`
    bounds the wait, `--budget-minutes` the work), said when there was one."""
    waited = lock.waited_s
    if budget.seconds is None or waited <= 0:
        return budget
    budget = Budget(budget.left() + waited)  # from now: the budget less the work before the wait
    report.waited(waited, budget.left(), budget_s)
    return budget


def remove_worktrees(checkout: Checkout | None, scratch) -> None:
    """Remove the worktrees left in the run's scratch directory."""
    if checkout is None:
        return
    for path in sorted(scratch.iterdir()):
        if path.is_dir() and (path / ".git").exists():
            remove(checkout.root, path)


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
