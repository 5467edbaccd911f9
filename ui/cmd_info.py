"""`specscope info TRACE`: what a trace holds (run, steps by mode, acceptance, text, violations)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `info` subcommand."""
    p = subparsers.add_parser("info", help="summarize a trace file", description=__doc__)
    p.add_argument("trace", metavar="TRACE", help="trace file (.db) written by `specscope run`")
    p.add_argument("--json", action="store_true", help="print the summary as JSON (prompt tails and outputs "
                                                       "decoded where a tokenizer is known)")
    p.add_argument("--text", action="store_true", help="also print each request's prompt tail and output as text")
    p.add_argument("--no-check", action="store_true",
                   help="do not run the invariant catalogue when the trace holds no checker verdicts "
                        "(info runs it on traces of up to 2,000 steps)")
    p.set_defaults(run=run)


def tokenizer_for(target_model: str | None) -> tuple[str, Callable[[Sequence[int]], str] | None]:
    """("bytes" | "tokenizers" | "ids", decode) for the trace's target model: byte-level for the embedded models
    (and any config.json that says so), the checkpoint's tokenizer.json through `tokenizers` when installed."""
    from specscope.backend.loader import EMBEDDED, decode_tokens, resolve_model_path, tokenizer_kind
    from specscope.backend.model_config import ModelConfig

    if not target_model:
        return "ids", None
    if target_model in EMBEDDED:
        return "bytes", decode_tokens
    try:
        folder = resolve_model_path(target_model)
        config = ModelConfig.from_json(folder / "config.json")
    except (ValueError, OSError):
        return "ids", None  # recorded on another machine, or the folder moved: ids only
    if tokenizer_kind(config) == "bytes":
        return "bytes", decode_tokens
    tok_file = folder / "tokenizer.json"
    if not tok_file.is_file():
        return "ids", None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return "ids", None
    try:
        tok = Tokenizer.from_file(os.fspath(tok_file))
    except Exception:  # noqa: BLE001 - a tokenizer.json this version cannot read: fall back to ids
        return "ids", None
    return "tokenizers", lambda ids: tok.decode(list(ids), skip_special_tokens=False)


def run(args: argparse.Namespace) -> int:
    """Print the summary of `args.trace`."""
    import json
    import sys

    from specscope.tracer.store import TraceReader
    from specscope.tracer.summary import format_summary, format_texts, summarize

    with TraceReader(args.trace) as reader:
        kind, decode = tokenizer_for(reader.run.target_model)
        d: dict[str, Any] = summarize(reader, decode=decode, tokenizer=kind, run_checks=not args.no_check)
    if args.json:
        sys.stdout.write(json.dumps(d, indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(format_summary(d) + ("\n" + format_texts(d) if args.text else ""))
    return 0
