"""The decoder's elementwise ops, chosen per device: plain torch (the CPU oracle) or flashinfer's fused kernels.

Three op sets, named by `OpsName`:

- "plain": the model's own code path (separate q/k/v and gate/up GEMMs, torch norms, RoPE and SiLU). The CPU
  runs it unless "fused-torch" is asked for, so a CPU result is the plain path's, bit for bit.
- "fused-torch": the fused structure (one QKV GEMM, one gate/up GEMM, a residual stream carried beside the
  hidden state as SGLang's decoder layers carry it) with torch math. It checks the structure on the CPU.
- "flashinfer": the same structure with flashinfer's `rmsnorm`, `fused_add_rmsnorm` (in place),
  `apply_rope_with_cos_sin_cache` (NeoX / HF rotate-half layout) and `silu_and_mul`. CUDA, bf16/fp16 only.

The run's `fused_ops` setting (`EngineConfig.fused_ops`, `specscope run --fused-ops`) picks: "auto" -> flashinfer
where it can run, else plain; "plain" -> plain everywhere; "fused-torch" or "flashinfer" force a set (flashinfer
still needs CUDA). ops_setting.py lists the settings and their on/off aliases (torch-free, for the CLI).
Every op takes and returns tensors of static shapes and never reads a device value on the host, so the
forward stays capturable in a CUDA graph.
"""

from __future__ import annotations

import functools
from typing import Literal

import torch
import torch.nn.functional as F

from .ops_setting import fused_ops_setting

OpsName = Literal["plain", "fused-torch", "flashinfer"]
_FLASHINFER_DTYPES = (torch.bfloat16, torch.float16)


def check_setting(setting: str) -> str:
    """`setting` as one of ops_setting.FUSED_OPS (aliases resolved); a ValueError (ConfigError) for any other."""
    return fused_ops_setting(setting)


def choose_ops(device_type: str, dtype: torch.dtype, setting: str, have_flashinfer: bool) -> OpsName:
    """The op set for a model on `device_type` in `dtype` under a fused-ops setting (pure: no imports, no device)."""
    s = check_setting(setting)
    flashinfer_ok = device_type == "cuda" and dtype in _FLASHINFER_DTYPES and have_flashinfer
    if s == "plain":
        return "plain"
    if s == "fused-torch":
        return "fused-torch"
    if s == "flashinfer":
        if not flashinfer_ok:
            raise ValueError(f"--fused-ops flashinfer needs a CUDA device, a bf16/fp16 model and flashinfer "
                             f"(got {device_type}, {dtype}, flashinfer {'found' if have_flashinfer else 'missing'})")
        return "flashinfer"
    return "flashinfer" if flashinfer_ok else "plain"


@functools.cache
def flashinfer_available() -> bool:
    """Whether flashinfer imports (looked up once; only asked on CUDA devices)."""
    try:
        import flashinfer.activation  # noqa: F401
        import flashinfer.norm  # noqa: F401
        import flashinfer.rope  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return False
    return True


