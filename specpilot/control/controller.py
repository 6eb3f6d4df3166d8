"""`Controller`: decides whether a candidate system is really faster than the incumbent.

One comparison (`evaluate`):
    1. open a pair session (isolated workers for both arms, built and warmed on their own prompts);
    2. gate: both arms generate the cheap subset untimed; the guard gate judges the candidate's
       tokens; a failure rejects it untimed (`Reason.GUARD_FAILED`), whatever its speed;
    3. run `warmup_blocks` paired blocks and discard them;
    4. time paired blocks look by look (`rule.run_sequential`) until promote / reject, or the
       pre-declared extra-block budget is spent (need more data);
    5. outputs: malformed -> reject; materially shorter than the incumbent's -> reject.
A failing candidate worker is a rejection; a failing incumbent is an error.

A round (`evaluate_round`) screens several candidates against one incumbent (concurrently, as the
backend allows; same prompts block for block), corrects their p-values for multiplicity (Holm by
default), and re-measures the significant candidate with the largest gain on fresh blocks with a
fresh session; the re-measured evaluation decides and is the one returned (screening attached).
When no candidate survives the correction but some cleared the threshold on their own, the one
with the largest gain is re-measured all the same: screening then only *selects* it, and the
re-measure on independent blocks tests that one hypothesis at the rule's level, so the round still
promotes a null candidate with probability at most alpha (a two-stage select-then-confirm design).

The noise floor (`measure_noise`) is stock against a second copy of stock, same procedure.

Owns: the order of these steps and `Evaluation` / `RoundResult`. Does not own the statistics,
the rule, processes or the memory (`evaluate.py` ties the controller to the memory).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Sequence

from specpilot.control.backends.base import Backend
from specpilot.control.blocks import Arm, BlockResult, plan_block
from specpilot.control.config import ControllerConfig, Placement, Stage
from specpilot.control.gate import Gate, GateRequest, GateResult
from specpilot.control.multiplicity import adjust
from specpilot.control.outputs import EMPTY_COMPARISON, OutputComparison
from specpilot.control.prompts import PromptSource, draw
from specpilot.control.rule import Decision, Reason, Verdict, promotion_threshold, run_sequential
from specpilot.control.session import ArmFailure
from specpilot.control.spec import RunnerSpec
from specpilot.control.stats import GainEstimate, NoiseFloor
from specpilot.control.worker import FailureKind
from specpilot.errors import ConfigError, SpecPilotError

STREAMS = {Stage.SINGLE: "timing", Stage.SCREEN: "timing", Stage.REMEASURE: "remeasure", Stage.NOISE: "noise"}


class EvaluationError(SpecPilotError):
    """The comparison could not be made (the incumbent or stock failed, or the gate is broken)."""


@dataclass(frozen=True)
class Costs:
    """Wall seconds of one evaluation, by step (what one paired evaluation costs)."""

    open: float = 0.0  # start, build and warm the workers
    gate: float = 0.0
    warmup_blocks: float = 0.0
    timed_blocks: float = 0.0
    total: float = 0.0
    blocks: int = 0  # timed blocks

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Evaluation:
    incumbent: RunnerSpec
    candidate: RunnerSpec
    stage: Stage
    placement: Placement
    decision: Decision
    noise: NoiseFloor | None  # None for the noise measurement itself
    gate: GateResult | None  # None when no gate ran (noise, or a worker failed first)
    estimate: GainEstimate | None  # None when never timed
    outputs: OutputComparison | None
    costs: Costs
    error: str = ""  # the failure, for rejections by WORKER_FAILED / BAD_OUTPUT
    adjusted_p: float | None = None  # after the round's multiplicity correction
    screening: "Evaluation | None" = None  # a re-measured winner's screening evaluation
    timings: tuple[dict, ...] = ()  # per timed block: request seconds of each arm (`BlockResult.timings`)

    @property
    def verdict(self) -> Verdict:
        return self.decision.verdict

    def to_dict(self) -> dict:
        return {
            "incumbent": self.incumbent.to_dict(),
            "candidate": self.candidate.to_dict(),
            "stage": self.stage.value,
            "placement": self.placement.value,
            "decision": self.decision.to_dict(),
            "noise": self.noise.to_dict() if self.noise else None,
            "gate": self.gate.to_dict() if self.gate else None,
            "estimate": self.estimate.to_dict() if self.estimate else None,
            "outputs": self.outputs.to_dict() if self.outputs else None,
            "costs": self.costs.to_dict(),
            "error": self.error,
            "adjusted_p": self.adjusted_p,
            "screening": self.screening.to_dict() if self.screening else None,
            "timings": list(self.timings),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Evaluation":
        def opt(kind, key):
            return kind.from_dict(d[key]) if d.get(key) else None

        return cls(RunnerSpec.from_dict(d["incumbent"]), RunnerSpec.from_dict(d["candidate"]), Stage(d["stage"]),
                   Placement(d["placement"]), Decision.from_dict(d["decision"]), opt(NoiseFloor, "noise"),
                   opt(GateResult, "gate"), opt(GainEstimate, "estimate"), opt(OutputComparison, "outputs"),
                   Costs(**d["costs"]), d.get("error", ""), d.get("adjusted_p"), opt(Evaluation, "screening"),
                   tuple(d.get("timings", ())))


@dataclass(frozen=True)
class RoundResult:
    evaluations: tuple[Evaluation, ...]  # final evaluation per candidate, in the order given
    winner: int | None  # index of the re-measured candidate (promoted only if its re-measure says so)

    @property
    def promoted(self) -> Evaluation | None:
        if self.winner is None:
            return None
        e = self.evaluations[self.winner]
        return e if e.verdict is Verdict.PROMOTE else None


class Controller:
    def __init__(self, config: ControllerConfig, backend: Backend, gate: Gate, prompt_source: PromptSource,
                 deployment: str):
        self.config = config
        self.backend = backend
        self.gate = gate
        self.prompt_source = prompt_source
        self.deployment = deployment
        self._gate_lock = threading.Lock()

    @property
    def procedure(self) -> str:
        return self.config.procedure_key(self.backend.placement)

    # ---- public ----------------------------------------------------------------------------
    def measure_noise(self, stock: RunnerSpec) -> NoiseFloor:
        """Stock against a second copy of stock (two fresh workers), `noise_blocks` blocks."""
        return NoiseFloor(self.stock_vs_stock(stock).estimate, self.procedure)

    def stock_vs_stock(self, stock: RunnerSpec) -> Evaluation:
        """The A/A evaluation behind `measure_noise` (with its costs and outputs, for reports)."""
        noise_config = replace(self.config, blocks=self.config.noise_blocks, extra_blocks=0)
        return self._compare(stock, stock, None, Stage.NOISE, noise_config)

    def evaluate(self, incumbent: RunnerSpec, candidate: RunnerSpec, noise: NoiseFloor) -> Evaluation:
        self._check_noise(noise)
        return self._compare(incumbent, candidate, noise, Stage.SINGLE, self.config)

    def evaluate_round(self, incumbent: RunnerSpec, candidates: Sequence[RunnerSpec], noise: NoiseFloor) -> RoundResult:
        """Screen all, correct for multiplicity, re-measure the winner on fresh blocks."""
        self._check_noise(noise)
        if not candidates:
            raise ConfigError("a round needs at least one candidate")
        if len(candidates) == 1:
            e = self.evaluate(incumbent, candidates[0], noise)
            return RoundResult((e,), 0 if e.estimate is not None else None)
        with ThreadPoolExecutor(max_workers=max(1, self.backend.parallelism)) as pool:
            screened = list(pool.map(lambda c: self._compare(incumbent, c, noise, Stage.SCREEN, self.config),
                                     candidates))
        timed = [i for i, e in enumerate(screened) if e.estimate is not None]
        adjusted = dict(zip(timed, adjust([screened[i].decision.p_value for i in timed], self.config.multiplicity)))
        final = [replace(e, adjusted_p=adjusted.get(i)) for i, e in enumerate(screened)]
        significant = [i for i in timed
                       if adjusted[i] <= self.config.alpha and screened[i].verdict is Verdict.PROMOTE]
        for i in timed:
            if screened[i].verdict is Verdict.PROMOTE and i not in significant:
                final[i] = replace(final[i], decision=final[i].decision.with_verdict(
                    Verdict.NEED_MORE_DATA, Reason.NOT_SIGNIFICANT))
        # Select among the significant ones; failing those, among those that cleared the threshold
        # alone (confirmed on fresh blocks below either way).
        pool = significant or [i for i in timed if screened[i].verdict is Verdict.PROMOTE]
        if not pool:
            return RoundResult(tuple(final), None)
        winner = max(pool, key=lambda i: screened[i].estimate.gain)
        for i in significant:
            if i != winner:
                decision = final[i].decision.with_verdict(Verdict.REJECT, Reason.NOT_SELECTED)
                final[i] = replace(final[i], decision=decision)
        again = self._compare(incumbent, candidates[winner], noise, Stage.REMEASURE, self.config,
                              gate_result=screened[winner].gate)
        final[winner] = replace(again, decision=again.decision.with_verdict(again.verdict, Reason.REMEASURED),
                                adjusted_p=adjusted[winner], screening=final[winner])
        return RoundResult(tuple(final), winner)

    # ---- one comparison ------------------------------------------------------------------------
    def _compare(self, incumbent: RunnerSpec, candidate: RunnerSpec, noise: NoiseFloor | None, stage: Stage,
                 config: ControllerConfig, gate_result: GateResult | None = None) -> Evaluation:
        trusted = stage is Stage.NOISE  # both arms are stock: any failure is an error
        threshold = promotion_threshold(config, noise) if noise is not None else float("nan")
        start = time.monotonic()
        marks = {}

        def result(decision, estimate=None, outputs=None, error="", gate=None, blocks=()) -> Evaluation:
            total = time.monotonic() - start
            costs = Costs(total=total, blocks=estimate.n if estimate else 0, **marks)
            return Evaluation(incumbent, candidate, stage, self.backend.placement, decision, noise,
                              gate, estimate, outputs, costs, error, timings=tuple(b.timings() for b in blocks))

        stream = STREAMS[stage]
        R = config.request_size
        warm = draw(self.prompt_source, config.warmup_requests * R, config.seed, f"{stream}-warmup-requests", 0)
        gate = gate_result
        try:
            session = self.backend.open(incumbent, candidate, config, [warm[i : i + R] for i in range(0, len(warm), R)])
        except ArmFailure as failure:
            return self._failed(failure, trusted, result, threshold, gate)
        marks["open"] = time.monotonic() - start
        try:
            if not trusted and gate is None:
                t = time.monotonic()
                gate = self._run_gate(session, incumbent, candidate, config)
                marks["gate"] = time.monotonic() - t
            if gate is not None and not gate.passed:
                return result(Decision.untimed(Verdict.REJECT, Reason.GUARD_FAILED, threshold), gate=gate)
            t = time.monotonic()
            for b in range(config.warmup_blocks):
                session.run_block(self._plan(config, f"{stream}-warmup", b))
            marks["warmup_blocks"] = time.monotonic() - t
            t = time.monotonic()
            blocks: list[BlockResult] = []

            def measure(first: int, count: int) -> list[float]:
                for b in range(first, first + count):
                    blocks.append(session.run_block(self._plan(config, stream, b)))
                return [r.log_ratio for r in blocks[first:]]

            if trusted:
                ratios = measure(0, config.blocks)
                estimate = GainEstimate(tuple(ratios), config.level, config.resamples, config.seed)
                decision = Decision(Verdict.NEED_MORE_DATA, (), threshold)  # a measurement, not a decision
            else:
                estimate, decision = run_sequential(measure, threshold, config)
            marks["timed_blocks"] = time.monotonic() - t
            outputs = sum((OutputComparison.of((o for phase in r.incumbent_outputs for o in phase),
                                               (o for phase in r.candidate_outputs for o in phase))
                           for r in blocks), EMPTY_COMPARISON)
            if not trusted and outputs.token_ratio < config.min_token_ratio:
                decision = decision.with_verdict(Verdict.REJECT, Reason.OUTPUTS_SHORTER)
            return result(decision, estimate, outputs, gate=gate, blocks=blocks)
        except ArmFailure as failure:
            return self._failed(failure, trusted, result, threshold, gate)
        finally:
            session.close()

    @staticmethod
    def _failed(failure: ArmFailure, trusted: bool, result, threshold: float, gate: GateResult | None) -> Evaluation:
        if trusted or failure.arm is Arm.INCUMBENT:
            raise EvaluationError(f"{'stock' if trusted else 'incumbent'} failed: {failure}") from None
        reason = Reason.BAD_OUTPUT if failure.kind is FailureKind.PROTOCOL else Reason.WORKER_FAILED
        return result(Decision.untimed(Verdict.REJECT, reason, threshold), error=str(failure), gate=gate)

    def _run_gate(self, session, incumbent: RunnerSpec, candidate: RunnerSpec, config: ControllerConfig) -> GateResult:
        prompts = draw(self.prompt_source, config.gate_prompts, config.seed, "gate", 0)
        cand = session.generate(Arm.CANDIDATE, prompts, config.max_new_tokens)
        inc = session.generate(Arm.INCUMBENT, prompts, config.max_new_tokens)
        request = GateRequest(self.deployment, incumbent, candidate, tuple(tuple(p) for p in prompts), cand, inc,
                              config.max_new_tokens)
        with self._gate_lock:  # the guard may hold a model; one judgement at a time
            verdict = self.gate(request)
        if not isinstance(verdict, GateResult):
            raise EvaluationError(f"the guard gate returned {type(verdict).__name__}, not a GateResult")
        return verdict

    def _plan(self, config: ControllerConfig, stream: str, index: int):
        prompts = draw(self.prompt_source, config.block_prompts, config.seed, stream, index)
        return plan_block(config, self.backend.placement, index, prompts, stream)

    def _check_noise(self, noise: NoiseFloor) -> None:
        if noise.procedure and noise.procedure != self.procedure:
            raise ConfigError("the noise floor was measured under another timing procedure; measure it again")
