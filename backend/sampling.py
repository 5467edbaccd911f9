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


def greedy_accept_device(drafts: torch.Tensor, target_argmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance for a batch on the device, without a sync.

    drafts int64 `[bs, N]`, target_argmax int64 `[bs, N+1]` -> (committed int64 `[bs, N+1]`: the tokens at the
    verified positions, valid for the first accept_length entries; accept_length int64 `[bs]`, 1..N+1)."""
    n = drafts.shape[1]
    match = (drafts == target_argmax[:, :n]).to(torch.int64).cumprod(1)
    return target_argmax, match.sum(1) + 1


def rejection_accept_device(drafts: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                            generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling for a batch on the device (Leviathan et al.; chain drafts), without a sync.

    drafts int64 `[bs, N]`, draft_probs float32 `[bs, N, V]` (q), target_probs float32 `[bs, N+1, V]` (p) ->
    (committed int64 `[bs, N+1]`, valid for the first accept_length entries; accept_length int64 `[bs]`).
    Draft j is kept with probability min(1, p/q); the first rejected position is resampled from norm(max(p - q, 0));
    a row that keeps every draft samples its bonus from p."""
    bs, n = drafts.shape
    rows = torch.arange(bs, device=drafts.device)
    p_d = target_probs[:, :n].gather(2, drafts[:, :, None])[..., 0]
    q_d = draft_probs.gather(2, drafts[:, :, None])[..., 0]
    u = torch.rand(bs, n, device=drafts.device, generator=generator)
    keep = (u < (p_d / q_d.clamp_min(1e-20)).clamp(max=1.0)).to(torch.int64).cumprod(1)
    k = keep.sum(1)  # drafts kept per row, 0..N
    p_k = target_probs[rows, k]
    q_k = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], 1)[rows, k]  # q = 0 at the bonus position
    residual = (p_k - q_k).clamp_min(0)
    mass = residual.sum(1, keepdim=True)
    dist = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_k)
    last = sample_device(dist, generator)
    committed = torch.cat([drafts, drafts[:, :1]], 1).clone()
    committed[rows, k] = last
    return committed, k + 1


def sample_device(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of probs float32 `[rows, V]` -> int64 `[rows]`, on the device and without a sync.

    argmax(p / E) with E ~ Exp(1) draws from p (the exponential race); torch.multinomial would check its input
    with a host read."""
    e = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / e).argmax(-1)
