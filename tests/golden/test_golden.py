"""The behaviour oracle: what every read-side command prints for the committed traces, held equal.

For each sample trace, schema-1 test trace, sample bundle and a few fresh CPU recordings, the outputs of
`check --json`, `info --json`, `export --perfetto`, a bundle's manifest and files (and `info` on it) and
`replay --json` are committed under `tests/golden/expected/`, normalized where they hold times, paths or the
machine. A refactor keeps them equal; a change in behaviour regenerates them in the same commit, with the
reason in its message:

    python tests/golden/test_golden.py --update        # rewrite expected/ from the current tree
    python tests/golden/test_golden.py --update NAME   # only the inputs whose name contains NAME
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = Path(__file__).resolve().parent / "expected"


@dataclass(frozen=True)
class Input:
    """One trace or bundle the oracle reads, and what it runs on it."""

    name: str
    path: Path | None  # None: recorded fresh by `run_args`
    run_args: tuple[str, ...] = ()
    replay_steps: tuple[int, ...] = ()
    bundle_steps: str | None = None  # export a bundle of these steps and keep its manifest
    fresh: bool = field(default=False)


_S = ROOT / "samples" / "traces"
_E = ROOT / "samples" / "exports"
_SMALL = ("--device", "cpu", "--requests", "4", "--batch-size", "2", "--max-new-tokens", "12", "--seed", "3")

INPUTS: tuple[Input, ...] = (
    Input("cpu-default", _S / "cpu-default.db", bundle_steps="30:60"),
    Input("cpu-fault-max-seq-len-q-override", _S / "cpu-fault-max-seq-len-q-override.db", replay_steps=(40, 80),
          bundle_steps="35:45"),
    Input("cpu-fault-stale-page-table", _S / "cpu-fault-stale-page-table.db"),
    Input("cpu-plan-stream-attention", _S / "cpu-plan-stream-attention.db", replay_steps=(40, 120)),
    Input("h200-default", _S / "h200-default.db"),
    Input("h200-graphs-changing-bs", _S / "h200-graphs-changing-bs.db", replay_steps=(60, 120),
          bundle_steps="100:130"),
    Input("h200-plan-stream", _S / "h200-plan-stream.db"),
    Input("h200-sglang-0.5.12-K4-T2", _S / "h200-sglang-0.5.12-K4-T2.db"),
    Input("h200-sglang-0.5.13-K4-T2", _S / "h200-sglang-0.5.13-K4-T2.db"),
    Input("h200-sglang-0.5.13-no-fixup-hook", _S / "h200-sglang-0.5.13-no-fixup-hook.db"),
    Input("v1-cpu-default", ROOT / "tests" / "data" / "v1" / "cpu-default.db"),
    Input("v1-cpu-fault-stale-page-table", ROOT / "tests" / "data" / "v1" / "cpu-fault-stale-page-table.db"),
    Input("bundle-cpu-fault-steps-0-30", _E / "cpu-fault-max-seq-len-q-override-steps-0-30.zip"),
    Input("bundle-cpu-fault-verify", _E / "cpu-fault-max-seq-len-q-override-verify.zip", replay_steps=(1,)),
    Input("bundle-h200-graphs-steps-100-150", _E / "h200-graphs-changing-bs-steps-100-150.zip", replay_steps=(24,)),
    Input("fresh-clean", None, _SMALL + ("--record-attention", "5"), replay_steps=(20, 25), bundle_steps="18:40",
          fresh=True),
    Input("fresh-fault-max-seq-len-q", None, _SMALL + ("--verify-tokens", "2", "--inject", "max-seq-len-q-override"),
          fresh=True),
    Input("fresh-plan-stream", None, _SMALL + ("--plan-stream", "--page-size", "16"), fresh=True),
)

# Fields that hold the recording machine's clock, identity or the reader's own location: their values are not
# behaviour. Times of fresh recordings are dropped everywhere (their structure stays); committed traces keep theirs.
_MACHINE_KEYS = {"hostname", "git_commit", "git_dirty", "versions", "start_ns", "driver", "created", "created_at",
                 "specscope_version", "python", "platform"}
_RANDOM_KEYS = {"kv_chain"}  # a bundle's random delta-chain id (so caches of two bundles never mix)
_TIME_KEYS = {"ts", "dur", "duration_ns", "start_ns", "end_ns", "gpu_clock", "wall_s", "elapsed_s"}


_BUNDLE_TMP = re.compile(r"/[^ ]*specscope-bundle-[^/ ]+")  # where a bundle is unpacked for reading


_MACHINE_TEXT = [(re.compile(r"(git commit:|git_commit) \S+"), r"\1 <machine>"),
                 (re.compile(r"(dirty:|git_dirty) \w+"), r"\1 <machine>"),
                 (re.compile(r"(python|torch|specscope|host|hostname) [0-9][\w.+-]*"), r"\1 <machine>")]


def _normalize(value: Any, fresh: bool, tmp: str) -> Any:
    """`value` with paths made relative and, for fresh recordings, times and machine identity blanked."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k in _RANDOM_KEYS:
                out[k] = "<random>"
            elif k in _MACHINE_KEYS and fresh:
                out[k] = "<machine>"
            elif fresh and (k in _TIME_KEYS or k.endswith("_ns") or k.endswith("_us")):
                out[k] = "<time>" if v is not None else None
            else:
                out[k] = _normalize(v, fresh, tmp)
        return out
    if isinstance(value, list):
        return [_normalize(v, fresh, tmp) for v in value]
    if isinstance(value, str):
        value = value.replace(tmp, "<tmp>").replace(os.fspath(ROOT), "<repo>")
        value = _BUNDLE_TMP.sub("<bundle-tmp>", value)
        if fresh:  # a fresh recording's run record names this machine and checkout (a bundle's README repeats it)
            for pattern, repl in _MACHINE_TEXT:
                value = pattern.sub(repl, value)
        return value
    if isinstance(value, float):
        return float(f"{value:.6g}")
    return value


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """Run `specscope ARGV` in this process: (exit status, stdout, stderr)."""
    from specscope.ui.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv0 = sys.argv  # a bundle records the command that made it
    sys.argv = ["specscope", *argv]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse
            rc = int(e.code or 0)
        finally:
            sys.argv = argv0
    return rc, out.getvalue(), err.getvalue()


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text.splitlines()


