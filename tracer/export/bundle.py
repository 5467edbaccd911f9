"""Bug-report bundles: one .zip a maintainer opens, checks and replays without the reporter's GPU, models or setup.

Inside: `trace.db` (the chosen steps plus the captures their replays came from, each under its index in the original
trace, so `replay t.zip --step 34` is the step 34 the reporter talks about; a valid trace every command opens: the
schema wants indexes that grow, not dense ones), `check.json`
(the verdicts: the catalogue run over the bundle, and the violations the original trace held for those steps),
`environment.json` (GPU, versions, git commit, what the recorder did not record), `command.txt` (the exact
command that recorded the trace), `perfetto.json.gz` (the steps as a Perfetto timeline) and `README.md`.

Every command opens a bundle where it opens a trace (`tracer/bundle_file.py`, the container: this module writes
bundles). Bundles of format 2 and older renumbered their steps 0..n-1; `bundle_summary` gives the original numbers.

Recorded attention calls travel delta-coded (`tracer/kv_delta.py`): the first call of each model keeps its full
`attn_kv`, later ones only the KV token rows that changed since the previous bundled call of that model; every
reader of a call (`attention_call.recorded_call`, with the reader's `kv_base` as its fetch) resolves them, so
`replay`, `check`, `tui` and `web` see the recorded bytes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shlex
import shutil
import tempfile
import zipfile
from typing import Any

import numpy as np

from .. import kv_delta
from ..bundle_file import BUNDLE_FORMAT, MANIFEST, TRACE_NAME, read_manifest, renumbered
from ..kv_bases import stored_kv
from ..reader import TraceReader
from ..schema import ArraySnapshot, Step, Violation
from ..writer import TraceWriter

_ENV_WANTED = ("python", "torch", "flashinfer", "cuda", "specscope")


def bundle_steps(reader: TraceReader, start: int, stop: int | None) -> list[int]:
    """Step indexes a bundle of [start, stop) holds: those steps plus the captures their replays came from."""
    chosen = [s.index for s in reader.iter_summaries(start, stop)]
    extra = {c for i in chosen if (c := reader.capture_of(i)) is not None}
    return sorted(set(chosen) | extra)


def environment(reader: TraceReader) -> dict[str, Any]:
    """GPU, versions, git commit and host from the run record, and what the recorder did not record."""
    run = reader.run
    v = run.versions
    cfg = run.config
    env: dict[str, Any] = {
        "device": run.device, "device_capability": run.device_capability, "attention_kernel": run.attention_kernel,
        "versions": dict(v), "git_commit": run.git_commit, "git_dirty": cfg.get("git_dirty", v.get("git_dirty")),
        "nvidia_driver": v.get("nvidia_driver", v.get("driver")), "hostname": run.hostname,
        "run_start_ns": run.start_ns, "dtype": cfg.get("dtype"), "schema_version": reader.schema_version,
    }  # fmt: skip
    missing = []
    gpu = run.device != "cpu"
    for k in _ENV_WANTED:
        if k not in v and not (k in ("flashinfer", "cuda") and not gpu):
            missing.append(f"versions[{k!r}]")
    if run.git_commit is None:
        missing.append("git_commit (RunInfo.git_commit is null: the run was not from a git checkout, or git failed)")
    if env["git_dirty"] is None:
        missing.append("git dirty flag (the recorder should add versions['git_dirty'] = 'true'/'false' from "
                       "`git status --porcelain`)")
    if gpu and env["nvidia_driver"] is None:
        missing.append("NVIDIA driver version (the recorder should add versions['nvidia_driver'] from "
                       "torch.cuda / nvidia-smi --query-gpu=driver_version)")
    env["not_recorded"] = missing
    return env


def _violation_dict(v: Violation) -> dict[str, Any]:
    return {k: val for k, val in v.to_dict().items() if val is not None}


ATTENTION_CHOICES = ("all", "flagged", "none")


def _without_attention(step: Step) -> Step:
    return dataclasses.replace(step, arrays=tuple(a for a in step.arrays if not a.name.startswith("attn_")))


def write_bundle(reader: TraceReader, out: str, start: int, stop: int | None, *, trace_path: str | None = None,
                 export_command: str | None = None, attention: str = "all", delta_kv: bool = True) -> dict[str, Any]:
    """Write a bundle of steps [start, stop) of `reader` to `out` (.zip); returns its manifest.

    `attention` says which recorded attention calls travel (they dominate the size: layer 0's KV pages of every
    live row, per step): "all", "flagged" (only steps the catalogue flags) or "none". `delta_kv=False` keeps
    every call's full attn_kv (the format-1 layout; for size comparisons)."""
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"attention must be one of {ATTENTION_CHOICES}, not {attention!r}")
    from ..checks import Checker
    from .perfetto import write_perfetto

    indexes = bundle_steps(reader, start, stop)
    if not indexes:
        raise ValueError(f"no steps in {start}:{'' if stop is None else stop} (the trace has "
                         f"{reader.steps_text()})")
    work = tempfile.mkdtemp(prefix="specscope-bundle-")
    try:
        db = os.path.join(work, TRACE_NAME)
        checker = Checker()
        found: list[Violation] = []
        request_ids: set[int] = set()
        dropped: list[int] = []
        coder = _KVCoder(reader, delta_kv)
        with TraceWriter(db, reader.run) as w:
            w.copy_end(reader.end_state())  # the bundle says how the run it was cut from ended
            for i in indexes:
                step: Step = reader.step(i)  # under its own index: the gaps are the steps left out
                request_ids.update(r.request_id for r in step.requests)
                if attention == "none":
                    step = _without_attention(step)
                got = checker.feed(step)
                found.extend(got)
                if attention == "flagged" and not got and step.array("attn_q") is not None:
                    # Unflagged: its calls agreed (else D1/D2 would flag it), so the bundle's verdicts stay the same.
                    step = _without_attention(step)
                    dropped.append(i)
                w.write_step(coder.code(step, i))
            for rec in reader.requests():
                if rec.request_id in request_ids:
                    w.write_request(rec)
        chosen = set(indexes)
        in_range = {s.index for s in reader.iter_summaries(start, stop)}
        original = [v for v in reader.violations() if v.step in chosen]
        check = {
            "bundle_check": [_violation_dict(v) for v in found],
            "original_violations": [_violation_dict(v) for v in original],
            "note": "bundle_check: `specscope check` over the bundled steps (captures included); "
                    "original_violations: what the full trace held for these steps (recorder and checkers)",
        }
        env = environment(reader)
        cmd = reader.run.command
        src = trace_path or reader.path
        manifest = {
            "format": BUNDLE_FORMAT, "source_trace": os.path.basename(src), "steps": [start, stop],
            "step_numbers": "original", "original_steps": indexes, "captures_added": sorted(chosen - in_range),
            "num_steps": len(indexes), "num_violations_bundle_check": len(found),
            "num_violations_original": len(original),
            "attention_steps": _attention_steps(db), "attention": attention, "attention_dropped": dropped,
            "kv_chain": coder.chain if delta_kv else None, "kv_keyframes": coder.keyframes,
            "kv_chain_starts": coder.chain_starts,
            "kv_stored_bytes": coder.stored_bytes, "kv_full_bytes": coder.full_bytes, "export_command": export_command,
        }  # fmt: skip
        perfetto = os.path.join(work, "perfetto.json.gz")
        with TraceReader(db) as r2:
            write_perfetto(r2, perfetto, name=os.path.basename(out))
        readme = readme_text(os.path.basename(out), manifest, env, cmd, found)
        tmp = out + ".tmp"
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as z:
            z.writestr("README.md", readme)
            z.writestr(MANIFEST, json.dumps(manifest, indent=1) + "\n")
            z.writestr("environment.json", json.dumps(env, indent=1) + "\n")
            z.writestr("command.txt", cmd + "\n")
            z.writestr("check.json", json.dumps(check, indent=1) + "\n")
            z.write(db, TRACE_NAME)
            z.write(perfetto, "perfetto.json.gz", compress_type=zipfile.ZIP_STORED)
        os.replace(tmp, out)
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)


