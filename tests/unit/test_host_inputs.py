"""Host inputs staged for one upload, and new pages queued for one device scatter, equal the direct writes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specscope.backend.host_inputs import HostInputs  # noqa: E402
from specscope.backend.memory import PageAllocator, PageWrites, ReqToTokenPool, RequestKV  # noqa: E402


def test_upload_returns_each_part_and_later_uploads_do_not_alias() -> None:
    up = HostInputs(torch.device("cpu"), capacity=8, ring=2)
    a, b, empty = up.upload([[1, 2, 3], [7], []])
    assert a.tolist() == [1, 2, 3] and b.tolist() == [7] and empty.numel() == 0 and a.dtype == torch.int64
    for _ in range(3):  # more uploads than the ring holds, one larger than the capacity
        (c,) = up.upload([list(range(20))])
    assert a.tolist() == [1, 2, 3] and c.tolist() == list(range(20))


@pytest.mark.parametrize("page", [16, 64])
def test_queued_page_writes_equal_direct_writes(page: int) -> None:
    direct, queued = (ReqToTokenPool(4, 512, torch.device("cpu")) for _ in range(2))
    pages_a, pages_b = PageAllocator(64, page), PageAllocator(64, page)
    reqs_a = [RequestKV(direct.alloc()) for _ in range(3)]
    reqs_b = [RequestKV(queued.alloc()) for _ in range(3)]
    for lengths in ([5, 40, 17], [70, 41, 200], [71, 300, 201]):  # grow across page boundaries, one row at a time
        pending = PageWrites()
        for ra, rb, n in zip(reqs_a, reqs_b, lengths, strict=True):
            ra.ensure(n, pages_a, direct)
            rb.ensure(n, pages_b, queued, pending)
        slots, logical, physical = (torch.tensor(x, dtype=torch.int64) for x in pending.parts())
        PageWrites.apply(queued, page, slots, logical, physical)
        assert torch.equal(direct.req_to_token, queued.req_to_token)
