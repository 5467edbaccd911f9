"""One specscope tree's engines in a long-lived process, driven over a pipe by `tracer_overhead.py --base-tree`.

Two versions of the `specscope` package cannot share a process, so the paired benchmark runs each tree (the working
tree, an older commit's `scripts/base_tree.sh` copy) in a worker of its own. The driver makes a shim folder per
worker (`make_shim`): `specscope/__init__.py` there is a regular package whose `__path__` is the tree's root, so
`specscope.tracer` is the tree's `tracer/`, `specscope.backend` its `backend/` (pyproject's package-dir mapping),
and the shim goes first on PYTHONPATH, ahead of any installed specscope (/tmp/site on the GPU host, the venv's
editable copy here). The tree's own children (`python -m specscope.tracer.process_writer[_child]`, the live
checker) inherit that PYTHONPATH and load the same tree; the worker checks both and says where it loaded from.

Protocol: one JSON object per line. The worker reads commands on stdin and answers each on its stdout (its fd 1 is
kept for the protocol; everything else the process prints, its children included, goes to stderr). After start-up
it sends a hello (tree, files, torch, device) unasked. Commands: `open` (a cell's engines: model preset, bs, arms),
`run` (one whole workload on one arm: the steady-iteration median wall, the flush time, digests of the prompts and
the generated tokens), `close` (the live checker's verdicts, the op set, peak memory; engines freed, and the model
weights too with `drop`), `exit`.

    python benchmarks/overhead_worker.py --name new --tree . [--cpu] [--spec-steps 3]   # started by the driver
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PACKAGE_FOLDERS = ("tracer", "backend", "ui", "integrations")  # pyproject's package-dir: specscope.<name> -> <name>/


# ---- the driver's side ---------------------------------------------------------------------------------------


def make_shim(tree: Path, where: Path) -> Path:
    """A folder holding a `specscope` package that maps onto `tree`'s package folders; returns the folder."""
    tree = tree.resolve()
    missing = [f for f in PACKAGE_FOLDERS if not (tree / f / "__init__.py").is_file()]
    if missing:
        raise FileNotFoundError(f"{tree} is not a specscope source tree (no {missing[0]}/__init__.py)")
    pkg = where / "specscope"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(
        f'"""specscope from {tree} (a shim of benchmarks/overhead_worker.py)."""\n\n'
        f"__path__ = [{str(tree)!r}]\n")
    return where


def worker_env(shim: Path) -> dict[str, str]:
    """The worker's environment: the shim first on PYTHONPATH; the embedded models from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shim), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("SPECSCOPE_SAMPLES", str(REPO / "samples"))  # an exported tree has no samples/ beside it
    env["PYTHONUNBUFFERED"] = "1"
    return env


class WorkerError(Exception):
    """A worker failed or answered with an error: one line for the user."""


class Worker:
    """The driver's handle on one worker process."""

    def __init__(self, name: str, tree: Path, shim_root: Path, cpu: bool, spec_steps: int) -> None:
        self.name, self.tree = name, tree.resolve()
        shim = make_shim(self.tree, shim_root / name)
        cmd = [sys.executable, str(HERE / "overhead_worker.py"), "--name", name, "--tree", str(self.tree),
               "--spec-steps", str(spec_steps), *(["--cpu"] if cpu else [])]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=worker_env(shim), cwd=REPO)
        self.hello: dict[str, Any] = {}

    def receive(self) -> dict[str, Any]:
        """The worker's next answer; a WorkerError on an error answer or a dead worker."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            raise WorkerError(f"worker {self.name!r} ({self.tree}) exited with {rc} (its log is on stderr)")
        msg = json.loads(line)
        if not msg.get("ok"):
            raise WorkerError(f"worker {self.name!r}: {msg.get('error')}")
        return msg

    def send(self, **cmd: Any) -> None:
        """Send one command (answered by the next `receive`)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def call(self, **cmd: Any) -> dict[str, Any]:
        """Send one command and wait for its answer."""
        self.send(**cmd)
        return self.receive()

    def stop(self) -> None:
        """Ask the worker to exit (its open engines close, traces included); kill it if it does not."""
        with contextlib.suppress(OSError, ValueError, WorkerError):
            if self.proc.poll() is None:
                self.call(cmd="exit")
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---- the worker's side ---------------------------------------------------------------------------------------


