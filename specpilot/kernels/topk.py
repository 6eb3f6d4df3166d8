"""The k most likely tokens of each row of logits, with their log-probabilities, in one kernel.

A best-first draft level needs only the top k (k <= 8) of each node's log-softmax. In PyTorch that is
a log-softmax kernel writing [R, V] floats and a top-k kernel (a radix select per row) reading
them back; on CUDA, for rows that fit in one program (V <= MAX_VOCAB), one Triton program per row
loads its logits once, takes the log-sum-exp and picks the k largest by repeated argmax.

Rules:
- Values are log-probabilities in float32: logit - max - log(sum(exp(logit - max))), the same
  formula as torch.log_softmax, so equal up to float32 rounding of the sum.
- Order: descending value; among equal values the smaller index first (torch.topk leaves ties
  unspecified). The tree a drafter builds from them only decides what is verified, never what is
  emitted, so a different tie order cannot change an output.
- Elsewhere (CPU, larger vocabularies, k > MAX_K) it is torch.log_softmax + torch.topk.
"""

from __future__ import annotations

import torch

MAX_VOCAB = 32768  # one program holds a row: 32 K floats over 16 warps is 64 registers a thread
MAX_K = 8


def reference(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [..., k] float32, indices [..., k] int64) by torch.log_softmax + torch.topk."""
    return torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)


def fused_available(logits: torch.Tensor, k: int) -> bool:
    return logits.is_cuda and logits.shape[-1] <= MAX_VOCAB and 1 <= k <= MAX_K


def top_log_probs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best log-probabilities of each row of `logits [..., V]` and their indices, as above."""
    if not fused_available(logits, k):
        return reference(logits, k)
    return fused(logits, k)


def fused(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton path (also under TRITON_INTERPRET=1 on CPU, for tests)."""
    import triton

    from specpilot.kernels.topk_kernel import top_log_probs_kernel

    V = logits.shape[-1]
    x = logits.reshape(-1, V)
    if x.stride(-1) != 1:
        x = x.contiguous()
    R = x.shape[0]
    values = torch.empty(R, k, device=x.device, dtype=torch.float32)
    indices = torch.empty(R, k, device=x.device, dtype=torch.int64)
    block = triton.next_power_of_2(V)
    warps = 4 if block <= 4096 else 8 if block <= 16384 else 16
    top_log_probs_kernel[(R,)](x, values, indices, V, x.stride(0), K=k, BLOCK=block, num_warps=warps)
    shape = (*logits.shape[:-1], k)
    return values.view(shape), indices.view(shape)
