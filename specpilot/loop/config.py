"""`LoopConfig`: every setting of one loop run, frozen, and the timing presets per device.

The loop's own settings (rounds, wall-clock budget, agents, candidates per round and how they
are shared among the agents (`SlotPolicy`), how the incumbent is profiled, how the final
measurement is sized, held-out prompts included) and the controller's (`ControllerConfig`, chosen
by a `Timing` preset and the deployment). The CLI's flags map onto these fields; `to_dict` goes into the report and the
journal.

Timing presets (how candidates are timed; the noise floor is measured once per deployment and
procedure and reused from the memory, so a preset's numbers are fixed, not adapted per run):

    quick      CPU default. 12 paired blocks of 3 requests x 32 new tokens (8 more when undecided),
               24 noise blocks. A CPU's request times vary by 7-8% even in one process on a quiet
               2-core VM, so the floor is several percent and only large gains clear the bar
               (1% + 2 x noise): the block counts buy it down.
    scaled     GPU default. 10 blocks of 2 requests x 128 new tokens (capped by the deployment's),
               12 noise blocks, up to 10 extra blocks in looks of 5. Under continuous batching a
               block is 1 request x 256 new tokens (`CONTINUOUS`): the same tokens per block, twice
               as far into each output. Acceptance grows along an output, and not equally for every
               drafter (EAGLE-3's more than the draft model's), so 128-token requests price a
               drafter switch short (`scripts/serving_lengths.sh` serves both lengths).
    standard   the controller's own defaults (`control.defaults.default_config`): 20 blocks x 4
               requests x the deployment's max_new_tokens, 30 noise blocks — for long runs.

Knob-only candidates are timed in the backend's persistent shared worker (no start-up per
candidate; `specpilot.control.shared`), code patches in fresh isolated workers.

Owns: `LoopConfig`, `Timing`, `SlotPolicy`, `StopReason`, `controller_config`, `for_device`. Does not own
what the numbers do (rounds, controller).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, replace

from specpilot.bench.stats import MIN_UNITS
from specpilot.config import Deployment
from specpilot.control.config import ControllerConfig
from specpilot.errors import ConfigError


class Timing(enum.Enum):
    QUICK = "quick"
    SCALED = "scaled"
    STANDARD = "standard"


class SlotPolicy(enum.Enum):
    GAPS = "gaps"  # slots split by the time the gaps each agent can close would save (`slots.py`)
    ROUND_ROBIN = "round-robin"  # every enabled agent proposes every round; slots taken round-robin


class StopReason(enum.Enum):
    ROUNDS = "rounds"  # the requested number of rounds ran
    BUDGET = "budget"  # the next round would not fit in the time left (the final report is reserved)
    CONVERGED = "converged"  # `patience` rounds in a row had nothing new to time
    INTERRUPTED = "interrupted"  # Ctrl-C: the report is still written
    ERROR = "error"  # a round could not be decided (the incumbent's workers failed, the gate broke)


@dataclass(frozen=True)
class LoopConfig:
    rounds: int = 2
    budget_minutes: float | None = None  # wall clock of the whole run, final measurement included
    agents: tuple[str, ...] = ("integration", "knob", "kernel", "coding")
    max_candidates: int = 3  # candidates timed per round (the controller screens them together)
    slots: SlotPolicy = SlotPolicy.GAPS  # how the candidates are shared among the agents
    timing: Timing = Timing.QUICK
    profile_batches: int = 5  # batches of the regime's size the incumbent is profiled on (drawn round-robin
    profile_tokens: int = 64  # over the benchmark sets: 5 batches of one prompt = one prompt of each set)
    final: bool = True  # measure stock and the final system against AR at the end
    final_prompts: int = MIN_UNITS  # per benchmark set (fewer: the final speedups have no interval)
    final_tokens: int = 64
    final_heldout_prompts: int = 8  # held-out prompts the final measurement adds (0 = none; `final.heldout_config`)
    patience: int = 2  # stop after this many rounds in a row with nothing new to time
    seed: int = 0
    coding_command: str | None = None
    coding_timeout_s: float = 1800.0
    coding_agents: int = 2  # coding-agent processes per round, in parallel (at most the coding agent's slots)
    kernel_budget_s: float = 60.0
    controller: dict = field(default_factory=dict)  # ControllerConfig fields laid over the timing preset

    def __post_init__(self):
        if self.rounds < 0:
            raise ConfigError(f"--rounds must be >= 0 (got {self.rounds})")
        if self.budget_minutes is not None and self.budget_minutes <= 0:
            raise ConfigError(f"--budget-minutes must be > 0 (got {self.budget_minutes})")
        if self.max_candidates < 1:
            raise ConfigError("--max-candidates must be >= 1")
        if self.coding_agents < 1:
            raise ConfigError(f"--coding-agents must be >= 1 (got {self.coding_agents})")
        for name in ("profile_batches", "profile_tokens", "final_prompts", "final_tokens", "patience"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.final_heldout_prompts < 0:
            raise ConfigError(f"final_heldout_prompts must be >= 0 (0 = no held-out run), "
                              f"got {self.final_heldout_prompts}")
        if self.final_prompts < MIN_UNITS:
            raise ConfigError(f"final_prompts must be >= {MIN_UNITS}: the final speedups' intervals need "
                              f"{MIN_UNITS} prompts per set (got {self.final_prompts})")

    @property
    def budget_s(self) -> float | None:
        return None if self.budget_minutes is None else self.budget_minutes * 60

    def to_dict(self) -> dict:
        d = asdict(self)
        d["agents"] = list(self.agents)
        d["timing"] = self.timing.value
        d["slots"] = self.slots.value
        d["controller"] = dict(self.controller)
        return d


BUDGET_ROUNDS = 50  # rounds of a run given a budget and no round count: the budget or convergence ends it first


def rounds_text(rounds: int) -> str:
    """How a run's round count reads: a number, or the budget's sizing (`BUDGET_ROUNDS`)."""
    return f"as many rounds as the budget fits (at most {rounds})" if rounds >= BUDGET_ROUNDS else f"{rounds} round(s)"


def for_device(device: str, **changes) -> LoopConfig:
    """Defaults sized for the device kind ("cpu" / "cuda"), then `changes` (None values ignored). A
    budget without a round count sizes the run by the budget: up to `BUDGET_ROUNDS` rounds, so the
    run ends when the next round and the final measurement no longer fit, or when it converges,
    not after the device's default count with the budget's time unused."""
    if device == "cuda":
        base = LoopConfig(rounds=3, timing=Timing.SCALED, profile_tokens=256, final_prompts=5, final_tokens=512)
    else:
        # no fixed budget: the run is sized by its rounds, and says up front what they should take
        base = LoopConfig(rounds=2, timing=Timing.QUICK, profile_tokens=48, final_prompts=5, final_tokens=64)
    if changes.get("budget_minutes") is not None and changes.get("rounds") is None:
        changes = {**changes, "rounds": BUDGET_ROUNDS}
    return replace(base, **{k: v for k, v in changes.items() if v is not None})


PRESETS = {
    Timing.STANDARD: {},
    Timing.SCALED: {"blocks": 10, "requests_per_block": 2, "max_new_tokens": 128, "noise_blocks": 12,
                    "extra_blocks": 10, "extra_step": 5},
    Timing.QUICK: {"blocks": 12, "requests_per_block": 3, "max_new_tokens": 32, "warmup_requests": 1,
                   "warmup_blocks": 1, "noise_blocks": 24, "extra_blocks": 8, "extra_step": 8, "gate_prompts": 4,
                   "resamples": 1999, "settle_seconds": 2.0},
}
# Laid over a preset when the deployment batches continuously (see the module docstring).
CONTINUOUS = {Timing.SCALED: {"requests_per_block": 1, "max_new_tokens": 256}}


def controller_config(config: LoopConfig, deployment: Deployment) -> ControllerConfig:
    """The controller's settings: the timing preset (see the module docstring) for the deployment's
    regime, its token budget capped by the deployment's, then `config.controller`."""
    from specpilot.control.defaults import default_config

    fields = dict(PRESETS[config.timing], seed=config.seed)
    if deployment.regime.continuous:
        fields.update(CONTINUOUS.get(config.timing, {}))
    if "max_new_tokens" in fields:
        fields["max_new_tokens"] = min(fields["max_new_tokens"], deployment.max_new_tokens)
    fields.update(config.controller)
    return default_config(deployment, **fields)
