"""Accepting drafts: greedy (exact match with the target's argmax) or speculative rejection sampling."""

from __future__ import annotations

import torch


def greedy_accept(draft: list[int], target_argmax: list[int]) -> list[int]:
    """Committed tokens for one request: the longest prefix of `draft` the target agrees with, plus the
    target's token after it (the bonus). `target_argmax` has len(draft) + 1 entries."""
    out = []
    for d, t in zip(draft, target_argmax, strict=False):
        if d != t:
            break
        out.append(d)
    out.append(target_argmax[len(out)])
    return out


def rejection_accept(
    draft: list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor, generator: torch.Generator,
) -> list[int]:
    """Speculative sampling (Leviathan et al.): accept draft j with prob min(1, p/q), else resample from
    norm(max(p - q, 0)); a full acceptance samples the bonus from p.

    draft_probs float32 `[N, vocab]` (q), target_probs float32 `[N+1, vocab]` (p), on the CPU.
    """
    out = []
    for j, d in enumerate(draft):
        p, q = target_probs[j, d].item(), draft_probs[j, d].item()
        if torch.rand((), generator=generator).item() < min(1.0, p / max(q, 1e-20)):
            out.append(d)
            continue
        residual = (target_probs[j] - draft_probs[j]).clamp_min(0)
        residual = residual / residual.sum() if residual.sum() > 0 else target_probs[j]
        out.append(int(torch.multinomial(residual, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(target_probs[len(draft)], 1, generator=generator)))
    return out
