"""Per-row sampling parameters as device tensors, and the logit processor applied row by row.

A batch (or a continuous-batching slot set) decodes rows of different requests, each with its own
`SamplingParams`; a captured round cannot branch on them, so they live in preallocated [B] tensors
(`RowSampling`) that `load`/`load_row` overwrite in place. `process_rows` is
`sampling.process_logits` with those tensors in place of one request's floats: the same order
(temperature, top-k, top-p, min-p), the same comparisons and the same sums in the same order, so
a row's probabilities equal `process_logits(logits_row, its params)` bit for bit
(tests/engine/test_row_sampling.py). A row at temperature 0 gets the one-hot argmax, as there.

`Filters` says which stages any row of the batch uses; it is fixed on the host when a batch
starts (part of a captured graph's key), so a batch without top-k and top-p sorts nothing, and one
whose every sampled row has top-k sorts only its largest k (`torch.topk`): top-k zeroes everything
past it, so top-p's cumulative sums over that prefix are all it reads.

A request without a seed gets one from torch's default generator when it is loaded (host side,
once per request), so the round itself only ever reads seeds (`counter_rng`).

Not here: drawing tokens (`sampling.sample_from`, `acceptance_sampling`), the rounds
(`sampled_steps.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpilot.engine.sampling import SamplingParams

SEED_LIMIT = 1 << 62  # seeds drawn for requests without one lie in [0, SEED_LIMIT)


@dataclass(frozen=True)
class Filters:
    """Which processing stages some row of the batch uses (static per batch)."""

    top_k: bool = False
    top_p: bool = False
    min_p: bool = False
    sort_width: int = 0  # > 0: every sampled row keeps at most this many tokens by top-k; 0: sort all
    greedy: bool = True  # some row may be greedy (temperature 0): its p is the one-hot argmax

    @classmethod
    def of(cls, params: list[SamplingParams], greedy: bool | None = None) -> "Filters":
        """The stages `params` use; `greedy` (default: whether any of them is greedy) says whether
        a greedy row may decode beside them (continuous batching passes its greedy requests so)."""
        sampled = [p for p in params if not p.greedy]
        every_top_k = bool(sampled) and all(p.top_k > 0 for p in sampled)
        return cls(any(p.top_k > 0 for p in sampled), any(p.top_p < 1 for p in sampled),
                   any(p.min_p > 0 for p in sampled), max(p.top_k for p in sampled) if every_top_k else 0,
                   any(p.greedy for p in params) if greedy is None else greedy)



def request_seed(params: SamplingParams) -> int:
    """The request's seed, or a fresh one from torch's default generator when it has none."""
    if params.seed is not None:
        return params.seed
    return int(torch.randint(0, SEED_LIMIT, (1,)).item())


@dataclass
class RowSampling:
    temperature: torch.Tensor  # [B] float32, 0 = greedy
    top_k: torch.Tensor  # [B] int64, 0 = off
    top_p: torch.Tensor  # [B] float32, 1 = off
    min_p: torch.Tensor  # [B] float32, 0 = off
    seed: torch.Tensor  # [B] int64

    @classmethod
    def allocate(cls, batch: int, device) -> "RowSampling":
        f = lambda v: torch.full((batch,), v, dtype=torch.float32, device=device)  # noqa: E731
        z = torch.zeros(batch, dtype=torch.int64, device=device)
        return cls(f(0.0), z.clone(), f(1.0), f(0.0), z.clone())

    @property
    def batch(self) -> int:
        return self.seed.shape[0]

    def load(self, params: list[SamplingParams]) -> None:
        """Every row's parameters, in place (len(params) == batch)."""
        if len(params) != self.batch:
            raise ValueError(f"{len(params)} sampling parameters for {self.batch} rows")
        dev = self.seed.device
        self.temperature.copy_(torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev))
        self.top_k.copy_(torch.tensor([p.top_k for p in params], dtype=torch.int64, device=dev))
        self.top_p.copy_(torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev))
        self.min_p.copy_(torch.tensor([p.min_p for p in params], dtype=torch.float32, device=dev))
        self.seed.copy_(torch.tensor([request_seed(p) for p in params], dtype=torch.int64, device=dev))

    def load_row(self, b: int, params: SamplingParams) -> None:
        """Row b's parameters (continuous batching), in place."""
        self.temperature[b] = params.temperature
        self.top_k[b] = params.top_k
        self.top_p[b] = params.top_p
        self.min_p[b] = params.min_p
        self.seed[b] = request_seed(params)


def _rows(x: torch.Tensor, ndim: int) -> torch.Tensor:
    """[B] -> [B,1,...,1] broadcasting over `ndim` dimensions."""
    return x.reshape(x.shape + (1,) * (ndim - 1))


def _keep(probs: torch.Tensor, keep: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
    """`sampling._keep_from` where `on`, probs unchanged elsewhere (as process_logits skips a stage)."""
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return torch.where(on, kept / kept.sum(-1, keepdim=True), probs)


def process_rows(logits: torch.Tensor, rows: RowSampling, filters: Filters) -> torch.Tensor:
    """logits [B,...,V] -> probs [B,...,V] float32: row b processed by its own parameters, equal to
    `process_logits(logits[b], params_b)` (stages off in `filters` are skipped for every row)."""
    logits = logits.float()
    nd, V = logits.ndim, logits.shape[-1]
    t = _rows(rows.temperature, nd)  # [B,1..]
    greedy = t == 0
    probs = torch.softmax(logits / torch.where(greedy, torch.ones_like(t), t), dim=-1)
    if filters.top_k or filters.top_p:
        # one sort serves both stages: each stage's sorted probabilities are the previous ones with
        # the same elementwise zeroing and division applied (the kept sets are closed under order)
        w = filters.sort_width
        if 0 < w < V:  # every sampled row keeps its top k <= w: the rest of the order is zeros
            sorted_probs = probs.topk(w, dim=-1).values  # [B,..,w]
        else:
            sorted_probs = probs.sort(dim=-1, descending=True).values  # [B,..,V]
    if filters.top_k:
        k = _rows(rows.top_k, nd)
        on = (k > 0) & (k < V)
        width = sorted_probs.shape[-1]
        kth = sorted_probs.gather(-1, (k - 1).clamp(0, width - 1).expand(*probs.shape[:-1], 1))  # [B,..,1]
        kept = torch.where(probs >= kth, probs, torch.zeros_like(probs))
        total = kept.sum(-1, keepdim=True)  # [B,..,1]
        probs = torch.where(on, kept / total, probs)
        if filters.top_p:
            kept = torch.where(sorted_probs >= kth, sorted_probs, torch.zeros_like(sorted_probs))
            sorted_probs = torch.where(on, kept / total, sorted_probs)
    if filters.top_p:
        p = _rows(rows.top_p, nd)
        before = sorted_probs.cumsum(-1) - sorted_probs  # [B,..,V] mass strictly ahead in the order
        last = (before < p).sum(-1, keepdim=True) - 1  # [B,..,1]
        threshold = sorted_probs.gather(-1, last)
        probs = _keep(probs, probs >= threshold, p < 1)
    if filters.min_p:
        m = _rows(rows.min_p, nd)
        probs = _keep(probs, probs >= m * probs.amax(-1, keepdim=True), m > 0)
    if not filters.greedy:  # no greedy row (an idle serving row's p is never read)
        return probs
    one_hot = torch.nn.functional.one_hot(logits.argmax(-1), V).float()
    return torch.where(greedy, one_hot, probs)
