"""Upstream parity: the same batches through SGLang's own `TRTLLMHAAttnBackend` (loaded by `sglang_loader`) and
through ours (backend/trtllm_mha_backend.py + backend/graph_runner.py): the sweep over page sizes and (K, T)
pairs, and the parity table (mode x phase x field) it gives. The batches and both backends are
`sglang_parity_harness`, the fields compared `sglang_parity_compare`, the mutation checks of the comparison
`sglang_parity_mutations`.

`python -m specscope.integrations.sglang_parity` prints the parity table (mode x field) that docs/fidelity.md
quotes; tests/unit/test_sglang_parity.py checks the doc is current.
"""

from __future__ import annotations

import argparse
import sys

from .sglang_loader import UpstreamSglang, load_upstream
from .sglang_package import SglangNotFound
from .sglang_parity_compare import FIELDS, Comparison
from .sglang_parity_harness import ALL_MODES, PHASES, run_parity
from .sglang_versions import facts_for

# Differences that are not bugs, by (mode, phase, field): the reason is in docs/fidelity.md.
DOCUMENTED: dict[tuple[str, str, str], str] = {}

SWEEP_PAGE_SIZES = (16, 32, 64, 128)
SWEEP_KT = ((2, 2), (4, 4), (4, 2), (4, 6), (6, 5), (3, 4), (5, 5))  # (K, T): T = K, T < K, T > K


def sweep(up: UpstreamSglang, *, iterations: int = 3, faults: frozenset[str] = frozenset()) -> list[Comparison]:
    """The parity sweep: page sizes 16-128 x (K, T) pairs with T = K, T < K and T > K."""
    out: list[Comparison] = []
    for p in SWEEP_PAGE_SIZES:
        for k, t in SWEEP_KT:
            out += run_parity(up, page_size=p, K=k, T=t, iterations=iterations, faults=faults)
    return out


def parity_table_body(cmps: list[Comparison], version: str) -> str:
    """The markdown table of `parity_table`, without its header line: one row per (mode, phase), one column per
    field; `=` equal, `≠` a difference (documented ones carry their note), `·` not applicable, `(absent)` a field
    this release's metadata does not have."""
    cols = [f for f in FIELDS]
    absent = set(facts_for(version).fields_absent)
    head = "| mode | phase | forwards | " + " | ".join(f"`{c}`" for c in cols) + " |"
    sep = "|" + "---|" * (3 + len(cols))
    lines = [head, sep]
    for mode in ALL_MODES:
        for phase in PHASES:
            sel = [c for c in cmps if c.mode == mode and c.phase == phase]
            if not sel:
                continue
            cells = []
            for f in cols:
                if f == "reuses_capture_tensors" and "replay" not in phase:
                    cells.append("·")
                    continue
                if f in absent:
                    cells.append("(absent)")
                    continue
                n = sum(f in c.differs for c in sel)
                note = DOCUMENTED.get((mode.value, phase, f))
                cells.append("=" if n == 0 else (f"≠ ({note})" if note else f"**≠ {n}**"))
            lines.append(f"| {mode.value} | {phase} | {len(sel)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def sweep_header(versions: str) -> str:
    """The line naming what a sweep covered, for `versions` (one release or several)."""
    pks = ", ".join(str(p) for p in SWEEP_PAGE_SIZES)
    kts = ", ".join(f"K={k} T={t}" for k, t in SWEEP_KT)
    return f"sglang {versions}, page sizes {pks}; {kts}; batch sizes 1-8 over the capture ladder 1, 2, 4, 8.\n"


def parity_table(cmps: list[Comparison], version: str) -> str:
    """Markdown: the sweep's header line, then `parity_table_body`."""
    return sweep_header(version) + "\n" + parity_table_body(cmps, version)



def main(argv: list[str] | None = None) -> int:
    """Print the parity table for the installed sglang (or `--sglang DIR`)."""
    ap = argparse.ArgumentParser(prog="python -m specscope.integrations.sglang_parity", description=main.__doc__)
    ap.add_argument("--sglang", help="folder holding an unpacked sglang wheel (default: the installed one)")
    ap.add_argument("--verbose", action="store_true", help="also print every differing forward")
    a = ap.parse_args(argv)
    try:
        up = load_upstream(a.sglang)
    except SglangNotFound as e:
        print(f"specscope: error: {e}", file=sys.stderr)
        return 2
    cmps = sweep(up)
    print(parity_table(cmps, up.version), end="")
    if a.verbose:
        for c in cmps:
            if c.differs:
                print(c.describe(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
