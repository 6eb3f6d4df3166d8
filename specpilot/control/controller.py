"""`Controller`: decides whether a candidate system is really faster than the incumbent.

One comparison (`evaluate`):
    1. open a worker pair (isolated workers for both arms, built and warmed on their own prompts);
    2. gate: both arms generate the cheap subset untimed; the guard gate judges the candidate's
       tokens; a failure rejects it untimed (`Reason.GUARD_FAILED`), whatever its speed;
    3. run `warmup_blocks` paired blocks and discard them;
    4. time paired blocks look by look (`rule.run_sequential`) until promote / reject, or the
       pre-declared extra-block budget is spent (need more data); a block whose process census is
       void (a foreign process took CPU or GPU time during it, `census.py`) is run again, and after
       `MAX_VOID_BLOCKS` void blocks the evaluation is void (need more data, `Reason.CONTAMINATED`);
    5. outputs: malformed -> reject; materially shorter than the incumbent's -> reject;
    6. unless rejected: the gate token-forces a sample of the timed outputs (`FORCED_REQUESTS`
       requests, drawn after timing); a failure rejects (`Reason.GUARD_FAILED`).
A failing candidate worker is a rejection; a failing incumbent is an error.

The gate's prompts are drawn afresh for every evaluation, from a stream keyed by the candidate's
fingerprint and how many times this controller has evaluated it (`Evaluation.draw`): a candidate
cannot be lossless on one fixed set and lossy elsewhere, and a run is still reproducible. The
sample of timed outputs is seeded by that key and the controller's measured request times, which
the candidate cannot know in advance.

A round (`evaluate_round`) screens several candidates against one incumbent (concurrently, as the
backend allows; same prompts block for block), corrects their p-values for multiplicity (Holm by
default), and re-measures the significant candidate with the largest gain on fresh blocks with a
fresh session; the re-measured evaluation decides and is the one returned (screening attached).
A candidate may be given a power factor (`ControllerConfig.powered`): its screening and
re-measurement time that many times the blocks at every look, with the same looks and the same
alpha per look, an independent test like any other (the loop retimes an undecided candidate so).
When no candidate survives the correction but some cleared the threshold on their own, the one
with the largest gain is re-measured all the same: screening then only *selects* it, and the
re-measure on independent blocks tests that one hypothesis at the rule's level, so the round still
promotes a null candidate with probability at most alpha (a two-stage select-then-confirm design).
A re-measure that disqualifies its candidate (`rule.DISQUALIFYING`: the timed outputs fail the
guard, the worker dies) tests nothing about speed, so the next candidate by screened gain is
re-measured in its place; a re-measure that merely does not confirm ends the round.

The noise floor (`measure_noise`) is stock against a second copy of stock, same procedure.

Under a sampled regime (`ControllerConfig.sampled`) every prompt the arms decode carries a seed:
a block's from its plan (`blocks.request_seeds`: stream, block index and position), the gate's from
its draw key; both arms get the same seeds, and the gate hears them (`GateRequest.seeds`).

Owns: the order of these steps and `Evaluation` / `RoundResult`. Does not own the statistics,
the rule, processes or the memory (`specpilot.memory.evaluate` ties the controller to it).
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Sequence

from specpilot.control.backends.base import Backend
from specpilot.control.blocks import Arm, BlockResult, derived_seed, plan_block, request_seeds, saturated_pairs
from specpilot.control.census import BlockCensus, CensusSummary
from specpilot.control.config import ControllerConfig, Placement, Stage
from specpilot.control.gate import Gate, GateRequest, GateResult
from specpilot.control.multiplicity import adjust
from specpilot.control.outputs import EMPTY_COMPARISON, OutputComparison
from specpilot.control.prompts import PromptSource, draw
from specpilot.control.rule import DISQUALIFYING, Decision, Reason, Outcome, promotion_threshold, run_sequential
from specpilot.control.pair import ArmFailure
from specpilot.control.arm import ArmSpec
from specpilot.control.stats import GainEstimate, NoiseFloor
from specpilot.control.worker import FailureKind
from specpilot.errors import ConfigError, SpecPilotError

STREAMS = {Stage.SINGLE: "timing", Stage.SCREEN: "timing", Stage.REMEASURE: "remeasure", Stage.NOISE: "noise"}
MAX_VOID_BLOCKS = 3  # void blocks re-run per evaluation; one more voids the evaluation
FORCED_REQUESTS = 2  # timed requests whose outputs the gate token-forces after timing


class EvaluationError(SpecPilotError):
    """The comparison could not be made (the incumbent or stock failed, or the gate is broken)."""


class _Contaminated(SpecPilotError):
    """More void blocks than `MAX_VOID_BLOCKS` in one evaluation."""


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
    incumbent: ArmSpec
    candidate: ArmSpec
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
    census: CensusSummary | None = None  # who else ran during the timed blocks (None: no census taken)
    forced: GateResult | None = None  # the gate on a sample of the timed outputs (None: not run)
    draw: str = ""  # key of the gate's prompt draw and of the forced sample

    @property
    def verdict(self) -> Outcome:
        return self.decision.verdict

    @property
    def saturated(self) -> tuple[int, int]:
        """(request pairs compared on saturated stretches, timed request pairs) over the blocks."""
        counts = [saturated_pairs(t) for t in self.timings]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

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
            "census": self.census.to_dict() if self.census else None,
            "forced": self.forced.to_dict() if self.forced else None,
            "draw": self.draw,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Evaluation":
        def opt(kind, key):
            return kind.from_dict(d[key]) if d.get(key) else None

        return cls(ArmSpec.from_dict(d["incumbent"]), ArmSpec.from_dict(d["candidate"]), Stage(d["stage"]),
                   Placement(d["placement"]), Decision.from_dict(d["decision"]), opt(NoiseFloor, "noise"),
                   opt(GateResult, "gate"), opt(GainEstimate, "estimate"), opt(OutputComparison, "outputs"),
                   Costs(**d["costs"]), d.get("error", ""), d.get("adjusted_p"), opt(Evaluation, "screening"),
                   tuple(d.get("timings", ())), opt(CensusSummary, "census"), opt(GateResult, "forced"),
                   d.get("draw", ""))


@dataclass(frozen=True)
class RoundResult:
    evaluations: tuple[Evaluation, ...]  # final evaluation per candidate, in the order given
    winner: int | None  # index of the re-measured candidate (promoted only if its re-measure says so)

    @property
    def promoted(self) -> Evaluation | None:
        if self.winner is None:
            return None
        e = self.evaluations[self.winner]
        return e if e.verdict is Outcome.PROMOTE else None


class Controller:
    def __init__(self, config: ControllerConfig, backend: Backend, gate: Gate, prompt_source: PromptSource,
                 deployment: str):
        self.config = config
        self.backend = backend
        self.gate = gate
        self.prompt_source = prompt_source
        self.deployment = deployment
        self._gate_lock = threading.Lock()
        self._draws: dict[str, int] = {}  # candidate fingerprint -> evaluations drawn for it so far
        self._draws_lock = threading.Lock()

    @property
    def procedure(self) -> str:
        return self.config.procedure_key(self.backend.placement)

    # ---- public ----------------------------------------------------------------------------
    def measure_noise(self, stock: ArmSpec) -> NoiseFloor:
        """Stock against a second copy of stock (two fresh workers), `noise_blocks` blocks."""
        return NoiseFloor(self.stock_vs_stock(stock).estimate, self.procedure)

    def stock_vs_stock(self, stock: ArmSpec) -> Evaluation:
        """The A/A evaluation behind `measure_noise` (with its costs and outputs, for reports)."""
        noise_config = replace(self.config, blocks=self.config.noise_blocks, extra_blocks=0)
        return self._compare(stock, stock, None, Stage.NOISE, noise_config)

    def evaluate(self, incumbent: ArmSpec, candidate: ArmSpec, noise: NoiseFloor, factor: int = 1) -> Evaluation:
        """One comparison; `factor` times the blocks at every look (`ControllerConfig.powered`)."""
        self._check_noise(noise)
        return self._compare(incumbent, candidate, noise, Stage.SINGLE, self.config.powered(factor))

    def evaluate_round(self, incumbent: ArmSpec, candidates: Sequence[ArmSpec], noise: NoiseFloor,
                       factors: Sequence[int] | None = None) -> RoundResult:
        """Screen all, correct for multiplicity, re-measure the winner on fresh blocks. `factors`
        (default all 1): each candidate's screening and re-measurement take that many times the
        blocks at every look (`ControllerConfig.powered`: same looks, same alpha per look)."""
        self._check_noise(noise)
        if not candidates:
            raise ConfigError("a round needs at least one candidate")
        factors = tuple(factors) if factors is not None else (1,) * len(candidates)
        if len(factors) != len(candidates):
            raise ConfigError(f"a round of {len(candidates)} candidates got {len(factors)} power factors")
        if len(candidates) == 1:
            e = self.evaluate(incumbent, candidates[0], noise, factors[0])
            return RoundResult((e,), 0 if e.estimate is not None else None)
        configs = [self.config.powered(f) for f in factors]
        with ThreadPoolExecutor(max_workers=max(1, self.backend.parallelism)) as pool:
            screened = list(pool.map(lambda c, config: self._compare(incumbent, c, noise, Stage.SCREEN, config),
                                     candidates, configs))
        timed = [i for i, e in enumerate(screened) if e.estimate is not None]
        adjusted = dict(zip(timed, adjust([screened[i].decision.p_value for i in timed], self.config.multiplicity)))
        final = [replace(e, adjusted_p=adjusted.get(i)) for i, e in enumerate(screened)]
        significant = [i for i in timed
                       if adjusted[i] <= self.config.alpha and screened[i].verdict is Outcome.PROMOTE]
        for i in timed:
            if screened[i].verdict is Outcome.PROMOTE and i not in significant:
                final[i] = replace(final[i], decision=final[i].decision.with_verdict(
                    Outcome.NEED_MORE_DATA, Reason.NOT_SIGNIFICANT))
        # Select among the significant ones; failing those, among those that cleared the threshold
        # alone (confirmed on fresh blocks below either way).
        pool = significant or [i for i in timed if screened[i].verdict is Outcome.PROMOTE]
        if not pool:
            return RoundResult(tuple(final), None)
        ranked = sorted(pool, key=lambda i: -screened[i].estimate.gain)
        screening = {i: final[i] for i in ranked}
        for i in significant:
            if i != ranked[0]:
                decision = final[i].decision.with_verdict(Outcome.REJECT, Reason.NOT_SELECTED)
                final[i] = replace(final[i], decision=decision)
        # The largest screened gain is re-measured; where that re-measure disqualifies it (its timed
        # outputs fail the guard, its worker dies), the next is re-measured in its place. One that
        # is merely not confirmed ends the round: trying until one confirms would be a multiple test.
        for winner in ranked:
            again = self._compare(incumbent, candidates[winner], noise, Stage.REMEASURE, configs[winner],
                                  gate_result=screened[winner].gate)
            final[winner] = replace(again, decision=again.decision.with_verdict(again.verdict, Reason.REMEASURED),
                                    adjusted_p=adjusted[winner], screening=screening[winner])
            if not DISQUALIFYING & set(again.decision.reasons):
                break
        return RoundResult(tuple(final), winner)

    # ---- one comparison ------------------------------------------------------------------------
    def _compare(self, incumbent: ArmSpec, candidate: ArmSpec, noise: NoiseFloor | None, stage: Stage,
                 config: ControllerConfig, gate_result: GateResult | None = None) -> Evaluation:
        trusted = stage is Stage.NOISE  # both arms are stock: any failure is an error
        threshold = promotion_threshold(config, noise) if noise is not None else float("nan")
        start = time.monotonic()
        marks = {}
        key = "" if trusted else self._draw_key(candidate)
        blocks: list[BlockResult] = []  # timed blocks that count
        voids: list[BlockCensus] = []  # censuses of the void blocks run again

        def result(decision, estimate=None, outputs=None, error="", gate=None, blocks=(), forced=None) -> Evaluation:
            total = time.monotonic() - start
            costs = Costs(total=total, blocks=estimate.n if estimate else 0, **marks)
            censuses = [r.census for r in blocks if r.census is not None] + voids
            return Evaluation(incumbent, candidate, stage, self.backend.placement, decision, noise,
                              gate, estimate, outputs, costs, error, timings=tuple(b.timings() for b in blocks),
                              census=CensusSummary.of(censuses) if censuses else None, forced=forced, draw=key)

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
                gate = self._run_gate(session, incumbent, candidate, config, key)
                marks["gate"] = time.monotonic() - t
            if gate is not None and not gate.passed:
                return result(Decision.untimed(Outcome.REJECT, Reason.GUARD_FAILED, threshold), gate=gate)
            t = time.monotonic()
            for b in range(config.warmup_blocks):
                session.run_block(self._plan(config, f"{stream}-warmup", b))
            marks["warmup_blocks"] = time.monotonic() - t
            t = time.monotonic()

            def measure(first: int, count: int) -> list[float]:
                for b in range(first, first + count):
                    blocks.append(self._clean_block(session, config, stream, b, voids))
                return [r.log_ratio for r in blocks[first:]]

            try:
                if trusted:
                    ratios = measure(0, config.blocks)
                    estimate = GainEstimate(tuple(ratios), config.level, config.resamples, config.seed)
                    decision = Decision(Outcome.NEED_MORE_DATA, (), threshold)  # a measurement, not a decision
                else:
                    estimate, decision = run_sequential(measure, threshold, config)
            except _Contaminated as void:
                marks["timed_blocks"] = time.monotonic() - t
                if trusted:
                    raise EvaluationError(f"stock-vs-stock measurement void: {void}") from None
                return result(Decision.untimed(Outcome.NEED_MORE_DATA, Reason.CONTAMINATED, threshold),
                              error=str(void), gate=gate, blocks=blocks)
            marks["timed_blocks"] = time.monotonic() - t
            outputs = sum((OutputComparison.of((o for phase in r.incumbent_outputs for o in phase),
                                               (o for phase in r.candidate_outputs for o in phase))
                           for r in blocks), EMPTY_COMPARISON)
            if not trusted and outputs.token_ratio < config.min_token_ratio:
                decision = decision.with_verdict(Outcome.REJECT, Reason.OUTPUTS_SHORTER)
            forced = None
            if not trusted and decision.verdict is not Outcome.REJECT:
                forced = self._force_timed(incumbent, candidate, config, stream, blocks, key)
                if forced is not None and not forced.passed:
                    decision = decision.with_verdict(Outcome.REJECT, Reason.GUARD_FAILED)
            return result(decision, estimate, outputs, gate=gate, blocks=blocks, forced=forced)
        except ArmFailure as failure:
            return self._failed(failure, trusted, result, threshold, gate)
        finally:
            session.close()

    def _clean_block(self, session, config: ControllerConfig, stream: str, index: int,
                     voids: list[BlockCensus]) -> BlockResult:
        """Block `index`, run again while its census is void; `_Contaminated` once the evaluation
        has had more than `MAX_VOID_BLOCKS` void blocks (recorded in `voids`)."""
        while True:
            r = session.run_block(self._plan(config, stream, index))
            if r.census is None or not r.census.void:
                return r
            voids.append(r.census)
            if len(voids) > MAX_VOID_BLOCKS:
                raise _Contaminated(f"{len(voids)} void blocks (foreign processes ran while arms were timed: "
                                    f"{'; '.join(r.census.foreign[:3]) or 'on the GPU'})")

    @staticmethod
    def _failed(failure: ArmFailure, trusted: bool, result, threshold: float, gate: GateResult | None) -> Evaluation:
        if trusted or failure.arm is Arm.INCUMBENT:
            raise EvaluationError(f"{'stock' if trusted else 'incumbent'} failed: {failure}") from None
        reason = Reason.BAD_OUTPUT if failure.kind is FailureKind.PROTOCOL else Reason.WORKER_FAILED
        return result(Decision.untimed(Outcome.REJECT, reason, threshold), error=str(failure), gate=gate)

    def _draw_key(self, candidate: ArmSpec) -> str:
        """A fresh key per evaluation of `candidate` by this controller: "<fingerprint>/<count>"."""
        fingerprint = candidate.fingerprint()
        with self._draws_lock:
            n = self._draws.get(fingerprint, 0)
            self._draws[fingerprint] = n + 1
        return f"{fingerprint}/{n}"

    def _run_gate(self, session, incumbent: ArmSpec, candidate: ArmSpec, config: ControllerConfig,
                  key: str = "") -> GateResult:
        prompts = draw(self.prompt_source, config.gate_prompts, config.seed, "gate", key)
        seeds = request_seeds(config, len(prompts), "gate", key)  # () when greedy: requests as before
        kw = {"seeds": seeds} if seeds else {}
        cand = session.generate(Arm.CANDIDATE, prompts, config.max_new_tokens, **kw)
        inc = session.generate(Arm.INCUMBENT, prompts, config.max_new_tokens, **kw)
        return self._judge(GateRequest(self.deployment, incumbent, candidate, tuple(tuple(p) for p in prompts),
                                       cand, inc, config.max_new_tokens, seeds))

    def _force_timed(self, incumbent: ArmSpec, candidate: ArmSpec, config: ControllerConfig, stream: str,
                     blocks: Sequence[BlockResult], key: str) -> GateResult | None:
        """The gate on `FORCED_REQUESTS` timed requests drawn after timing, seeded by `key` and the
        measured request times (reproducible from the record, unknowable to the candidate)."""
        R = config.request_size
        units = [(i, phase, r) for i, b in enumerate(blocks) for phase in range(len(b.candidate_outputs))
                 for r in range(config.requests_per_block)]
        clock = hashlib.sha256(repr([(b.incumbent_seconds, b.candidate_seconds) for b in blocks]).encode())
        rng = random.Random(derived_seed(config.seed, "forced", key, clock.hexdigest()))
        chosen = sorted(rng.sample(units, min(FORCED_REQUESTS, len(units))))
        prompts, cand, inc, seeds = [], [], [], []
        for i, phase, r in chosen:
            plan = self._plan(config, stream, blocks[i].index)
            prompts.extend(plan.prompts[r * R : (r + 1) * R])
            seeds.extend(plan.seeds[r * R : (r + 1) * R])
            cand.extend(blocks[i].candidate_outputs[phase][r * R : (r + 1) * R])
            inc.extend(blocks[i].incumbent_outputs[phase][r * R : (r + 1) * R])
        if not chosen or len(cand) != len(prompts):  # blocks without outputs (simulations): nothing to force
            return None
        verdict = self._judge(GateRequest(self.deployment, incumbent, candidate, tuple(prompts), tuple(cand),
                                          tuple(inc), config.max_new_tokens, tuple(seeds)))
        where = [[blocks[i].index, phase, r] for i, phase, r in chosen]
        return GateResult(verdict.passed, {**verdict.summary, "forced_requests": where}, verdict.reason)

    def _judge(self, request: GateRequest) -> GateResult:
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
