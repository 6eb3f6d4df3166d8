"""Entry points that force outputs and then decide.

    gate(session_or_target, candidate, stock, config) -> Verdict
    stock_forcing(deployment, device, prompts, max_new_tokens, chunk) -> ForcingResult
    stock_sampled(deployment, device, prompts, seeds, max_new_tokens) -> records    (a sampled regime)

`gate` takes records or already-forced results on either side (force stock once, reuse it for
every candidate). `stock_forcing` generates *stock AR* outputs (the deployment's stock knobs, the
drafter off) in the process's cached session for that deployment and device, and forces them:
the baseline every candidate is scored against. The controller's adapter
(`specpilot.control.gate.controller_gate`) is built from these.

Does not own the decision rule (`verdict.py`) or forcing (`forcing.py`).
"""

from __future__ import annotations

import functools
from typing import Sequence

from specpilot.guard.config import GuardConfig
from specpilot.guard.forcing import ForcingResult, force
from specpilot.guard.records import OutputRecord, records_from_outputs
from specpilot.guard.verdict import Rule, Verdict, compare, pair_prompts


def _prompts_of(side: Sequence[OutputRecord] | ForcingResult) -> list[tuple[int, ...]]:
    return side.prompts if isinstance(side, ForcingResult) else [tuple(r.prompt_ids) for r in side]


def scorer_of(session_or_target):
    """The stock target: a Session's base model (never a kernel-swapped clone), or a Transformer."""
    return getattr(session_or_target, "target", session_or_target)


def gate(session_or_target, candidate: Sequence[OutputRecord] | ForcingResult,
         stock: Sequence[OutputRecord] | ForcingResult, config: GuardConfig = GuardConfig()) -> Verdict:
    """Force what needs forcing (on the stock target, `config.chunk` tokens per forward) and compare."""
    target = scorer_of(session_or_target)
    pair_prompts(_prompts_of(candidate), _prompts_of(stock), config.pairing)  # fail before forcing
    if not isinstance(candidate, ForcingResult):
        candidate = force(target, candidate, chunk=config.chunk)
    if not isinstance(stock, ForcingResult):
        stock = force(target, stock, chunk=config.chunk)
    return compare(candidate, stock, config)


@functools.lru_cache(maxsize=2)
def cached_session(deployment: str, device: str | None):
    """The scorer's loaded deployment, cached per process (the loop shares it: one copy of the models)."""
    from specpilot.config import load_deployment
    from specpilot.engine.session import Session

    return Session.load(load_deployment(deployment), device=device)


@functools.lru_cache(maxsize=4)
def stock_forcing(deployment: str, device: str | None, prompts: tuple[tuple[int, ...], ...], max_new_tokens: int,
                  chunk: int) -> ForcingResult:
    """Stock AR outputs for `prompts`, generated in batches of the deployment's regime, and forced."""
    session = cached_session(deployment, device)
    system = session.deployment.stock.plain_ar("stock-ar").with_changes(fault="")
    generator = session.generator(system)
    B = session.deployment.regime.batch
    ids = [list(p) for p in prompts]
    outputs: list[list[int]] = []
    for i in range(0, len(ids), B):
        outputs += generator.generate(ids[i : i + B], max_new_tokens).outputs
    return force(session.target, records_from_outputs(ids, outputs), chunk=chunk)


@functools.lru_cache(maxsize=4)
def stock_sampled(deployment: str, device: str | None, prompts: tuple[tuple[int, ...], ...], seeds: tuple[int, ...],
                  max_new_tokens: int) -> tuple[OutputRecord, ...]:
    """Stock AR outputs for `prompts` SAMPLED by the deployment regime's settings, prompt i with
    `seeds[i]`, in batches of the regime's size: the sampling guard's baseline (`sampled_forcing`)."""
    session = cached_session(deployment, device)
    regime = session.deployment.regime
    system = session.deployment.stock.plain_ar("stock-ar").with_changes(fault="")
    generator = session.generator(system)
    B = regime.batch
    ids = [list(p) for p in prompts]
    from specpilot.engine.runner import sampling_params

    params = [sampling_params(regime.sampling, int(s)) for s in seeds]
    outputs: list[list[int]] = []
    for i in range(0, len(ids), B):
        outputs += generator.generate(ids[i : i + B], max_new_tokens, sampling=params[i : i + B]).outputs
    return tuple(records_from_outputs(ids, outputs))


def rejection_reason(verdict: Verdict) -> str:
    """One line naming the violated rules and their numbers ('' when the verdict passed)."""
    parts = []
    for rule in verdict.violated:
        if rule is Rule.RATE:
            parts.append(f"mismatch rate {100 * verdict.candidate.rate:.2f}% vs stock {100 * verdict.stock.rate:.2f}%, "
                         f"bound {100 * verdict.bound:+.2f} pp vs margin {100 * verdict.rate_margin:.2f} pp")
        else:
            parts.append(f"{verdict.candidate.large_margin} large-margin mismatches (> {verdict.near_tie_nats:g} nats) "
                         f"vs stock {verdict.stock.large_margin}")
    return "token forcing: " + "; ".join(parts) if parts else ""
