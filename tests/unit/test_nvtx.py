"""NVTX ranges are pushed only when something reads them (Nsight injected itself, or SPECSCOPE_NVTX=1)."""

from __future__ import annotations

import pytest
from specscope.backend.streams import nvtx, nvtx_wanted


@pytest.mark.parametrize(("env", "wanted"), [
    ({}, False),
    ({"CUDA_INJECTION64_PATH": "/opt/nsight/libToolsInjection64.so"}, True),
    ({"NVTX_INJECTION64_PATH": "/opt/nsight/libnvtx.so"}, True),
    ({"SPECSCOPE_NVTX": "1"}, True),
    ({"SPECSCOPE_NVTX": "0", "CUDA_INJECTION64_PATH": "/opt/nsight/libToolsInjection64.so"}, False),
])
def test_ranges_are_wanted_only_when_a_tool_reads_them(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                       wanted: bool) -> None:
    for name in ("CUDA_INJECTION64_PATH", "NVTX_INJECTION64_PATH", "SPECSCOPE_NVTX"):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert nvtx_wanted() is wanted


def test_a_disabled_range_is_one_shared_no_op_context() -> None:
    a, b = nvtx("verify", False), nvtx("draft step 0", False)
    assert a is b
    with a:
        pass
