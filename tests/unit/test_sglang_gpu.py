"""GPU host only (marker `gpu`): SGLang's own TRTLLM MHA backend (0.5.13 and 0.5.12 wheels) with the real flashinfer
kernels, recorded through specscope.integrations.sglang.

    python -m pytest -m gpu tests/unit/test_sglang_gpu.py -v -s

Needs: a CUDA GPU, flashinfer (`. .gpu/setup.sh` on the project's hosts), and the two sglang versions: installed /
unpacked as CI does, or (hosts without network) the few files the loader reads, made on a machine with the wheels by
`python -m specscope.integrations.sglang_loader --slim .sglang-slim --sglang .sglang-0.5.12` and the same without
`--sglang` (0.5.13, installed), ~500 KB, carried as `.sglang-slim/`. Set SPECSCOPE_SGLANG_GPU_OUT=DIR to keep the
recorded traces (e.g. to commit them as samples/traces/h200-sglang-*.db).

What runs where: on SM90 (H100/H200) and SM120 flashinfer's decode entry point takes the XQA path, so draft decode
and decode run their real kernels; target verify (q_len_per_req = T > 1) reaches XQA without the spec-decode
mask in 0.5.13 (fixed in 0.5.23), so it may be rejected: the test then skips with flashinfer's message. The
context kernel (EXTEND, DRAFT_EXTEND) is trtllm-gen only (SM100/SM103) and is not called on other GPUs.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
pytest.importorskip("flashinfer", reason="flashinfer is not installed (. .gpu/setup.sh)")

from specscope.backend.memory import PageAllocator, ReqToTokenPool, RequestKV  # noqa: E402
from specscope.integrations.sglang_drive import drive, without_fixup_hook  # noqa: E402
from specscope.integrations.sglang_driver import UpstreamGraphRunner, specscope_batch, upstream_batch  # noqa: E402
from specscope.integrations.sglang_loader import load_upstream  # noqa: E402
from specscope.integrations.sglang_package import TMB_PATH  # noqa: E402
from specscope.integrations.sglang_stand_ins import make_model_runner  # noqa: E402
from specscope.tracer.checks import check_steps  # noqa: E402
from specscope.tracer.schema import ForwardMode, GraphPhase, Severity  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEV = torch.device("cuda")
SM = torch.cuda.get_device_capability()


def _where(version: str) -> Path | None:
    """SPECSCOPE_SGLANG_<version> (dots as underscores), else .sglang-<version>/, else .sglang-slim/<version>/
    (`python -m specscope.integrations.sglang_loader --slim .sglang-slim`), else the installed sglang (None)."""
    env = os.environ.get("SPECSCOPE_SGLANG_" + version.replace(".", "_"))
    for cand in ([Path(env)] if env else []) + [ROOT / f".sglang-{version}", ROOT / ".sglang-slim" / version]:
        if (cand / "sglang" / TMB_PATH).is_file():
            return cand
    return None


def _load(version: str):  # noqa: ANN202
    where = _where(version)
    try:
        up = load_upstream(where, kernels=True)
    except Exception as e:  # noqa: BLE001 - not installed / not carried to this host
        pytest.skip(f"sglang {version}: {e}")
    if up.version != version:
        pytest.skip(f"sglang {version} wanted, {up.version} found")
    return up


def _out(tmp_path: Path, name: str) -> Path:
    d = os.environ.get("SPECSCOPE_SGLANG_GPU_OUT")
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
        return Path(d) / name
    return tmp_path / name


def _check(path: Path):  # noqa: ANN202
    with TraceReader(path) as r:
        steps = list(r.steps())
        return steps, list(check_steps(steps, r.run))


@pytest.mark.parametrize("version", ["0.5.13", "0.5.12"])
def test_recorded_drive_on_the_gpu(tmp_path: Path, version: str) -> None:
    """The CPU seed-bug drive with CUDA tensors: pinned non-blocking snapshots, CUDA-event spans; 0.5.12 flags I6
    at the first verify replay, 0.5.13 has no error (I18 on padded draft-extend replays excepted: a checker
    offset issue, see test_sglang_integration._checker_padding_offset)."""
    up = _load(version)
    path = _out(tmp_path, f"h200-sglang-{version}-K4-T2.db")
    drive(up, path, K=4, T=2, device="cuda", plan_stream=version == "0.5.13")  # 0.5.12 has no fix-up hook
    steps, vs = _check(path)
    assert any(sp.stream in ("compute", "plan") for s in steps for sp in s.spans), "no CUDA-event spans"
    assert all(a.data_ptr != 0 for s in steps for a in s.arrays if a.name == "cache_seqlens")
    errors = [v for v in vs if v.severity == Severity.ERROR
              and not (v.check_id == "I18" and "DRAFT_EXTEND" in v.message)]
    if version == "0.5.12":
        first = min(s.index for s in steps if s.mode == ForwardMode.TARGET_VERIFY and s.graph == GraphPhase.REPLAY)
        assert any(v.check_id == "I6" and v.step == first for v in vs)
    else:
        assert errors == [], errors[:3]


def test_missing_hook_on_the_gpu(tmp_path: Path) -> None:
    """I28 from the recorded call error, on CUDA tensors (0.5.13 with the hook removed)."""
    up = _load("0.5.13")
    path = _out(tmp_path, "h200-sglang-0.5.13-no-fixup-hook.db")
    with pytest.raises(NotImplementedError):
        drive(up, path, K=4, plan_stream=True, backend_cls=without_fixup_hook(up), device="cuda")
    _, vs = _check(path)
    assert any(v.check_id == "I28" for v in vs)


class _Pool:
    """The two KV-pool calls the backend makes (`get_kv_buffer`, `set_kv_buffer`), over [slots, Hkv, D] tensors."""

    def __init__(self, slots: int, hkv: int, d: int, dtype: torch.dtype) -> None:
        g = torch.Generator(device="cuda").manual_seed(0)
        self.k = torch.randn(slots, hkv, d, device=DEV, dtype=torch.float32, generator=g).to(dtype)
        self.v = torch.randn(slots, hkv, d, device=DEV, dtype=torch.float32, generator=g).to(dtype)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer 0's K and V."""
        return self.k, self.v

    def set_kv_buffer(self, layer, loc, k, v, k_scale=None, v_scale=None, **kw) -> None:  # noqa: ANN001, ANN003
        """Write k/v at slots loc."""
        self.k[loc] = k.view(-1, *self.k.shape[1:]).to(self.k.dtype)
        self.v[loc] = v.view(-1, *self.v.shape[1:]).to(self.v.dtype)