class _KVCoder:
    """Replaces each bundled call's `attn_kv` by the token rows that differ from what the earlier bundled calls of
    the same model hold for those pages, repeated rows as references (tracer/kv_delta.py)."""

    def __init__(self, reader: TraceReader, delta: bool = True) -> None:
        self.reader = reader
        self.delta = delta  # False: every call keeps its full attn_kv (no chain)
        self.chain = secrets.randbits(62)  # names this bundle's chain, so cached calls of other bundles never match
        self.last: dict[str, tuple[int, kv_delta.Pages]] = {}  # model -> its last bundled call, page store after it
        self.keyframes: list[int] = []  # calls stored with their full attn_kv
        self.chain_starts: list[int] = []  # the first bundled call of each model
        self.stored_bytes = 0
        self.full_bytes = 0

    def code(self, step: Step, original: int) -> Step:
        """The step with its KV delta-coded (steps without a recorded call pass through)."""
        page_ids = step.array("attn_page_ids")
        if step.array("attn_q") is None or page_ids is None:
            return step
        # A source that is itself a bundle: its delta-coded calls resolve through its own reader.
        kv = stored_kv(dataclasses.replace(step, index=original), self.reader.kv_base)
        ids = np.asarray(page_ids.values).astype(np.int64)
        keep = tuple(a for a in step.arrays if a.name not in kv_delta.KV_ARRAYS or a.name == "attn_page_ids")
        self.full_bytes += kv.nbytes
        if not self.delta:
            self.stored_bytes += kv.nbytes
            self.keyframes.append(step.index)
            return dataclasses.replace(step, arrays=(*keep, kv_delta.delta_arrays(0, 0, None, kv)[0]))
        prev = self.last.get(step.model)
        coded = kv_delta.encode(ids, kv, {} if prev is None else prev[1])
        if coded is None:
            self.keyframes.append(step.index)
        if prev is None:
            self.chain_starts.append(step.index)
        self.last[step.model] = (step.index, kv_delta.advance({} if prev is None else prev[1], ids, kv))
        new = kv_delta.delta_arrays(self.chain, kv_delta.NO_BASE if prev is None else prev[0], coded, kv)
        self.stored_bytes += sum(a.values.nbytes for a in new)
        # Byte planes (kv_delta.to_planes) for the float payloads: their high bytes compress apart from the low.
        arrays = [dataclasses.replace(a, values=kv_delta.to_planes(np.asarray(a.values)))
                  if a.name in kv_delta.PLANED and np.asarray(a.values).dtype.itemsize in (2, 4, 8) else a
                  for a in (*keep, *new)]
        marker = ArraySnapshot(kv_delta.PLANES, "uint8", (1,), 0, np.array([1], np.uint8))
        return dataclasses.replace(step, arrays=(*arrays, marker))


