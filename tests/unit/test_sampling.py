"""Acceptance rules: greedy prefix matching and speculative rejection sampling's output distribution, on the host
(the per-row oracle) and batched on the device as the engine runs them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specscope.backend.sampling import (  # noqa: E402
    greedy_accept,
    greedy_accept_device,
    rejection_accept,
    rejection_accept_device,
    sample_device,
)


def test_greedy_accept() -> None:
    assert greedy_accept([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all drafts + bonus
    assert greedy_accept([5, 6, 7], [5, 9, 7, 8]) == [5, 9]  # first mismatch replaced by the target's token
    assert greedy_accept([5, 6, 7], [1, 2, 3, 4]) == [1]


def test_rejection_sampling_preserves_the_target_distribution() -> None:
    """The first committed token is distributed as the target's p, whatever the draft's q."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.1, 0.1, 0.1, 0.7]])
    counts = torch.zeros(4)
    n = 20000
    for _ in range(n):
        d = int(torch.multinomial(q[0], 1, generator=gen))
        out = rejection_accept([d], q, p, gen)
        counts[out[0]] += 1
    torch.testing.assert_close(counts / n, p[0], atol=0.015, rtol=0)


def test_rejection_sampling_accepts_when_draft_equals_target() -> None:
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(3, 8, generator=gen), -1)
    out = rejection_accept([1, 2], p[:2], p, gen)
    assert out[:2] == [1, 2] and len(out) == 3


def test_device_greedy_accept_equals_the_host_rule() -> None:
    gen = torch.Generator().manual_seed(2)
    for n in (1, 2, 5):
        target = torch.randint(0, 3, (64, n + 1), generator=gen)  # a 3-token vocabulary: many partial matches
        drafts = torch.randint(0, 3, (64, n), generator=gen)
        committed, length = greedy_accept_device(drafts, target)
        for b in range(64):
            want = greedy_accept(drafts[b].tolist(), target[b].tolist())
            assert committed[b, :int(length[b])].tolist() == want


def test_device_rejection_sampling_preserves_the_target_distribution() -> None:
    """Batched: the first committed token is distributed as p whatever q is, and a full acceptance samples the
    bonus from p at the last position."""
    gen = torch.Generator().manual_seed(3)
    n = 20000
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4]]).expand(n, 2, 4)
    q = torch.tensor([[0.1, 0.1, 0.1, 0.7]]).expand(n, 1, 4)
    drafts = sample_device(q[:, 0], gen)[:, None]
    committed, length = rejection_accept_device(drafts, q.contiguous(), p.contiguous(), gen)
    first = torch.bincount(committed[:, 0], minlength=4).float() / n
    torch.testing.assert_close(first, p[0, 0], atol=0.015, rtol=0)
    full = length == 2
    assert full.any() and (committed[full, 0] == drafts[full, 0]).all()
    bonus = torch.bincount(committed[full, 1], minlength=4).float() / int(full.sum())
    torch.testing.assert_close(bonus, p[0, 1], atol=0.03, rtol=0)


def test_sample_device_draws_from_the_distribution() -> None:
    gen = torch.Generator().manual_seed(4)
    probs = torch.tensor([0.6, 0.0, 0.3, 0.1]).expand(40000, 4)
    got = torch.bincount(sample_device(probs, gen), minlength=4).float() / 40000
    torch.testing.assert_close(got, probs[0], atol=0.01, rtol=0)