def _reference(q: torch.Tensor, pool: _Pool, r2t: torch.Tensor, rpi: list[int], lens: list[int], T: int,
               scaling: float) -> torch.Tensor:
    """float32 attention: token t of row b sees positions [0, lens[b] - T + t] of its req_to_token row."""
    hq, d = q.shape[1], q.shape[2]
    hkv = pool.k.shape[1]
    out = torch.empty(q.shape[0], hq, d, device=DEV, dtype=torch.float32)
    for b, (slot, n) in enumerate(zip(rpi, lens, strict=True)):
        for t in range(T):
            m = n - T + t + 1
            idx = r2t[slot, :m].long()
            k = pool.k[idx].float().repeat_interleave(hq // hkv, 1)  # [m, Hq, D]
            v = pool.v[idx].float().repeat_interleave(hq // hkv, 1)
            qq = q[b * T + t].float()  # [Hq, D]
            w = torch.softmax(torch.einsum("hd,mhd->hm", qq, k) * scaling, -1)
            out[b * T + t] = torch.einsum("hm,mhd->hd", w, v)
    return out.reshape(q.shape[0], hq * d)


def _setup(up, *, K: int, page_size: int = 16, ctx: int = 1024, hq: int = 8, hkv: int = 2, d: int = 128):  # noqa: ANN001, ANN202
    rng = random.Random(0)
    r2t = ReqToTokenPool(8, ctx, DEV)
    alloc = PageAllocator(8 * (ctx // page_size) + 2, page_size)
    pool = _Pool(alloc.num_pages * page_size, hkv, d, torch.bfloat16)
    rows = []
    for _ in range(3):
        slot = r2t.alloc()
        kv = RequestKV(slot)
        s = rng.randint(40, ctx // 2)
        kv.ensure(s + K + 2, alloc, r2t)
        rows.append((slot, s))
    mr = make_model_runner(req_to_token=r2t.req_to_token, page_size=page_size, context_len=ctx, num_draft_tokens=K,
                           device=DEV, token_to_kv_pool=pool, dtype=torch.bfloat16)
    layer = SimpleNamespace(layer_id=0, tp_q_head_num=hq, tp_k_head_num=hkv, tp_v_head_num=hkv, head_dim=d,
                            scaling=d ** -0.5, k_scale=None, v_scale=None, k_scale_float=None,
                            sliding_window_size=-1)
    return r2t, pool, rows, mr, layer


@pytest.mark.parametrize("version", ["0.5.13", "0.5.12"])
def test_draft_decode_kernel_matches_reference(version: str) -> None:
    """Each draft step's real decode kernel over the metadata of a padded graph replay (raw bs 3 of 4) equals
    float32 attention over the request's own KV."""
    up = _load(version)
    r2t, pool, rows, mr, layer = _setup(up, K=4)
    draft = up.multi_step_cls(SimpleNamespace(**{**vars(mr), "is_draft_worker": True}), 1, 3)
    runner = UpstreamGraphRunner(up, draft, ForwardMode.DRAFT_DECODE, tokens_per_req=1, ladder=[1, 2, 4], device=DEV)
    runner.capture_all()
    live = upstream_batch(up, specscope_batch(r2t, None, None, ForwardMode.DRAFT_DECODE, rows, T=1, step=0),
                          num_steps=3)
    view = runner.replay_prepare(live)
    for i, be in enumerate(draft.attn_backends):
        q = torch.randn(view.batch_size, layer.tp_q_head_num, layer.head_dim, device=DEV, dtype=torch.bfloat16)
        fb = SimpleNamespace(forward_mode=up.ForwardMode.DECODE, out_cache_loc=None, batch_size=view.batch_size,
                             token_to_kv_pool=pool)
        out = be.forward_decode(q, None, None, layer, fb, save_kv_cache=False)
        lens = [s + i + 1 for _, s in rows]
        ref = _reference(q[: len(rows)], pool, r2t.req_to_token, [slot for slot, _ in rows], lens, 1, layer.scaling)
        torch.testing.assert_close(out[: len(rows)].float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(("version", "T"), [("0.5.13", 4), ("0.5.13", 2), ("0.5.12", 4), ("0.5.12", 2)])
def test_verify_kernel_where_it_runs(version: str, T: int) -> None:
    """Target verify through the real kernel (K = 4): T = K matches the reference on both versions; T != K matches
    on 0.5.13 and does not on 0.5.12 (the seed bug's numerical effect). Skips if the kernel rejects the call
    (XQA without a spec mask on SM90 in 0.5.13), with flashinfer's own message."""
    up = _load(version)
    r2t, pool, rows, mr, layer = _setup(up, K=4)
    target = up.backend_cls(mr)
    runner = UpstreamGraphRunner(up, target, ForwardMode.TARGET_VERIFY, tokens_per_req=T, ladder=[1, 2, 4],
                                 device=DEV)
    runner.capture_all()
    live = upstream_batch(up, specscope_batch(r2t, None, None, ForwardMode.TARGET_VERIFY, rows, T=T))
    view = runner.replay_prepare(live)
    md = target.forward_metadata
    md.max_seq_len_q = runner.captured_q_len[(view.batch_size, 0)]  # what the captured graph runs with
    q = torch.randn(view.batch_size * T, layer.tp_q_head_num, layer.head_dim, device=DEV, dtype=torch.bfloat16)
    fb = SimpleNamespace(forward_mode=up.ForwardMode.TARGET_VERIFY, out_cache_loc=None, batch_size=view.batch_size,
                         token_to_kv_pool=pool)
    try:
        out = target.forward_extend(q, None, None, layer, fb, save_kv_cache=False)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - report what the kernel said
        pytest.skip(f"sm{SM[0]}{SM[1]}: the verify kernel rejected the call: {type(e).__name__}: {e}")
    n = len(rows) * T
    ref = _reference(q[:n], pool, r2t.req_to_token, [slot for slot, _ in rows], [s + T for _, s in rows], T,
                     layer.scaling)
    close = torch.allclose(out[:n].float(), ref, atol=2e-2, rtol=2e-2)
    if version == "0.5.12" and T != 4:
        assert not close, "0.5.12 with T != K should attend with the wrong q_len_per_req"
    else:
        assert close
