"""XQA's packed spec-decode mask: uint16 `[rows, T, ((T+31)//32)*2]`, bit j of row r = draft token j visible."""

from __future__ import annotations

import torch


def packed_causal_mask(rows: int, q_len: int, device: torch.device) -> torch.Tensor:
    """Causal chain mask (row r sees draft tokens 0..r), packed as XQA wants: uint16 `[rows, T, 2*words]`."""
    allowed = torch.tril(torch.ones(q_len, q_len, dtype=torch.bool))
    return pack_mask(allowed.expand(rows, q_len, q_len)).to(device)


def pack_mask(allowed: torch.Tensor) -> torch.Tensor:
    """Pack bool `[rows, T, T]` into uint16 `[rows, T, 2*words]` (little-endian 32-bit words, bit j%32)."""
    rows, q_len, _ = allowed.shape
    words = (q_len + 31) // 32
    packed = torch.zeros(rows, q_len, words, dtype=torch.int64)
    for j in range(q_len):
        packed[:, :, j // 32] |= allowed[:, :, j].cpu().long() << (j % 32)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.contiguous().view(torch.uint16)


def unpack_mask(packed: torch.Tensor, q_len: int) -> torch.Tensor:
    """Inverse of `pack_mask`: uint16 `[rows, T, 2*words]` -> bool `[rows, T, T]`."""
    words = packed.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    cols = torch.arange(q_len, device=packed.device)
    bits = (words[:, :, cols // 32] >> (cols % 32)) & 1
    return bits.bool()
