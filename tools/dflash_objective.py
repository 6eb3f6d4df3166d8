"""The DFlash block objective: what one training step of `train_dflash.py` computes from a batch of
the target's greedy sequences (`shared/research/mechanisms.md` 1.4, after SpecForge's
`OnlineDFlashModel`).

    feats = target_features(target, tokens, draft.feature_layers)          # [B,S,n*C], no grad
    loss, acc_len = block_loss(draft, target, tokens, starts, feats, args, g)

The frozen target's features (outputs of `target_layer_ids`) for whole sequences; up to --anchors
anchor positions per sequence among those whose next token was generated (`sample_anchors`);
block b = [token[a], MASK x (block-1)] at positions a..a+block-1, label at offset k = token[a+k];
block tokens see context keys at positions < a and their own block (the SpecForge mask,
`block_logits`: exactly what the engine drafts, tests/tools/test_train_dflash.py); loss = CE at
offsets 1..block-1 weighted exp(-(k-1)/gamma) (--distill w: (1 - w) CE + w KL from the target's
distribution at the position that predicted the token, `teacher_logits`). Variable prefix
(--prefix-max P): a block gets p in 0..P real tokens after its root (p = 0 half the time,
`sample_prefix`) and the loss covers offsets > p, weighted exp(-(k-p-1)/gamma) (`block_weights`):
drafting after a partial accept, as newer public DFlash recipes train (`block_loss`). `block_loss`
also returns the simulated acceptance length (SpecForge's `simulated_acc_len`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def target_features(target, tokens: torch.Tensor, layer_ids, logits: bool = False):
    """[B,S,n*C] outputs of `layer_ids` from a causal forward of tokens [B,S] (HF hidden_states[i+1];
    id -1: the embedding), as `forward_causal(capture=layer_ids)` returns them, for a dense or a
    hybrid target; with `logits`, (features, the target's logits [B,S,V] at every position)."""
    out, feats = target.forward_causal(tokens, capture=tuple(layer_ids))
    return (feats, out) if logits else feats


def sample_anchors(S: int, starts: torch.Tensor, anchors: int, g: torch.Generator, window: int = 0,
                   ends: torch.Tensor | None = None) -> torch.Tensor:
    """[B,A] sorted anchor positions per row whose next token was generated (>= starts[b] - 1),
    with `window` > 0 only among the first `window` of them (the early part of a continuation),
    and with `ends` only those whose next token lies before ends[b]; a row with fewer such
    positions than A fills up with later ones, whose labels `block_loss` masks."""
    A = min(anchors, S - int(starts.max()), window or S)
    rows = []
    for b, start in enumerate(starts.tolist()):
        lo, hi = start - 1, S - 2
        if window:
            hi = min(hi, lo + window - 1)
        if ends is not None:
            hi = max(lo, min(hi, int(ends[b]) - 2))
        first = lo + torch.randperm(hi - lo + 1, generator=g)
        if len(first) < A:
            first = torch.cat([first, hi + 1 + torch.randperm(S - 2 - hi, generator=g)])
        rows.append(first[:A])
    return torch.stack(rows).sort(1).values


def block_logits(draft, target, tokens: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor, block: int,
                 prefix: torch.Tensor | None = None):
    """(logits [B,Q,V], labels [B,Q], offsets [B,Q]) of the blocks at `anchors [B,A]`, Q = A*block.

    Block b is [token[a], MASK...] at positions a..a+block-1; its tokens see context positions < a
    (the target's features at a do not exist at inference: token a is the root) and their own block.
    With `prefix [B,A]` (p per block), offsets 1..p hold the real tokens token[a+1..a+p] instead of MASK.
    """
    B, S = tokens.shape
    dev = tokens.device
    A = anchors.shape[1]
    k = torch.arange(block, device=dev)
    pos = (anchors[..., None] + k).reshape(B, A * block)  # [B,Q]
    labels = tokens.gather(1, pos.clamp(max=S - 1))
    labels = torch.where(pos < S, labels, torch.full_like(labels, -100))
    offset = k.repeat(A).expand(B, -1)
    q_anchor = anchors.repeat_interleave(block, 1)  # [B,Q]
    ctx = torch.arange(S, device=dev)[None, None, :] < q_anchor[..., None]  # [B,Q,S]
    bid = torch.arange(A, device=dev).repeat_interleave(block)
    own = (bid[:, None] == bid[None, :]).expand(B, -1, -1)  # [B,Q,Q]
    mask = torch.cat([ctx, own], -1)[:, None]
    if prefix is None:
        emb = draft.input_embeddings(target.embed_tokens, tokens.gather(1, anchors))  # [B,A,C]
        emb, given = emb.repeat_interleave(block, 1), offset == 0  # [B,Q,C], [B,Q]
    else:
        emb = draft.input_embeddings(target.embed_tokens, tokens.gather(1, pos.clamp(max=S - 1)))  # [B,Q,C]
        given = offset <= prefix.repeat_interleave(block, 1)
    noise = torch.where(given[..., None], emb, draft.mask_embedding.to(emb.dtype).expand_as(emb))
    ctx_pos = torch.arange(S, device=dev).expand(B, -1)
    hidden = draft.forward_dense(feats.to(emb.dtype), ctx_pos, noise, pos, mask)
    return draft.logits(target.lm_head, hidden).float(), labels, offset


def sample_prefix(anchors: torch.Tensor, S: int, prefix_max: int, g: torch.Generator) -> torch.Tensor | None:
    """[B,A] real tokens after the root per block for the variable-prefix objective: p = 0 with
    probability 1/2 (the engine's case), else uniform in 1..prefix_max; at most S - 2 - a, so every
    block keeps a label. None when prefix_max is 0 (the generator is not drawn from)."""
    if prefix_max <= 0:
        return None
    root = torch.rand(anchors.shape, generator=g) < 0.5
    p = torch.where(root, 0, torch.randint(1, prefix_max + 1, anchors.shape, generator=g)).to(anchors.device)
    return torch.minimum(p, S - 2 - anchors)


def block_weights(labels: torch.Tensor, offset: torch.Tensor, prefix: torch.Tensor, gamma: float):
    """(valid [B,Q], weight [B,Q]) of block tokens: a label exists and its offset k is drafted (k > p,
    `prefix [B,Q]` the block's p per token); weight exp(-(k - p - 1)/gamma), counted from the first
    drafted offset."""
    valid = (labels >= 0) & (offset > prefix)
    return valid, torch.exp(-(offset - 1 - prefix).clamp(min=0).float() / gamma) * valid


def teacher_logits(logits: torch.Tensor, anchors: torch.Tensor, block: int) -> torch.Tensor:
    """[B,Q,V] the target's logits that predicted each block token: position anchor + k - 1 for
    offset k (offset 0, unsupervised, takes the anchor's own row), from logits [B,S,V]."""
    B, S, V = logits.shape
    k = torch.arange(block, device=anchors.device)
    src = (anchors[..., None] + k - 1).clamp(min=0, max=S - 1).reshape(B, -1)  # [B,Q]
    return logits.gather(1, src[..., None].expand(-1, -1, V))


def block_loss(draft, target, tokens, starts, feats, args, g, teacher=None, ends=None):
    """(weighted loss, simulated acceptance length) of one batch of sequences whose generated part
    begins at `starts [B]` (with `ends [B]`, labels at positions >= ends[b] carry no loss). The loss
    per block token is CE against the target's token, or with --distill w and the target's logits
    `teacher [B,S,V]`, (1 - w) CE + w KL(target || drafter).

    Variable prefix (--prefix-max P > 0): block b gets p in 0..P real tokens after its root (p = 0
    half the time, `sample_prefix`) and the loss covers offsets > p only, weighted from offset p + 1
    (`block_weights`). Why: the drafter learns to draft after a partial accept, as newer public
    DFlash recipes train it; our engine always drafts from the root, so p = 0 stays the larger
    share. P = 0 draws nothing more from `g` and is today's loss bit for bit. The simulated
    acceptance length counts from the first drafted offset."""
    S = tokens.shape[1]
    anchors = sample_anchors(S, starts, args.anchors, g, args.anchor_window, ends).to(tokens.device)
    prefix = sample_prefix(anchors, S, getattr(args, "prefix_max", 0), g)  # [B,A] or None
    logits, labels, offset = block_logits(draft, target, tokens, feats, anchors, args.block_size, prefix)
    B, Q = labels.shape
    if ends is not None:
        pos = anchors.repeat_interleave(args.block_size, 1) + offset
        labels = torch.where(pos < ends.to(pos.device)[:, None], labels, torch.full_like(labels, -100))
    p = torch.zeros_like(offset) if prefix is None else prefix.repeat_interleave(args.block_size, 1)  # [B,Q]
    valid, w = block_weights(labels, offset, p, args.gamma)
    ce = F.cross_entropy(logits.flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none").view(B, Q)
    if teacher is not None and args.distill > 0:
        t = torch.log_softmax(teacher_logits(teacher, anchors, args.block_size).float(), -1)  # [B,Q,V]
        kl = F.kl_div(torch.log_softmax(logits, -1), t, log_target=True, reduction="none").sum(-1)
        ce = (1 - args.distill) * ce + args.distill * kl
    loss = (ce * w).sum() / w.sum()
    with torch.no_grad():
        given = offset <= p  # the root and the prefix: accepted by construction
        hit = (((logits.argmax(-1) == labels) & valid) | given).view(B, -1, args.block_size)[..., 1:]
        p_block = p.view(B, -1, args.block_size)[..., 0]  # [B,A]
        counted = valid.view(B, -1, args.block_size).gather(-1, (p_block + 1)[..., None])[..., 0]  # not fill-ups
        acc_len = 1 + (hit.long().cumprod(-1).sum(-1) - p_block).float()[counted].mean()
    return loss, float(acc_len)