def bundle_summary(reader: TraceReader) -> dict[str, Any] | None:
    """What `info` says about a bundle (None for a plain trace): the .zip it was opened from, the trace and range
    of steps it was cut from, the captures it adds, and how its steps are numbered."""
    if reader.bundle_path is None:
        return None
    m = read_manifest(reader.bundle_path) or {}
    orig = [int(i) for i in m.get("original_steps") or []]
    added = [int(i) for i in m.get("captures_added") or []]
    chosen = [i for i in orig if i not in set(added)]
    rng = m.get("steps") if isinstance(m.get("steps"), list) else None
    out: dict[str, Any] = {
        "path": reader.bundle_path, "format": m.get("format"), "source_trace": m.get("source_trace"),
        "range": rng, "first_step": chosen[0] if chosen else None, "last_step": chosen[-1] if chosen else None,
        "captures_added": added, "step_numbers": "bundle" if renumbered(m) else "original",
    }  # fmt: skip
    if renumbered(m):
        out["original_steps"] = orig  # bundle step i is original step original_steps[i]
    return out


def bundle_summary_line(b: dict[str, Any]) -> str:
    """One line for `info`'s text: `bundle of steps 30–59 of cpu.db (+ captures 2, 5), numbered as in that trace`."""
    from ..query import index_runs_text

    src = b.get("source_trace") or "the original trace"
    what = f"steps {b['first_step']}–{b['last_step']}" if b.get("first_step") is not None else "no steps"
    caps = f" (+ captures {index_runs_text(b['captures_added'])})" if b.get("captures_added") else ""
    if b.get("step_numbers") == "bundle":
        n = len(b.get("original_steps") or [])
        how = (f"; an older bundle: its steps are numbered 0–{n - 1}, bundle step i being step original_steps[i] "
               "of its bundle.json")
    else:
        how = ", numbered as in that trace"
    return f"bundle of {what} of {src}{caps}{how}"


