"""The noise floor a run judges its candidates by: chosen before the first round, and chosen again
before a round times its candidates when the load changed.

    choose   from the memory when one was measured under a load comparable to now
             (`memory.evaluate.reusable_noise`), else measured now (stock against a copy of stock,
             in a window of the timing lock) and stored with its load; `--remeasure-noise` always
             measures it
    again    before a round times its candidates (`rounds.run_round` asks, so a round with nothing
             new to time measures nothing): the timing lock is taken if it came free, and the floor
             is chosen again when the load now (the last round's) is not comparable to the one it
             was measured under, unless the budget no longer holds one evaluation; a floor measured
             under contention is kept while the contention lasts

Owns: `NoiseChoice`, `choose_noise`, `noise_for_round`. Does not own the floor's statistics
(`control.stats`), comparing loads (`control.load`) or the journal's text (`reporter.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specpilot.control.load import Load, not_comparable
from specpilot.control.stats import NoiseFloor
from specpilot.loop.budget import evaluation_seconds

if TYPE_CHECKING:
    from specpilot.loop.context import RunContext
    from specpilot.loop.rounds import RoundState


@dataclass(frozen=True)
class NoiseChoice:
    """The noise floor in force and what came with it."""

    floor: NoiseFloor
    id: int | None  # its memory id
    load: Load | None  # the load it was measured under
    per_evaluation: float  # what one paired evaluation should cost (`budget.evaluation_seconds`)


def choose_noise(ctx: RunContext, now: Load | None = None, index: int = 0, force: bool = False) -> NoiseChoice:
    """The noise floor: from the memory when one was measured under a load comparable to `now`
    (default: read now), else measured now and stored with its load; `index` is the round it is
    chosen for (0: before the first)."""
    from specpilot.memory.evaluate import reusable_noise

    stored, costs, note = None, None, "measured now; asked to measure it again (--remeasure-noise)"
    saturated = (0, 0)  # request pairs compared on saturated stretches, when measured now
    if not force:
        stored, note = reusable_noise(ctx.memory, ctx.fingerprint, ctx.controller.procedure, now or ctx.lock.current())
    if stored is not None:
        floor, floor_id, load = stored.noise, stored.id, stored.load
    else:
        if index == 0 and ctx.budget.seconds is not None:
            ctx.report.noise_first(ctx.budget.left())
        with ctx.lock.window() as w:
            aa = ctx.controller.stock_vs_stock(ctx.stock.runner_spec(ctx.deployment_file, ctx.options.runner))
        floor, costs, load = NoiseFloor(aa.estimate, ctx.controller.procedure), aa.costs, w.load
        floor_id = ctx.memory.record_noise(ctx.fingerprint, floor, load)
        note += f" ({load.describe()})"
        saturated = aa.saturated
    per_evaluation = evaluation_seconds(costs, ctx.controller_config, ctx.memory, ctx.fingerprint.digest, ctx.device)
    choice = NoiseChoice(floor=floor, id=floor_id, load=load, per_evaluation=per_evaluation)
    ctx.report.noise(choice, ctx.controller_config, measured=costs is not None, note=note, saturated=saturated,
                     index=index)
    return choice


def noise_for_round(ctx: RunContext, state: RoundState) -> NoiseChoice:
    """The noise floor round `state.index` judges its candidates by: `state.noise`, or chosen again
    (`choose_noise`) when the load changed since it was measured (see the module docstring)."""
    noise, index = state.noise, state.index
    was_held = ctx.lock.held
    now = ctx.lock.current() if ctx.lock.try_acquire() and not was_held else state.last_load
    if now is None or (now.contended and noise.load.contended):
        return noise  # nothing timed yet, or still contended as the floor was
    why = not_comparable(noise.load, now)
    if why is None:
        return noise
    if not ctx.budget.fits(noise.per_evaluation):
        ctx.report.load_changed(index, why, keeping=True)
        return noise
    ctx.report.load_changed(index, why, keeping=False)
    return choose_noise(ctx, now, index)