def ops_for(device: torch.device, dtype: torch.dtype, setting: str = "auto") -> OpsName:
    """`choose_ops` for a real device."""
    have = device.type == "cuda" and flashinfer_available()
    return choose_ops(device.type, dtype, setting, have)


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm: float32 statistics, cast back, times the weight (the plain path's exact math)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions int [...] -> (cos, sin) float32 [..., D/2]; the plain path's RotaryEmbedding math."""
    freqs = positions.float().unsqueeze(-1) * inv_freq
    return freqs.cos(), freqs.sin()


def apply_rope_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., H, D] by cos/sin [..., D/2] (HF rotate_half layout); float32 math, x's dtype out."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


class TorchOps:
    """The fused structure's ops in torch: same math as the plain path, one op at a time."""

    name: OpsName = "fused-torch"

    def __init__(self, inv_freq: torch.Tensor) -> None:
        self.inv_freq = inv_freq  # float32 [D/2] on the model's device

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x [N, hidden] -> normed x (new tensor)."""
        return rms_norm_torch(x, weight, eps)

    def add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x); the sum is rounded to x's dtype first, as `x = x + f(x)` is."""
        residual = residual + x
        return rms_norm_torch(residual, weight, eps), residual

    def rope_context(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin once per forward, shared by every layer (as the plain path shares them)."""
        return rope_cos_sin(positions, self.inv_freq)

    def rope(self, ctx: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor, k: torch.Tensor, head_dim: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [N, Hq*D], k [N, Hkv*D] (views into the QKV output) -> rotated, contiguous [N, H, D] each."""
        cos, sin = ctx
        n = q.shape[0]
        return (apply_rope_torch(q.view(n, -1, head_dim), cos, sin),
                apply_rope_torch(k.view(n, -1, head_dim), cos, sin))

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[N, 2I] (gate | up) -> silu(gate) * up [N, I]."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class FlashinferOps:
    """flashinfer's norm / RoPE / activation kernels (CUDA, bf16 or fp16)."""

    name: OpsName = "flashinfer"

    def __init__(self, inv_freq: torch.Tensor, max_positions: int) -> None:
        import flashinfer.activation
        import flashinfer.norm
        import flashinfer.rope

        self._norm, self._rope, self._act = flashinfer.norm, flashinfer.rope, flashinfer.activation
        # [max_positions, D] float32: cos | sin halves, built with the plain path's own float32 math on this device,
        # so the table holds exactly the cos/sin the plain path computes for each position.
        cos, sin = rope_cos_sin(torch.arange(max_positions, device=inv_freq.device), inv_freq)
        self.cos_sin_cache = torch.cat([cos, sin], dim=-1).contiguous()
        self._torch = TorchOps(inv_freq)  # zero-row batches: a kernel grid of 0 blocks is a launch error

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x [N, hidden] -> normed (new tensor)."""
        if x.shape[0] == 0:
            return self._torch.rmsnorm(x, weight, eps)
        return self._norm.rmsnorm(x, weight, eps)

    def add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """In place, as flashinfer does it: residual += x, then x = norm(residual); returns (x, residual).

        Both inputs are overwritten, so callers pass only tensors nothing else reads (a GEMM's fresh output and
        the layer stack's own residual stream). The norm uses the float32 sum, not its bf16 rounding."""
        if x.shape[0] == 0:
            return self._torch.add_rmsnorm(x, residual, weight, eps)
        self._norm.fused_add_rmsnorm(x, residual, weight, eps)
        return x, residual

    def rope_context(self, positions: torch.Tensor) -> torch.Tensor:
        """The kernel reads cos/sin from the table by position, so the context is the positions themselves."""
        return positions

    def rope(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, head_dim: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [N, Hq*D], k [N, Hkv*D] (strided views are fine: the kernel takes row strides) -> new contiguous
        [N, H, D] tensors, which the attention kernels take as they are."""
        n = q.shape[0]
        if n == 0:
            return self._torch.rope(rope_cos_sin(positions, self._torch.inv_freq), q, k, head_dim)
        q_out, k_out = self._rope.apply_rope_with_cos_sin_cache(
            positions, q, k, head_dim, self.cos_sin_cache, is_neox=True)
        return q_out.view(n, -1, head_dim), k_out.view(n, -1, head_dim)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[N, 2I] (gate | up) -> silu(gate) * up [N, I], one kernel."""
        if gate_up.shape[0] == 0:
            return self._torch.silu_and_mul(gate_up)
        return self._act.silu_and_mul(gate_up)


def make_ops(name: OpsName, inv_freq: torch.Tensor, max_positions: int) -> TorchOps | FlashinferOps | None:
    """The op object for a fused set (None for "plain", which is the model's own code)."""
    if name == "plain":
        return None
    if name == "fused-torch":
        return TorchOps(inv_freq)
    return FlashinferOps(inv_freq, max_positions)
