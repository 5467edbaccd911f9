"""What a trace holds, in one dict (for `specscope info --json`) and as readable text."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from .reader import TraceReader
from .schema import ForwardMode

Decoder = Callable[[Sequence[int]], str]
PROMPT_TAIL = 64  # tokens of each prompt shown before the output
# `info` runs the invariant catalogue itself (it decodes every step's arrays) up to this many steps.
CHECK_LIMIT = 2_000  # ~1-4 ms per step on a 2-core CPU: a few seconds at most


def summarize(reader: TraceReader, *, decode: Decoder | None = None, tokenizer: str = "ids",
              run_checks: bool = True) -> dict[str, Any]:
    """Summary of a trace from header columns and SQL aggregates; `decode` turns token ids into text, and
    without catalogue verdicts in the trace (and `run_checks`) the catalogue runs here, up to CHECK_LIMIT steps."""
    stats = reader.step_stats()
    hist = reader.accept_histogram()
    rows = sum(hist)
    accepted = sum(n * c for n, c in enumerate(hist))
    accepted_drafts = accepted - sum(hist[1:])  # every row with accept length >= 1 carries one bonus token
    k = stats["max_verify_draft_tokens"]
    # Real K is a handful; the cap keeps a damaged max(num_draft_tokens) from building a giant list.
    positions = min(max((k or 0) - 1, 0), 4096)
    # Draft token j (0-based) was accepted in a row when the row accepted more than j drafts,
    # i.e. accept_length - 1 > j (accept_length counts the bonus token too).
    rate = [sum(hist[j + 2 :]) / rows if rows else 0.0 for j in range(positions)]
    reqs = reader.requests()
    violations_by_id, violations_source = _violations(reader, stats["steps"] or 0, run_checks)
    run = reader.run
    start, end = stats["first_start_ns"], stats["last_end_ns"]
    # Graph captures run before the first iteration (recorded as iteration -1): count what `run` counts.
    served = [int(k) for k in reader.count_steps_by("iteration") if int(k) >= 0]
    drafted = stats["num_drafted_tokens"] or 0
    texts = [_request_text(r.prompt_tokens, r.output_tokens, decode) for r in reqs]
    out_chars = sum(len(t["output_text"]) for t in texts if t["output_text"] is not None)
    out_ws = sum(t["_ws"] for t in texts)
    from .export.bundle import bundle_summary

    bundle = bundle_summary(reader)
    return {
        "path": reader.display_path,
        **({"bundle": bundle} if bundle is not None else {}),
        "schema_version": reader.schema_version,
        "is_closed": reader.is_closed(),
        "end_state": reader.end_state().to_dict(),
        "run": run.to_dict(),
        "device": run.device,
        "steps": stats["steps"],
        "iterations": max(served) + 1 if served else 0,
        "duration_ns": (end - start) if start is not None and end is not None else None,
        "steps_by_mode": _ordered_modes(reader.count_steps_by("mode")),
        "steps_by_graph": reader.count_steps_by("graph"),
        "steps_by_model": reader.count_steps_by("model"),
        "num_verify_rows": rows,
        "mean_accept_length": (accepted / rows) if rows else None,
        "mean_accept_length_includes_bonus": True,
        "draft_acceptance": (accepted_drafts / drafted) if drafted else None,
        "accept_length_histogram": hist,
        "accept_rate_by_position": rate,
        "num_violations": sum(violations_by_id.values()),
        "violations_by_id": dict(sorted(violations_by_id.items(), key=lambda kv: _natural(kv[0]))),
        "violations_source": violations_source,
        "gpu_clock": gpu_clock(reader.meta()) if run.device != "cpu" else None,
        "text": {
            "tokenizer": tokenizer if decode is not None else "ids",
            "output_chars": out_chars if decode is not None else None,
            "output_whitespace_share": (out_ws / out_chars) if decode is not None and out_chars else None,
        },
        "requests": [
            {
                "id": r.request_id,
                "prompt_len": len(r.prompt_tokens),
                "output_tokens": list(r.output_tokens),
                "num_output_tokens": len(r.output_tokens),
                "finish_reason": r.finish_reason,
                **{k: v for k, v in t.items() if not k.startswith("_")},
            }
            for r, t in zip(reqs, texts, strict=True)
        ],
        "tokens": {
            "num_prompt_tokens": sum(len(r.prompt_tokens) for r in reqs),
            "num_output_tokens": sum(len(r.output_tokens) for r in reqs),
            "num_query_tokens": stats["num_query_tokens"],
            "num_drafted_tokens": stats["num_drafted_tokens"],
            "num_accepted_tokens": accepted,  # committed by verifies: accepted drafts + one bonus per row
            "num_accepted_draft_tokens": accepted_drafts,
        },
    }


def _violations(reader: TraceReader, num_steps: int, run_checks: bool) -> tuple[dict[str, int], str]:
    """Counts by check id, and where they come from: "trace" (a checker stored its verdicts in the violations
    table), "catalogue" (run now), or "unchecked" (only what the engine recorded: --no-check, or too many steps)."""
    table = reader.count_violations_by_id()
    if reader.violations(source="check"):
        return table, "trace"
    if not run_checks or num_steps > CHECK_LIMIT:
        return table, "unchecked"
    from .checks import check_steps

    return dict(Counter(v.check_id for v in check_steps(reader.steps()))), "catalogue"


def _request_text(prompt: Sequence[int], output: Sequence[int], decode: Decoder | None) -> dict[str, Any]:
    if decode is None:
        return {"prompt_tail_text": None, "output_text": None, "output_whitespace_share": None, "_ws": 0}
    out = decode(list(output))
    ws = sum(ch.isspace() for ch in out)
    return {"prompt_tail_text": decode(list(prompt[-PROMPT_TAIL:])), "output_text": out,
            "output_whitespace_share": ws / len(out) if out else None, "_ws": ws}


def escape(text: str) -> str:
    """One line: newlines, tabs and control characters escaped, everything else as is."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _natural(check_id: str) -> tuple[str, int, str]:
    # "I5" before "I16".
    head = check_id.rstrip("0123456789")
    tail = check_id[len(head) :]
    return (head, int(tail) if tail else -1, check_id)