def _digest(values: Any) -> str:
    return hashlib.sha256(json.dumps(values, separators=(",", ":")).encode()).hexdigest()[:16]


def _check_import(tree: Path) -> dict[str, str]:
    """Where this process and a fresh child (as the tree's writer and checker start) load specscope from; a
    RuntimeError unless both are `tree`'s folders."""
    import specscope
    import specscope.backend.session
    import specscope.tracer

    here = {"specscope.tracer": specscope.tracer.__file__ or "", "specscope.backend.session":
            specscope.backend.session.__file__ or "", "specscope": specscope.__file__ or ""}
    probe = "import specscope.tracer as t, specscope.tracer.live_check as c; print(t.__file__); print(c.__file__)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    lines = out.stdout.splitlines()
    if out.returncode or len(lines) != 2:
        raise RuntimeError(f"a child process cannot import specscope: {out.stderr.strip()[-400:]}")
    here["child specscope.tracer"], here["child specscope.tracer.live_check"] = lines
    for what, f in here.items():
        if what != "specscope" and not Path(f).resolve().is_relative_to(tree):
            raise RuntimeError(f"{what} loaded from {f}, not from the tree {tree}")
    return here


def _verdict(session: Any) -> dict[str, int] | None:
    """The live checker's verdict on a closed session's trace: today's session holds it, the older one (before
    the probe refactor) kept it on its writer."""
    if hasattr(type(session), "check_result"):
        cr = session.check_result
    else:
        cr = getattr(session.writer, "check_result", None)
    return None if cr is None else dict(checked_through=cr.checked_through, errors=cr.num_errors,
                                        warnings=cr.num_warnings)


class Serve:
    """The worker: its tree's engines for the current cell, built on `open` and run on `run`."""

    def __init__(self, name: str, tree: Path, cpu: bool, spec_steps: int) -> None:
        from engine_speed import Bench, load_torch

        self.name, self.tree, self.cpu = name, tree, cpu
        if cpu:
            import torch
        else:
            torch = load_torch()
        self.torch = torch
        self.bench = Bench(torch, spec_steps)
        if cpu:
            b = self.bench
            b.device, b.dtype, b.fused_setting, b.fused_ops = "cpu", "float32", "fused-torch", "fused-torch"
        self.tmp = tempfile.mkdtemp(prefix=f"overhead-{name}-")
        self.stack: contextlib.ExitStack | None = None
        self.arms: dict[str, Any] = {}
        self.bs = 0
        self.model: str | None = None

    def hello(self) -> dict[str, Any]:
        """What this worker runs: the tree, where specscope loaded from, torch and the device."""
        from engine_speed import versions

        files = _check_import(self.tree)
        torch = self.torch
        cuda = not self.cpu
        props = torch.cuda.get_device_properties(torch.cuda.current_device()) if cuda else None
        v = versions(torch)
        v.pop("git_commit", None)  # the driver names each tree's commit (a copy inside a checkout would see its HEAD)
        return dict(name=self.name, tree=str(self.tree), files=files, pid=os.getpid(), versions=v,
                    gpu=torch.cuda.get_device_name() if cuda else "cpu",
                    capability=".".join(map(str, torch.cuda.get_device_capability())) if cuda else None,
                    gpu_memory_mib=props.total_memory // (1 << 20) if props is not None else None)

    def open(self, model: str, bs: int, arms: list[str], quick: bool, plan_stream: bool,
             live_check: bool) -> dict[str, Any]:
        """Build the cell's engines (graph capture included); free the last model's weights on a model change."""
        from engine_speed import presets
        from tracer_overhead import open_arms

        if self.stack is not None:
            raise RuntimeError("open: the previous cell is still open")
        if self.model is not None and self.model != model:
            self.bench.drop_models()
        cuda = not self.cpu
        if cuda:
            self.torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        p = presets(quick)[model]
        self.stack = contextlib.ExitStack()
        try:
            self.arms = self.stack.enter_context(open_arms(self.bench, p, bs, plan_stream, self.tmp, live_check,
                                                           tuple(arms)))
        except BaseException:
            self.stack.close()
            self.stack, self.arms = None, {}
            raise
        self.bs, self.model = bs, model
        if cuda:
            self.torch.cuda.synchronize()
        # The cell's workload as every arm serves it (fresh_requests(0) of each engine): the driver compares these
        # across arms and workers, so both trees run the same prompts.
        prompts = {a: _digest([r.prompt for r in s.fresh_requests(0)]) for a, s in self.arms.items()}
        free = self.torch.cuda.mem_get_info()[0] / 2**30 if cuda else None
        return dict(build_s=time.perf_counter() - t, prompts=prompts, gpu_free_gib=free)

    def run(self, arm: str, seed: int) -> dict[str, Any]:
        """One whole workload on `arm`'s engine (tracer_overhead.run_round)."""
        from tracer_overhead import run_round

        wall, flush, outputs = run_round(self.bench, self.arms[arm], arm, self.bs, seed)
        return dict(wall_ms=wall, flush_ms=flush, outputs=_digest(outputs), tokens=sum(len(o) for o in outputs))

    def close(self, drop: bool) -> dict[str, Any]:
        """Close the cell's engines (each trace with its live checker's verdict); free them, and the weights with
        `drop`."""
        from tracer_overhead import _check_ops

        if self.stack is None:
            raise RuntimeError("close: no open cell")
        ops = _check_ops(self.bench)
        traced = {a: s for a, s in self.arms.items() if s.writer is not None}
        stack, self.stack, self.arms = self.stack, None, {}
        stack.close()
        checks = {a: _verdict(s) for a, s in traced.items()}
        del traced
        peak = None
        if not self.cpu:
            peak = dict(allocated_gib=self.torch.cuda.max_memory_allocated() / 2**30,
                        reserved_gib=self.torch.cuda.max_memory_reserved() / 2**30)
        if drop:
            self.bench.drop_models()
            self.model = None
        gc.collect()
        if not self.cpu:
            self.torch.cuda.empty_cache()
        return dict(ops=ops, checks=checks, peak_memory=peak)

    def shutdown(self) -> None:
        """Close any open cell and remove the trace folder."""
        if self.stack is not None:
            with contextlib.suppress(Exception):
                self.stack.close()
        self.stack, self.arms = None, {}
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)


