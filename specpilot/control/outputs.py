"""Checks on what the workers send back, and how the candidate's outputs compare with the incumbent's.

The controller never takes a worker's word for anything but its tokens, and checks those: one
output per prompt, each a list of non-negative ints no longer than `max_new_tokens`. A candidate
that breaks this is rejected (`Reason.BAD_OUTPUT`).

Comparing tokens with the incumbent's on the timed prompts is reported, not judged: near-ties can
flip under a different reduction order, so divergence alone is not a loss of quality — that
verdict is the guard's. One thing is judged: a candidate that returns materially fewer tokens
(`min_token_ratio`, 5% by default) is rejected (`Reason.OUTPUTS_SHORTER`); timing is per token
(`blocks.BlockResult.log_ratio`), so the small length changes of bf16 near-tie flips cost nothing.

Owns: `validate_outputs` and `OutputComparison`. Does not own the guard.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

from specpilot.guard.divergence import first_divergence


class OutputError(ValueError):
    """A reply's outputs are malformed."""


def validate_outputs(outputs, prompts: int, max_new_tokens: int) -> tuple[tuple[int, ...], ...]:
    """The outputs as tuples, or OutputError saying what is wrong with them."""
    if not isinstance(outputs, list) or len(outputs) != prompts:
        got = len(outputs) if isinstance(outputs, list) else type(outputs).__name__
        raise OutputError(f"expected {prompts} outputs, got {got}")
    out = []
    for i, ids in enumerate(outputs):
        if not isinstance(ids, list) or not all(type(t) is int and t >= 0 for t in ids):
            raise OutputError(f"output {i} is not a list of non-negative token ids")
        if len(ids) > max_new_tokens:
            raise OutputError(f"output {i} has {len(ids)} tokens, more than max_new_tokens = {max_new_tokens}")
        out.append(tuple(ids))
    return tuple(out)


@dataclass(frozen=True)
class OutputComparison:
    runs: int  # prompt runs compared (prompts x phases)
    identical: int
    incumbent_tokens: int
    candidate_tokens: int
    first_divergences: tuple[int, ...]  # per divergent run

    @classmethod
    def of(cls, incumbent: Iterable[tuple[int, ...]], candidate: Iterable[tuple[int, ...]]) -> "OutputComparison":
        runs = identical = a_tok = b_tok = 0
        firsts = []
        for a, b in zip(incumbent, candidate, strict=True):
            runs += 1
            a_tok += len(a)
            b_tok += len(b)
            d = first_divergence(a, b)
            if d is None:
                identical += 1
            else:
                firsts.append(d)
        return cls(runs, identical, a_tok, b_tok, tuple(firsts))

    def __add__(self, other: "OutputComparison") -> "OutputComparison":
        return OutputComparison(self.runs + other.runs, self.identical + other.identical,
                                self.incumbent_tokens + other.incumbent_tokens,
                                self.candidate_tokens + other.candidate_tokens,
                                self.first_divergences + other.first_divergences)

    @property
    def divergence_rate(self) -> float:
        """Share of prompt runs whose tokens differ from the incumbent's anywhere."""
        return 1 - self.identical / self.runs if self.runs else 0.0

    @property
    def token_ratio(self) -> float:
        """Candidate tokens / incumbent tokens over all compared runs."""
        return self.candidate_tokens / self.incumbent_tokens if self.incumbent_tokens else 1.0

    @property
    def mean_first_divergence(self) -> float | None:
        f = self.first_divergences
        return sum(f) / len(f) if f else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["first_divergences"] = list(self.first_divergences)
        d.update(divergence_rate=self.divergence_rate, token_ratio=self.token_ratio,
                 mean_first_divergence=self.mean_first_divergence)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "OutputComparison":
        return cls(d["runs"], d["identical"], d["incumbent_tokens"], d["candidate_tokens"],
                   tuple(d["first_divergences"]))


EMPTY_COMPARISON = OutputComparison(0, 0, 0, 0, ())
