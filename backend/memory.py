"""KV memory as SGLang lays it out: a req_to_token table, a page allocator, and per-layer token->KV pools."""

from __future__ import annotations

import torch

SUPPORTED_PAGE_SIZES = (16, 32, 64, 128)


class ReqToTokenPool:
    """`req_to_token[slot, position]` = KV slot id (int32). Slot 0 is reserved: padded graph rows read it."""

    def __init__(self, num_slots: int, max_context_len: int, device: torch.device) -> None:
        self.req_to_token = torch.zeros(num_slots + 1, max_context_len, dtype=torch.int32, device=device)
        self.max_context_len = max_context_len
        self._free = list(range(num_slots, 0, -1))

    def alloc(self) -> int:
        """Take a request slot (never 0)."""
        if not self._free:
            raise RuntimeError("req_to_token pool exhausted")
        return self._free.pop()

    def free(self, slot: int) -> None:
        """Return a request slot; its row is zeroed so nothing stale survives."""
        self.req_to_token[slot].zero_()
        self._free.append(slot)

    @property
    def num_free(self) -> int:
        """Free request slots."""
        return len(self._free)


class PageAllocator:
    """Hands out whole KV pages. Page 0 is reserved: padded rows and capture warm-ups point at it."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        if page_size not in SUPPORTED_PAGE_SIZES:
            raise ValueError(f"page size {page_size} is not one of {SUPPORTED_PAGE_SIZES}")
        self.page_size = page_size
        self.num_pages = num_pages
        # Lowest ids first, so fresh runs have readable, mostly ascending page tables.
        self._free = list(range(num_pages - 1, 0, -1))

    def alloc(self, n: int) -> list[int]:
        """Take `n` pages."""
        if n > len(self._free):
            raise RuntimeError(f"KV cache out of pages: need {n}, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, pages: list[int]) -> None:
        """Return pages; the most recently freed are reused first (as a real allocator would)."""
        self._free.extend(reversed(pages))

    @property
    def num_free(self) -> int:
        """Free pages."""
        return len(self._free)


class KVPool:
    """Per-layer paged KV caches `[num_pages, 2, Hkv, P, D]` (K and V interleaved per page, HND).

    Slot id s lives at page s // P, offset s % P. This is the layout XQA, TRT-LLM FMHAv2 (Q_PAGED_KV_HND)
    and flashinfer's paged prefill all take without a copy; the metadata is the same as SGLang's.
    """

    def __init__(
        self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype, device: torch.device,
    ) -> None:
        shape = (num_pages, 2, num_kv_heads, page_size, head_dim)
        self.kv_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.page_size = page_size
        self.num_pages = num_pages
        self.dtype = dtype

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k/v `[num_tokens, Hkv, D]` at slots `loc` int64 `[num_tokens]`."""
        buf = self.kv_buffer[layer_id]
        page, off = loc // self.page_size, loc % self.page_size
        buf[page, 0, :, off] = k.to(self.dtype)
        buf[page, 1, :, off] = v.to(self.dtype)


class PageWrites:
    """New pages of a batch, queued as (request slot, logical page, physical page) and written into req_to_token
    by one device scatter: the host sends three small int lists instead of one pageable copy per request."""

    def __init__(self) -> None:
        self.slots: list[int] = []
        self.logical: list[int] = []
        self.physical: list[int] = []

    def add(self, slot: int, first_logical: int, pages: list[int]) -> None:
        """Queue `pages` as logical pages first_logical, first_logical + 1, ... of request slot `slot`."""
        self.slots += [slot] * len(pages)
        self.logical += range(first_logical, first_logical + len(pages))
        self.physical += pages

    def parts(self) -> list[list[int]]:
        """The three lists to upload (HostInputs.upload), in the order `apply` takes them."""
        return [self.slots, self.logical, self.physical]

    @staticmethod
    def apply(r2t: ReqToTokenPool, page_size: int, slots: torch.Tensor, logical: torch.Tensor,
              physical: torch.Tensor) -> None:
        """req_to_token[slot, logical*P + o] = physical*P + o for o < P; int64 `[n]` device tensors, no sync."""
        if slots.numel() == 0:
            return
        offs = torch.arange(page_size, device=slots.device)
        cols = logical[:, None] * page_size + offs[None, :]
        vals = (physical[:, None] * page_size + offs[None, :]).to(r2t.req_to_token.dtype)
        r2t.req_to_token[slots[:, None].expand_as(cols), cols] = vals


class RequestKV:
    """The pages one request owns, and the req_to_token row that maps its positions onto them."""

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.pages: list[int] = []

    def ensure(self, length: int, alloc: PageAllocator, r2t: ReqToTokenPool,
               pending: PageWrites | None = None) -> None:
        """Own enough pages for positions [0, length) and write their slot ids into req_to_token (or queue the
        writes on `pending`, which sends a whole batch's new pages in one copy)."""
        if length > r2t.max_context_len:
            raise RuntimeError(f"sequence length {length} exceeds the context length {r2t.max_context_len}")
        p = alloc.page_size
        need = -(-length // p) - len(self.pages)
        if need <= 0:
            return
        new = alloc.alloc(need)
        first = len(self.pages)
        self.pages.extend(new)
        if pending is not None:
            pending.add(self.slot, first, new)
            return
        row = r2t.req_to_token[self.slot]
        slots = (torch.tensor(new, dtype=torch.int32).repeat_interleave(p) * p
                 + torch.arange(p, dtype=torch.int32).repeat(len(new)))
        row[first * p:(first + len(new)) * p] = slots.to(row.device)

    def shrink(self, length: int, alloc: PageAllocator, r2t: ReqToTokenPool) -> None:
        """Free the pages that hold only positions >= length (rejected draft slots) and clear their row."""
        p = alloc.page_size
        keep = -(-length // p)
        if keep >= len(self.pages):
            return
        alloc.free(self.pages[keep:])
        r2t.req_to_token[self.slot, keep * p:len(self.pages) * p] = 0
        self.pages = self.pages[:keep]

    def release(self, alloc: PageAllocator) -> None:
        """Free every page."""
        alloc.free(self.pages)
        self.pages = []