def _answer(out: IO[str], msg: dict[str, Any]) -> None:
    out.write(json.dumps(msg) + "\n")
    out.flush()


def main(argv: list[str] | None = None) -> int:
    """Serve commands until `exit` or the end of stdin."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--tree", required=True, type=Path)
    ap.add_argument("--spec-steps", type=int, default=3)
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args(argv)
    # The protocol's own descriptors: stdout is answers only (whatever else prints goes to stderr), and nothing the
    # tree starts reads the command pipe.
    out = os.fdopen(os.dup(1), "w")
    cmds = os.fdopen(os.dup(0), "r")
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    tag = f"overhead_worker[{args.name}]"
    tree = args.tree.resolve()
    try:
        serve = Serve(args.name, tree, args.cpu, args.spec_steps)
        hello = serve.hello()
    except Exception as e:  # one line to the driver, the traceback to the log
        traceback.print_exc()
        _answer(out, dict(ok=False, error=f"{tag}: start-up failed: {type(e).__name__}: {e}"))
        return 2
    print(f"{tag}: pid {os.getpid()}, specscope.tracer from {hello['files']['specscope.tracer']} (its children: "
          f"{hello['files']['child specscope.tracer']})", file=sys.stderr, flush=True)
    _answer(out, dict(ok=True, **hello))
    try:
        for line in cmds:
            cmd = json.loads(line)
            op = cmd.pop("cmd")
            if op == "exit":
                serve.shutdown()
                _answer(out, dict(ok=True))
                return 0
            try:
                fn = {"open": serve.open, "run": serve.run, "close": serve.close}[op]
                _answer(out, dict(ok=True, **fn(**cmd)))
            except Exception as e:  # the driver decides; the traceback goes to the log
                traceback.print_exc()
                _answer(out, dict(ok=False, error=f"{op} {cmd}: {type(e).__name__}: {e}"))
    finally:
        serve.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
