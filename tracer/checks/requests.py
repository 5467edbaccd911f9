"""A request across steps: the steps of one iteration agree on its length, window and pages (I40), and a committed
position keeps its page for the request's life (I41)."""

from __future__ import annotations

from ..schema import ForwardMode
from .context import R2T, Ctx, cell


class Requests:
    """I40 (the steps of one iteration agree per request) and I41 (a committed position keeps its page for life).

    Per request it keeps the page start of every logical page some step read (req_to_token), with the step,
    row and iteration that recorded it. A later step must read the same page where one of its own iteration read
    it (I40: within an iteration nothing is committed or freed between draft, verify and draft extend) or where
    the page holds committed positions (I41: j * P < the step's S). An extend starts a new life (a re-prefill after
    retraction may take its prefix from other cached pages)."""

    PRUNE = 256  # iterations a request may be absent before its pages are forgotten

    def __init__(self) -> None:
        # request id -> per logical page: slot of its first position, and the step, row and iteration that read it
        self.pages: dict[int, tuple[list[int], list[int], list[int], list[int]]] = {}
        self.seen: dict[int, int] = {}  # request id -> last iteration
        self.iteration: int | None = None
        self.start: dict[int, tuple[int, int, int, str]] = {}  # request id -> (length, step, row, field)
        self.window: dict[int, tuple[int, int, int, int]] = {}  # request id -> (T, accept length, step, row)
        self.pruned_at = 0

    def gap(self) -> None:
        """Steps are missing: forget the iteration; committed pages stay (a committed slot never moves)."""
        self.iteration = None
        self.start, self.window = {}, {}

    def check(self, c: Ctx) -> None:
        """Judge `c`'s rows against the steps of this iteration and the request's committed pages."""
        s = c.step
        if s.iteration < 0 or not s.requests:
            return
        if s.iteration != self.iteration:
            self.iteration, self.start, self.window = s.iteration, {}, {}
            if s.iteration - self.pruned_at >= self.PRUNE:
                self.pruned_at = s.iteration
                for rid in [r for r, it in self.seen.items() if s.iteration - it > self.PRUNE]:
                    del self.seen[rid]
                    self.pages.pop(rid, None)
        self._lengths(c)
        starts = c.arr(R2T)
        got = c.reads() if starts is not None else None
        if got is None or starts is None or starts.ndim != 2 or starts.shape[1] != got[2].shape[1]:
            for r in s.requests:
                self.seen[r.request_id] = s.iteration
            return
        _, n, _ = got
        p, it = s.page_size, s.iteration
        table = starts.tolist()  # short rows: Python lists compare faster than one numpy call per row
        for b, r in enumerate(s.requests):
            rid = r.request_id
            self.seen[rid] = it
            nb = int(n[b])
            row = table[b][:nb]
            held = self.pages.get(rid)
            if held is not None and s.mode == ForwardMode.EXTEND and max(held[3], default=-1) < it:
                held = None  # a new life
            if held is None:
                self.pages[rid] = (row, [s.index] * nb, [b] * nb, [it] * nb)
                continue
            known, steps, rows, iters = held
            m = min(nb, len(known))
            if known[:m] != row[:m]:
                for j in range(m):
                    if known[j] == row[j] or not (iters[j] == it or j * p < r.seq_len_before):
                        continue
                    was = steps[j]
                    if iters[j] == it:
                        c.v("I40", f"req_to_token maps logical page {j} to slot {row[j]}, but step {was} of this "
                                   f"iteration read slot {known[j]} there: the steps of one iteration read "
                                   "different KV", rid, array=R2T, row=b, col=j, found=row[j], expected=known[j],
                            related=[cell(R2T, rows[j], j, known[j], was)])
                    else:
                        c.v("I41", f"req_to_token maps logical page {j} (committed positions {j * p}.."
                                   f"{min((j + 1) * p, r.seq_len_before) - 1}) to slot {row[j]}, but step {was} "
                                   f"read slot {known[j]} there: committed KV moved while the request lives",
                            rid, array=R2T, row=b, col=j, found=row[j], expected=known[j],
                            related=[cell(R2T, rows[j], j, known[j], was)])
                    break
            if nb > len(known):
                known.extend(row[len(known):])
                steps.extend([s.index] * (nb - len(steps)))
                rows.extend([b] * (nb - len(rows)))
                iters.extend([it] * (nb - len(iters)))
            known[:nb] = row
            steps[:nb] = [s.index] * nb
            rows[:nb] = [b] * nb
            iters[:nb] = [it] * nb

    def _lengths(self, c: Ctx) -> None:
        """I40's lengths and window: one starting length per request and iteration; draft extend re-runs the
        verify's window (T tokens, spec v2) or its accepted tokens (spec v1)."""
        s = c.step
        for b, r in enumerate(s.requests):
            rid = r.request_id
            if s.mode == ForwardMode.EXTEND:
                have = self.start.get(rid)
                if have is None:
                    self.start[rid] = (r.seq_len_after, s.index, b, "seq_len_after")
                elif have[0] != r.seq_len_after:
                    c.v("I40", f"seq_len_after = {r.seq_len_after}, but step {have[1]} of this iteration made it "
                               f"{have[0]}", rid, array="seq_len_after", row=b, found=r.seq_len_after,
                        expected=have[0], related=[cell(have[3], have[2], None, have[0], have[1])])
                continue
            have = self.start.get(rid)
            if have is None:
                self.start[rid] = (r.seq_len_before, s.index, b, "seq_len_before")
            elif have[0] != r.seq_len_before:
                c.v("I40", f"seq_len_before = {r.seq_len_before}, but step {have[1]} of this iteration started this "
                           f"request at {have[0]}: the draft, verify and draft extend disagree on its length", rid,
                    array="seq_len_before", row=b, found=r.seq_len_before, expected=have[0],
                    related=[cell(have[3], have[2], None, have[0], have[1])])
            if s.mode == ForwardMode.TARGET_VERIFY:
                self.window[rid] = (s.tokens_per_request, r.accept_length, s.index, b)
            elif s.mode == ForwardMode.DRAFT_EXTEND and rid in self.window:
                T, acc, at, vb = self.window[rid]
                if r.num_q_tokens not in (T, acc):
                    c.v("I40", f"the draft extend runs {r.num_q_tokens} query tokens, but step {at}'s verify ran T = "
                               f"{T} and accepted {acc}", rid, array="num_q_tokens", row=b, found=r.num_q_tokens,
                        expected=f"{T} (or {acc})", related=[cell("tokens_per_request", None, None, T, at),
                                                             cell("accept_length", vb, None, acc, at)])