def _ordered_modes(counts: dict[str, int]) -> dict[str, int]:
    order = [m.value for m in ForwardMode]
    return dict(sorted(counts.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else 99, kv[0])))


def gpu_clock(meta: dict[str, str]) -> dict[str, Any] | None:
    """The stamp clock's offset brackets the recorder wrote (`meta` stamp_clock_start / stamp_clock_end) and the
    drift between them (what it means on a GPU run: `summarize` leaves CPU runs out); None without them (older
    traces, SGLang's)."""
    def bracket(key: str) -> tuple[int, int, int] | None:
        try:
            v = json.loads(meta[key])
            return int(v["bracket_ns"]), int(v["at_ns"]), int(v["offset_ns"])
        except (KeyError, ValueError, TypeError):
            return None

    a, b = bracket("stamp_clock_start"), bracket("stamp_clock_end")
    if a is None:
        return None
    out: dict[str, Any] = {"start_bracket_us": a[0] / 1e3, "start_offset_ns": a[2]}
    if b is not None and b[1] > a[1]:
        elapsed, drift = b[1] - a[1], b[2] - a[2]
        out.update(end_bracket_us=b[0] / 1e3, end_offset_ns=b[2], elapsed_s=elapsed / 1e9, drift_us=drift / 1e3,
                   drift_ppm=drift / elapsed * 1e6)
    return out


