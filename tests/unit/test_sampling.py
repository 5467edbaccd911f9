"""Acceptance rules: greedy prefix matching and speculative rejection sampling's output distribution."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specscope.backend.sampling import greedy_accept, rejection_accept  # noqa: E402


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
