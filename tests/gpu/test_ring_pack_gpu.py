"""The one-kernel snapshot-ring write (tracer.ring_pack) on a real GPU: eager and captured in a CUDA graph, its rows
equal the torch pack the CPU path runs, value for value, and the device index advances and wraps per write."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from specscope.tracer.ring_pack import SnapshotRing  # noqa: E402

DEV = torch.device("cuda")
BS, PAGES, T, P = 3, 5, 4, 16


def _parts(gen: torch.Generator) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Graph-buffer-like parts (leading views of larger buffers), req_to_token and the request slots."""
    def i32(*shape: int) -> torch.Tensor:
        return torch.randint(-2**31, 2**31 - 1, shape, generator=gen, dtype=torch.int32).to(DEV)

    def i64(n: int) -> torch.Tensor:
        return torch.randint(-2**62, 2**62, (n,), generator=gen, dtype=torch.int64).to(DEV)

    page_table = i32(8, PAGES)[:BS]
    rpi = torch.tensor([2, 0, 5], device=DEV)
    parts = [i32(8)[:BS], i32(9)[:BS + 1], i32(9)[:BS + 1], page_table, i32(8)[:BS], rpi, i64(32)[:BS * T],
             i64(32)[:BS * T]]
    r2t = torch.randint(0, 1 << 20, (7, PAGES * P + 3), generator=gen, dtype=torch.int32).to(DEV)
    return parts, r2t, parts[5]


def _reference(parts: list[torch.Tensor], r2t: torch.Tensor, rpi: torch.Tensor) -> torch.Tensor:
    """What ModelRunner.pack_snapshot computes: every part widened and flattened, then the page starts."""
    cols = torch.arange(0, PAGES * P, P, device=DEV)
    starts = r2t[rpi[:, None], cols[None, :]]
    return torch.cat([t.reshape(-1).to(torch.int64) for t in parts] + [starts.reshape(-1).to(torch.int64)])


def test_eager_rows_equal_the_torch_pack_and_the_index_advances() -> None:
    gen = torch.Generator().manual_seed(0)
    ring = SnapshotRing(DEV, width=128, rows=4)
    assert ring.packer is not None
    parts, r2t, rpi = _parts(gen)
    flat = [t.reshape(-1) for t in parts]
    want = _reference(parts, r2t, rpi)
    for row in range(2):
        n = ring.packer.write(flat, r2t, rpi, PAGES, P)
        assert n == want.numel()
        torch.testing.assert_close(ring.dev[row, :n], want, rtol=0, atol=0)
    assert int(ring.index) == 2
    assert int(ring.dev[2].abs().sum()) == 0  # nothing written past the rows it named


def test_captured_writes_follow_each_replays_values_and_wrap() -> None:
    gen = torch.Generator().manual_seed(1)
    ring = SnapshotRing(DEV, width=128, rows=3)
    parts, r2t, rpi = _parts(gen)
    flat = [t.reshape(-1) for t in parts]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        n = ring.packer.write(flat, r2t, rpi, PAGES, P)
    assert int(ring.index) == 0  # capturing runs nothing
    got = []
    for replay in range(4):  # the fourth wraps onto row 0
        fresh, fresh_r2t, _ = _parts(gen)
        for dst, src in zip(parts, fresh, strict=True):
            if dst is not rpi:
                dst.copy_(src)
        r2t.copy_(fresh_r2t)
        rpi.copy_(torch.tensor([replay % 7, (replay + 3) % 7, 6], device=DEV))
        graph.replay()
        torch.cuda.synchronize()
        got.append((replay % 3, _reference(parts, r2t, rpi)))
        torch.testing.assert_close(ring.dev[replay % 3, :n], got[-1][1], rtol=0, atol=0)
        assert int(ring.index) == (replay + 1) % 3
    torch.testing.assert_close(ring.dev[1, :n], got[1][1], rtol=0, atol=0)  # rows not yet lapped keep their values