def format_summary(d: dict[str, Any]) -> str:
    """Human-readable text of a `summarize` dict."""
    run = d["run"]
    end = d.get("end_state") or {}
    state = end.get("label") or ("closed" if d["is_closed"] else "live or unclosed")
    out = [f"trace    {d['path']}  (schema {d['schema_version']}, {state})"]
    if d.get("bundle"):
        from .export.bundle import bundle_summary_line

        out.append(f"         {bundle_summary_line(d['bundle'])}")
    out.append(f"command  {run['command']}")
    out.append(f"models   target={run['target_model']}  draft={run['draft_model'] or '-'}")
    cap = f" (sm {run['device_capability']})" if run.get("device_capability") else ""
    out.append(f"device   {d['device']}{cap}   kernel {run['attention_kernel']}")
    if run.get("git_commit") or run.get("hostname"):
        out.append(f"host     {run.get('hostname') or '-'}   git {run.get('git_commit') or '-'}")
    if run.get("versions"):
        out.append("versions " + "  ".join(f"{k} {v}" for k, v in sorted(run["versions"].items())))
    if run.get("config"):
        out.append("config   " + "  ".join(f"{k}={v}" for k, v in sorted(run["config"].items())))
    dur = d.get("duration_ns")
    dur_s = f", {dur / 1e9:.3f} s" if dur is not None else ""
    out.append("")
    clock = d.get("gpu_clock")
    if clock:
        line = f"clock    GPU stamps on the host clock by an offset bracketed to {clock['start_bracket_us']:.1f} us"
        if clock.get("drift_us") is not None:
            line += (f"; by close it had moved {clock['drift_us']:+.1f} us ({clock['drift_ppm']:+.2f} ppm over "
                     f"{clock['elapsed_s']:.1f} s, bracket {clock['end_bracket_us']:.1f} us): GPU spans against host "
                     "times are off by up to that (against each other they are exact)")
        elif d["is_closed"]:
            why = end["label"] if end.get("recorded") and end.get("state") != "closed" else "the run ended on an error"
            line += f"; no bracket at close ({why})"
        else:
            line += "; no bracket at close yet (live, or the run was killed)"
        out.append(line)
    out.append(f"steps    {d['steps']} in {d['iterations']} iterations{dur_s}")
    for mode, n in d["steps_by_mode"].items():
        out.append(f"  {mode:<14} {n:>9}")
    if d["steps_by_graph"]:
        out.append("graph    " + "  ".join(f"{k}={v}" for k, v in sorted(d["steps_by_graph"].items())))
    if end:
        out.append(f"end      {end['description']}")
    out.append("")
    mal = d["mean_accept_length"]
    if mal is None:
        out.append("accept   no TARGET_VERIFY steps")
    else:
        out.append(f"accept   mean accept length {mal:.3f} over {d['num_verify_rows']} verify rows "
                   "(tokens committed per verify, bonus token included)")
        if d.get("draft_acceptance") is not None:
            t = d["tokens"]
            out.append(f"         draft acceptance {d['draft_acceptance'] * 100:.1f}% = "
                       f"{t['num_accepted_draft_tokens']} accepted / {t['num_drafted_tokens']} drafted tokens "
                       "(bonus excluded)")
        for j, r in enumerate(d["accept_rate_by_position"]):
            bar = "#" * round(r * 40)
            out.append(f"  draft {j:<3} {r * 100:6.1f}%  {bar}")
    t = d["tokens"]
    out.append(
        f"tokens   prompt {t['num_prompt_tokens']}  output {t['num_output_tokens']}  "
        f"forward {t['num_query_tokens']}  drafted {t['num_drafted_tokens']}  "
        f"accepted drafts {t['num_accepted_draft_tokens']}  committed by verify {t['num_accepted_tokens']} "
        "(bonus included)"
    )
    txt = d.get("text") or {}
    ws = txt.get("output_whitespace_share")
    ws_s = f"; output is {ws * 100:.1f}% whitespace ({txt['output_chars']} characters)" if ws is not None else ""
    out.append(f"requests {len(d['requests'])}   tokenizer {txt.get('tokenizer', 'ids')}{ws_s}")
    out.append("")
    src = {"trace": "from the trace's violations table",
           "catalogue": "the invariant catalogue, run now",
           "unchecked": f"recorded during the run only; the catalogue was not run (--no-check, or more than "
                        f"{CHECK_LIMIT:,} steps): specscope check {d['path']}"}.get(d.get("violations_source", "trace"),
                                                                                  "")
    if d["num_violations"]:
        by = "  ".join(f"{k}={v}" for k, v in d["violations_by_id"].items())
        more = "" if d.get("violations_source") == "unchecked" else f"; details: specscope check {d['path']}"
        out.append(f"violations {d['num_violations']}  ({by})  [{src}{more}]")
    else:
        out.append(f"violations 0  [{src}]")
    return "\n".join(out) + "\n"


def format_texts(d: dict[str, Any]) -> str:
    """Each request's prompt tail and output as text (escaped, one line each), for `info --text`."""
    txt = d.get("text") or {}
    if txt.get("tokenizer", "ids") == "ids":
        head = "text     no tokenizer for this model (token ids shown)"
    else:
        ws = txt.get("output_whitespace_share")
        head = f"text     tokenizer {txt['tokenizer']}" + (f"; output {ws * 100:.1f}% whitespace" if ws is not None
                                                          else "")
    out = [head]
    for r in d["requests"]:
        ws = r.get("output_whitespace_share")
        ws_s = f"  whitespace {ws * 100:.1f}%" if ws is not None else ""
        out.append(f"request {r['id']}  prompt {r['prompt_len']} tokens  output {r['num_output_tokens']} tokens "
                   f"({r['finish_reason'] or 'unfinished'}){ws_s}")
        if r.get("output_text") is None:
            out.append(f"  output ids {r['output_tokens']}")
            continue
        more = "…" if r["prompt_len"] > PROMPT_TAIL else ""
        out.append(f"  prompt {more}\"{escape(r['prompt_tail_text'])}\"")
        out.append(f"  output \"{escape(r['output_text'])}\"")
    return "\n".join(out) + "\n"