def _attention_steps(db: str) -> list[int]:
    with TraceReader(db) as r:
        out = []
        for s in r.iter_summaries():
            st = r.step(s.index, arrays=("attn_q",))
            if st.arrays:
                out.append(s.index)
        return out


def _runs(indexes: list[int]) -> str:
    """`12, 40..47` style summary of the bundled indexes."""
    from ..query import index_runs

    runs = [str(a) if a == b else f"{a}..{b}" for a, b in index_runs(indexes)]
    return ", ".join(runs[:8]) + (", ..." if len(runs) > 8 else "")


def readme_text(name: str, manifest: dict[str, Any], env: dict[str, Any], command: str,
                found: list[Violation]) -> str:
    """The README.md inside a bundle: what it holds and what a maintainer runs."""
    a, b = manifest["steps"]
    attn = manifest["attention_steps"]
    first_attn = attn[0] if attn else None
    bad = {x.step for x in found}
    # Suggest the replay most worth running: a recorded call the differential check flagged, else one in a step
    # with any violation, else the first recorded call.
    diff_bad = sorted({x.step for x in found if x.check_id.startswith("D")} & set(attn))
    pick = (diff_bad or sorted(bad & set(attn)) or attn or [None])[0]
    v = env["versions"]
    lines = [
        "# specscope bug-report bundle", "",
        f"Steps {a}:{'' if b is None else b} of `{manifest['source_trace']}` ({manifest['num_steps']} steps, "
        f"captures added: {manifest['captures_added'] or 'none needed'}), recorded on **{env['device']}** "
        f"with the `{env['attention_kernel']}` attention kernels.", "",
        f"Steps keep their numbers from `{manifest['source_trace']}` (this bundle holds steps "
        f"{_runs(manifest['original_steps'])}), so every command below and every message speaks of the steps the "
        "report does.", "",
        "## What to run", "",
        "```bash",
        "pip install specscope            # or: pip install -e . in a specscope checkout (no GPU needed)",
        f"specscope info {name}          # run, config, steps, acceptance",
        f"specscope check {name}         # the invariant catalogue over these steps (exit 1: violations)",
    ]
    if first_attn is not None:
        lines.append(f"specscope replay {name} --step {pick}   # re-run the recorded attention call vs the reference")
        lines.append(f"specscope replay {name} --step {pick} --device cuda   # on a GPU: the run's flashinfer kernel")
    lines += [
        f"specscope tui {name}           # step through it (textual)",
        f"specscope web {name}           # dashboard on 127.0.0.1",
        "```", "",
        "`perfetto.json.gz` opens in https://ui.perfetto.dev (plan / compute / host tracks per model).", "",
        "## Verdicts", "",
    ]
    if found:
        by: dict[str, list[Violation]] = {}
        for x in found:
            by.setdefault(x.check_id, []).append(x)
        for cid, vs in sorted(by.items(), key=lambda kv: kv[1][0].step):
            lines.append(f"- **{cid}** ({len(vs)}x, first at step {vs[0].step}): {vs[0].message}")
    else:
        lines.append("- `specscope check` finds no violation in these steps.")
    lines += [
        "", f"Steps with a recorded attention call (replayable): {attn or 'none'}", "",
        "## Recorded with", "", "```bash", command, "```", "",
        *([f"Bundled with `{manifest['export_command']}`.", ""] if manifest.get("export_command") else []),
        "## Environment", "",
        f"- device: {env['device']} (capability {env['device_capability']}), kernels {env['attention_kernel']}, "
        f"dtype {env['dtype']}",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in sorted(v.items())),
        f"- specscope git commit: {env['git_commit']} (dirty: {env['git_dirty']})",
        f"- NVIDIA driver: {env['nvidia_driver']}",
    ]
    if env["not_recorded"]:
        lines.append("- not recorded by this specscope version: " + "; ".join(env["not_recorded"]))
    lines += ["", "Files: `trace.db` (a specscope trace), `check.json`, `environment.json`, `command.txt`, "
              "`perfetto.json.gz`, `bundle.json`.", ""]
    return "\n".join(lines)


def quote_command(argv: list[str]) -> str:
    """A command line, quoted for a shell."""
    return " ".join(shlex.quote(a) for a in argv)
