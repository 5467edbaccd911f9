"""One trace per rank when a hooked SGLang runs at TP > 1: real processes (a torch.distributed gloo world, as SGLang
initializes one per TP group), each recording upstream's own backend through the start-up hook into its own file;
a path another live process records into is refused, with or without SPECSCOPE_TRACE_OVERWRITE."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("sglang is not installed (python -m pip install --no-deps sglang==0.5.13)", allow_module_level=True)

from specscope.integrations import sglang as ss  # noqa: E402
from specscope.integrations.sglang_hook import PathLock, trace_path  # noqa: E402
from specscope.tracer.errors import TraceError  # noqa: E402
from specscope.tracer.store import TraceReader  # noqa: E402

# A hooked process: SGLang's backend module imported through the normal import system, the hook booted by the
# environment, then a short drive. With a port it first joins a 2-rank gloo world (what SGLang's TP workers do
# before they build their attention backends); with a wait file it keeps its trace open until that file exists.
_CHILD = textwrap.dedent("""
    import os, sys, time
    rank, port, wait = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if port != "-":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from specscope.integrations import sglang_hook
    sglang_hook.boot()
    from specscope.integrations.sglang_loader import install_as_sglang
    from specscope.integrations.sglang_drive import drive
    up = install_as_sglang()
    import sglang.srt.layers.attention.trtllm_mha_backend  # noqa: F401  (the hook patches it here)
    drive(up, None, K=3, T=3, iterations=2 + rank, seed=rank)
    print("drove", flush=True)
    while wait != "-" and not os.path.exists(wait):
        time.sleep(0.05)
    if port != "-":
        dist.barrier()
        dist.destroy_process_group()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(rank: int, env: dict[str, str], port: int | None, wait: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(rank), str(port or "-"), str(wait or "-")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _env(template: Path, overwrite: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TP_RANK", "RANK", "LOCAL_RANK", "SPECSCOPE_DEBUG")}
    env["SPECSCOPE_TRACE"] = str(template)
    if overwrite:
        env["SPECSCOPE_TRACE_OVERWRITE"] = "1"
    return env


def _iterations(path: Path) -> tuple[int, dict]:
    with TraceReader(path) as r:
        return max(s.iteration for s in r.steps()) + 1, r.run.config["sglang"]["parallel"]


def test_two_ranks_write_two_files(tmp_path: Path) -> None:
    """Two processes of one TP group, one template without {rank}: each rank writes its own file, named by the
    rank torch.distributed gave it, holding its own drive; a file already at the bare template path is not
    touched, even with overwrite on (each rank replaces its own file only)."""
    template = tmp_path / "server.db"
    template.write_bytes(b"not touched")
    (tmp_path / "server-rank1.db").write_bytes(b"rank 1's old file")
    port = _free_port()
    procs = [_child(r, _env(template, overwrite=True), port) for r in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    assert template.read_bytes() == b"not touched"
    assert sorted(x.name for x in tmp_path.glob("*.db")) == ["server-rank0.db", "server-rank1.db", "server.db"]
    assert not list(tmp_path.glob("*.lock"))  # released at exit
    for rank in (0, 1):
        n, par = _iterations(tmp_path / f"server-rank{rank}.db")
        assert n == 2 + rank  # each file is its own rank's run
        assert par["tp_rank"] == rank and par["source"] == "torch.distributed" and par["world_size"] == 2
        assert f"server-rank{rank}.db (rank {rank}, from torch.distributed)" in outs[rank][1]


def test_a_path_a_live_process_records_into_is_refused(tmp_path: Path) -> None:
    """Two single-rank processes given the same path: the second is refused while the first records (also with
    SPECSCOPE_TRACE_OVERWRITE=1), says so in one warning line and runs on; the first one's trace is whole. No
    fallback file name appears."""
    template = tmp_path / "same.db"
    go = tmp_path / "go"
    first = _child(0, _env(template), None, wait=go)
    assert first.stdout is not None and first.stdout.readline().strip() == "drove"  # recording, trace open
    second = _child(0, _env(template, overwrite=True), None)
    _, err2 = second.communicate(timeout=300)
    go.write_text("")
    _, err1 = first.communicate(timeout=300)
    assert first.returncode == 0 and second.returncode == 0, (err1, err2)
    assert "is being recorded by another live process" in err2 and err2.count("specscope: warning") == 1
    assert sorted(x.name for x in tmp_path.iterdir()) == ["go", "same.db"]
    assert _iterations(template)[0] == 2


def test_the_rank_comes_from_sglangs_groups() -> None:
    """The model runner's tp_rank (SGLang up to 0.5.2x) names the file; PP ranks prefix it; a lone process keeps
    the template as given; {rank} and {pid} are substituted where the template asks."""
    mr = SimpleNamespace(tp_rank=3, server_args=SimpleNamespace(tp_size=4, pp_size=1, dp_size=1))
    par = ss.parallel_facts(mr)
    assert par == {"tp_size": 4, "pp_size": 1, "dp_size": 1, "tp_rank": 3, "source": "model_runner.tp_rank"}
    assert trace_path("/t/s.db", parallel=par) == "/t/s-rank3.db"
    assert trace_path("/t/s-{rank}-{pid}.db", pid=7, parallel=par) == "/t/s-3-7.db"
    pp = ss.parallel_facts(SimpleNamespace(tp_rank=0, pp_rank=1, server_args=SimpleNamespace(tp_size=2, pp_size=2)))
    assert ss.rank_label(pp) == "pp1-tp0" and trace_path("/t/s.db", parallel=pp) == "/t/s-rankpp1-tp0.db"
    lone = ss.parallel_facts(SimpleNamespace(server_args=SimpleNamespace(tp_size=1)))
    assert lone["tp_rank"] == 0 and trace_path("/t/s.db", parallel=lone) == "/t/s.db"


def test_the_lock_refuses_a_second_holder_in_process(tmp_path: Path) -> None:
    """PathLock: one holder at a time; released, the path is free again and the lock file is gone."""
    path = str(tmp_path / "t.db")
    lock = PathLock(path)
    with pytest.raises(TraceError, match="another live process"):
        PathLock(path)
    lock.release()
    assert not os.path.exists(path + ".lock")
    PathLock(path).release()