_ROUNDING = 1e-5  # differences of fp32 rounding: their last bits follow the reduction order torch's threads pick


def _blur(v: float) -> float | str:
    # Below _ROUNDING a difference is rounding noise; above it, its magnitude is the fact and its 4th and later
    # digits still follow the reduction order (one CPU's vector width against another's), so 3 digits are kept.
    return "<1e-5" if abs(v) < _ROUNDING else float(f"{v:.3g}")


def _rounding_blurred(value: Any) -> Any:
    """A replay's report with every difference below _ROUNDING shown as such and the rest to 3 significant digits
    (agreement is kept exactly, the rounding noise of a kernel is not); a real disagreement keeps its magnitude."""
    if isinstance(value, dict):
        return {k: (_blur(v) if k in ("max_abs", "rel") and isinstance(v, float) else _rounding_blurred(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_rounding_blurred(v) for v in value]
    return value


def _record(inp: Input, tmp: Path) -> Path:
    """Record a fresh CPU trace for `inp` (in a subprocess: the engine sets process-wide torch state)."""
    out = tmp / f"{inp.name}.db"
    subprocess.run([sys.executable, "-m", "specscope.ui.cli", "run", *inp.run_args, "--quiet", "-o", os.fspath(out)],
                   check=False, capture_output=True, text=True, timeout=600)
    if not out.exists():
        raise RuntimeError(f"recording {inp.name} wrote no trace")
    return out


def _perfetto_events(path: Path) -> list[Any]:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def outputs(inp: Input, tmp: Path) -> dict[str, Any]:
    """Every oracle output for one input, normalized."""
    trace = _record(inp, tmp) if inp.fresh else inp.path
    assert trace is not None
    t = os.fspath(trace)
    res: dict[str, Any] = {}
    rc, out, err = _cli(["check", t, "--json"])
    res["check"] = {"exit": rc, "stdout": _json_or_text(out), "stderr": err.splitlines()}
    rc, out, err = _cli(["info", t, "--json"])
    res["info"] = {"exit": rc, "stdout": _json_or_text(out), "stderr": err.splitlines()}
    pf = tmp / f"{inp.name}.perfetto.json.gz"
    rc, out, err = _cli(["export", t, "--perfetto", os.fspath(pf), "--overwrite"])
    res["export_perfetto"] = {"exit": rc, "stderr": err.splitlines()}
    res["perfetto"] = _perfetto_events(pf) if pf.exists() else None
    for n in inp.replay_steps:
        rc, out, err = _cli(["replay", t, "--step", str(n), "--json", "--device", "cpu"])
        res[f"replay_{n}"] = {"exit": rc, "stdout": _rounding_blurred(_json_or_text(out)), "stderr": err.splitlines()}
    if inp.bundle_steps is not None:
        zp = tmp / f"{inp.name}.zip"
        rc, out, err = _cli(["export", t, "--bundle", os.fspath(zp), "--steps", inp.bundle_steps, "--overwrite"])
        members: dict[str, Any] = {}
        if zp.exists():
            with zipfile.ZipFile(zp) as z:
                for name in z.namelist():
                    if name.endswith((".json", ".txt", ".md")):
                        members[name] = _json_or_text(z.read(name).decode())
            rc_i, out_i, err_i = _cli(["info", os.fspath(zp), "--json"])
            members["info --json"] = {"exit": rc_i, "stdout": _json_or_text(out_i), "stderr": err_i.splitlines()}
        res["bundle"] = {"exit": rc, "stderr": err.splitlines(), "members": members}
    return _normalize(res, inp.fresh, os.fspath(tmp))


def _expected_file(inp: Input) -> Path:
    return EXPECTED / f"{inp.name}.json.gz"


def _dump(obj: Any) -> bytes:
    # One value per line keeps a failing diff readable; gzip keeps the repository small (the Perfetto events).
    return gzip.compress(json.dumps(obj, indent=0, sort_keys=True).encode(), mtime=0)


def _diff(a: Any, b: Any, where: str = "") -> Iterator[str]:
    """The paths at which `a` (expected) and `b` (now) differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in b:
                yield f"{where}/{k}: removed (was {json.dumps(a[k])[:120]})"
            elif k not in a:
                yield f"{where}/{k}: added ({json.dumps(b[k])[:120]})"
            else:
                yield from _diff(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{where}: length {len(a)} -> {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            yield from _diff(x, y, f"{where}[{i}]")
    elif a != b:
        yield f"{where}: {json.dumps(a)[:120]} -> {json.dumps(b)[:120]}"


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="specscope-golden-") as d:
        yield Path(d)


@pytest.mark.parametrize("inp", INPUTS, ids=[i.name for i in INPUTS])
def test_outputs_match_the_oracle(inp: Input, workdir: Path) -> None:
    """Every command's output on this input equals the committed one (see the module docstring to update)."""
    expected_path = _expected_file(inp)
    assert expected_path.exists(), f"no oracle for {inp.name}: python tests/golden/test_golden.py --update"
    expected = json.loads(gzip.decompress(expected_path.read_bytes()))
    now = json.loads(json.dumps(outputs(inp, workdir)))  # the same JSON round trip as the stored file
    differences = list(_diff(expected, now))
    assert not differences, (f"{inp.name}: {len(differences)} difference(s) from the oracle "
                             "(a deliberate change: python tests/golden/test_golden.py --update " + inp.name + ")\n"
                             + "\n".join(differences[:40]))


def _update(only: str | None) -> None:
    EXPECTED.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="specscope-golden-") as d:
        for inp in INPUTS:
            if only and only not in inp.name:
                continue
            _expected_file(inp).write_bytes(_dump(outputs(inp, Path(d))))
            print(f"wrote {_expected_file(inp).relative_to(ROOT)}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "--update":
        sys.exit("usage: python tests/golden/test_golden.py --update [NAME]")
    _update(args[1] if len(args) > 1 else None)
