"""Acceptance across steps: each verify row's accept length and tokens (I31), the lengths a request commits (I32),
and stretches of verifies that accept only the bonus token (I35)."""

from __future__ import annotations

from ..schema import ForwardMode, RequestState
from .catalogue import BONUS_ONLY_VERIFIES, COLLAPSE_VERIFIES
from .context import Ctx, cell, short


class Acceptance:
    """I31 per verify row, I32 across iterations, I35 over stretches of verifies."""

    def __init__(self, greedy: bool | None) -> None:
        self.greedy = greedy
        self.committed: dict[int, tuple[int, int, int, int]] = {}  # request id -> (iteration, seq_len, step, row)
        self.stretch_bonus: list[int] = []  # consecutive verify steps where every row accepted only the bonus
        self.stretch_token: list[int] = []  # ... where also every row drafted one repeated token

    def gap(self) -> None:
        """Steps are missing before the next one: forget what needs the step before it."""
        self.committed.clear()
        self.stretch_bonus, self.stretch_token = [], []

    def check(self, c: Ctx) -> None:
        """Judge `c`'s rows against what earlier steps committed; judge a verify's acceptance."""
        s = c.step
        if s.iteration < 0:
            return
        for b, r in enumerate(s.requests):
            last = self.committed.get(r.request_id)
            if last is not None and s.iteration > last[0] and r.seq_len_before != last[1]:
                c.v("I32", f"seq_len_before = {r.seq_len_before}, but step {last[2]} (iteration {last[0]}) committed "
                           f"{last[1]}", r.request_id, array="seq_len_before", row=b, found=r.seq_len_before,
                    expected=last[1], related=[cell("seq_len_after", last[3], None, last[1], last[2])])
        # A recorder that could not see acceptance (SGLang's backend never learns it) says so; there is then no
        # recorded value to judge, which is not the same as a recorded accept length of 0.
        if s.mode == ForwardMode.TARGET_VERIFY and s.scalars.get("acceptance_recorded", 1) != 0:
            for b, r in enumerate(s.requests):
                self._row(c, b, r)
            self._collapse(c)
        if s.mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DECODE, ForwardMode.EXTEND):
            for b, r in enumerate(s.requests):
                self.committed[r.request_id] = (s.iteration, r.seq_len_after, s.index, b)

    def _row(self, c: Ctx, b: int, r: RequestState) -> None:
        T, n = c.step.tokens_per_request, r.accept_length
        rid = r.request_id
        if not 1 <= n <= T:
            c.v("I31", f"accept length {n} outside 1..T = {T}", rid, array="accept_length", row=b, found=n,
                expected=f"1..{T}")
            return
        if r.seq_len_after != r.seq_len_before + n:
            c.v("I31", f"seq_len_after = {r.seq_len_after} but seq_len_before {r.seq_len_before} + accept length "
                       f"{n} = {r.seq_len_before + n}", rid, array="seq_len_after", row=b,
                found=r.seq_len_after, expected=r.seq_len_before + n)
            return
        acc, drafts = list(r.accepted_tokens), list(r.draft_tokens)
        if not acc:
            return  # a recorder that keeps lengths only
        if len(acc) != n:
            c.v("I31", f"{len(acc)} accepted tokens recorded for accept length {n}", rid, array="accepted_tokens",
                row=b, found=len(acc), expected=n)
            return
        if drafts and acc[:-1] != drafts[: n - 1]:
            t = next(i for i, (x, y) in enumerate(zip(acc[:-1], drafts, strict=False)) if x != y) \
                if any(x != y for x, y in zip(acc[:-1], drafts, strict=False)) else len(drafts)
            c.v("I31", f"accepted tokens {short(acc)} are not the drafts {short(drafts)} up to the last one",
                rid, array="accepted_tokens", row=b, col=t, found=acc[t] if t < len(acc) else None,
                expected=drafts[t] if t < len(drafts) else None)
            return
        if self.greedy and drafts and n - 1 < len(drafts) and acc[-1] == drafts[n - 1]:
            c.v("I31", f"greedy acceptance stopped at draft {n - 1} although the target's token {acc[-1]} equals it",
                rid, array="accepted_tokens", row=b, col=n - 1, found=acc[-1], expected=f"!= {drafts[n - 1]}")

    def _collapse(self, c: Ctx) -> None:
        """Combined evidence over a short window: every row drafted one repeated token *and* accepted only the
        bonus (a draft that collapsed onto one token the target rejects). Repeated drafts alone are legal text
        (the target accepts them); a bonus-only stretch alone needs a longer window."""
        s = c.step
        if not s.requests or s.tokens_per_request < 2:
            return
        bonus = all(r.accept_length == 1 for r in s.requests)
        self.stretch_bonus = self.stretch_bonus + [s.index] if bonus else []
        repeated = all(len(r.draft_tokens) >= 2 and len(set(r.draft_tokens)) == 1 for r in s.requests)
        self.stretch_token = self.stretch_token + [s.index] if bonus and repeated else []
        if len(self.stretch_token) == COLLAPSE_VERIFIES:
            toks = sorted({r.draft_tokens[0] for r in s.requests})
            c.v("I35", f"{COLLAPSE_VERIFIES} verifies in a row (steps {self.stretch_token[0]}..{s.index}) where every "
                       f"row drafted one repeated token ({short(toks)}) and accepted only the bonus: the draft "
                       "collapsed", array="draft_tokens", row=0, found=s.requests[0].draft_tokens,
                expected="varied drafts or accepted ones",
                related=[cell("accept_length", b, None, r.accept_length) for b, r in enumerate(s.requests)])
        if len(self.stretch_bonus) == BONUS_ONLY_VERIFIES and len(self.stretch_token) < COLLAPSE_VERIFIES:
            c.v("I35", f"{BONUS_ONLY_VERIFIES} verifies in a row (steps {self.stretch_bonus[0]}..{s.index}) where "
                       "every row accepted only the bonus token: the draft is useless or the verify attends wrongly",
                array="accept_length", found=1, expected="> 1 somewhere")
