"""What a trace holds, in one dict (for `specscope info --json`) and as readable text."""

from __future__ import annotations

from typing import Any

from .reader import TraceReader
from .schema import ForwardMode


def summarize(reader: TraceReader) -> dict[str, Any]:
    """Summary of a trace from header columns and SQL aggregates (no array decoding; fine at 100k steps)."""
    stats = reader.step_stats()
    hist = reader.accept_histogram()
    rows = sum(hist)
    accepted = sum(n * c for n, c in enumerate(hist))
    k = stats["max_verify_draft_tokens"]
    # Real K is a handful; the cap keeps a damaged max(num_draft_tokens) from building a giant list.
    positions = min(max((k or 0) - 1, 0), 4096)
    # Draft token j (0-based) was accepted in a row when the row accepted more than j drafts,
    # i.e. accept_length - 1 > j (accept_length counts the bonus token too).
    rate = [sum(hist[j + 2 :]) / rows if rows else 0.0 for j in range(positions)]
    reqs = reader.requests()
    violations_by_id = reader.count_violations_by_id()
    run = reader.run
    start, end = stats["first_start_ns"], stats["last_end_ns"]
    return {
        "path": reader.path,
        "schema_version": reader.schema_version,
        "is_closed": reader.is_closed(),
        "run": run.to_dict(),
        "device": run.device,
        "steps": stats["steps"],
        "iterations": stats["iterations"],
        "duration_ns": (end - start) if start is not None and end is not None else None,
        "steps_by_mode": _ordered_modes(reader.count_steps_by("mode")),
        "steps_by_graph": reader.count_steps_by("graph"),
        "steps_by_model": reader.count_steps_by("model"),
        "num_verify_rows": rows,
        "mean_accept_length": (accepted / rows) if rows else None,
        "accept_length_histogram": hist,
        "accept_rate_by_position": rate,
        "num_violations": sum(violations_by_id.values()),
        "violations_by_id": dict(sorted(violations_by_id.items(), key=lambda kv: _natural(kv[0]))),
        "requests": [
            {
                "id": r.request_id,
                "prompt_len": len(r.prompt_tokens),
                "output_tokens": list(r.output_tokens),
                "num_output_tokens": len(r.output_tokens),
                "finish_reason": r.finish_reason,
            }
            for r in reqs
        ],
        "tokens": {
            "num_prompt_tokens": sum(len(r.prompt_tokens) for r in reqs),
            "num_output_tokens": sum(len(r.output_tokens) for r in reqs),
            "num_query_tokens": stats["num_query_tokens"],
            "num_drafted_tokens": stats["num_drafted_tokens"],
            "num_accepted_tokens": accepted,
        },
    }


def _natural(check_id: str) -> tuple[str, int, str]:
    # "I5" before "I16".
    head = check_id.rstrip("0123456789")
    tail = check_id[len(head) :]
    return (head, int(tail) if tail else -1, check_id)


def _ordered_modes(counts: dict[str, int]) -> dict[str, int]:
    order = [m.value for m in ForwardMode]
    return dict(sorted(counts.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else 99, kv[0])))


def format_summary(d: dict[str, Any]) -> str:
    """Human-readable text of a `summarize` dict."""
    run = d["run"]
    state = "closed" if d["is_closed"] else "live or unclosed"
    out = [f"trace    {d['path']}  (schema {d['schema_version']}, {state})"]
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
    out.append(f"steps    {d['steps']} in {d['iterations']} iterations{dur_s}")
    for mode, n in d["steps_by_mode"].items():
        out.append(f"  {mode:<14} {n:>9}")
    if d["steps_by_graph"]:
        out.append("graph    " + "  ".join(f"{k}={v}" for k, v in sorted(d["steps_by_graph"].items())))
    out.append("")
    mal = d["mean_accept_length"]
    if mal is None:
        out.append("accept   no TARGET_VERIFY steps")
    else:
        out.append(f"accept   mean accept length {mal:.3f} over {d['num_verify_rows']} verify rows")
        for j, r in enumerate(d["accept_rate_by_position"]):
            bar = "#" * round(r * 40)
            out.append(f"  draft {j:<3} {r * 100:6.1f}%  {bar}")
    t = d["tokens"]
    out.append(
        f"tokens   prompt {t['num_prompt_tokens']}  output {t['num_output_tokens']}  "
        f"forward {t['num_query_tokens']}  drafted {t['num_drafted_tokens']}  "
        f"accepted {t['num_accepted_tokens']}"
    )
    out.append(f"requests {len(d['requests'])}")
    out.append("")
    if d["num_violations"]:
        by = "  ".join(f"{k}={v}" for k, v in d["violations_by_id"].items())
        out.append(f"violations {d['num_violations']}  ({by})")
    else:
        out.append("violations 0")
    return "\n".join(out) + "\n"
