"""Prompts and arrival times for a run: held-out CPython stdlib text for byte-level models, random ids otherwise."""

from __future__ import annotations

import functools
import os
import random
import sysconfig
import zlib
from pathlib import Path

from .request import Request

_WHITESPACE = b" \t\n\r\f\v"
_PICK_TRIES = 64  # candidate cuts per prompt before taking the last one as is
# Same split as scripts/train_tiny.py: files with crc32(relpath) % 50 == 0 were never trained on.
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "lib2to3", "ensurepip", "turtledemo", "__pycache__"}


@functools.lru_cache(maxsize=1)
def held_out_text() -> bytes:
    """The held-out stdlib files, concatenated (a few hundred KB)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    rels = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in _SKIP_DIRS]  # prune site-packages before walking into it
        rels += [(Path(d) / f).relative_to(root).as_posix() for f in files if f.endswith(".py")]
    return b"\n".join((root / r).read_bytes() for r in sorted(rels) if zlib.crc32(r.encode()) % 50 == 0)


def good_cut(text: bytes, start: int, end: int) -> bool:
    """A prompt `text[start:end]` that starts at a line start and ends inside a line of code, after a
    non-blank byte: where a completion request is cut at the cursor. (Prompts that end in indentation or at a
    line end send the tiny target into whitespace runs: 55 % of its greedy output on the README run.)"""
    at_line_start = start == 0 or text[start - 1:start] == b"\n"
    return at_line_start and text[end - 1] not in _WHITESPACE and text[end:end + 1] not in (b"\n", b"")


def pick_prompt_start(text: bytes, n: int, rng: random.Random) -> int:
    """A seeded line start whose n-byte prompt is a `good_cut` (the last candidate when none is found)."""
    start = 0
    for _ in range(_PICK_TRIES):
        start = text.find(b"\n", rng.randrange(len(text) - n - 1)) + 1
        if start + n < len(text) and good_cut(text, start, start + n):
            return start
    return start


def make_requests(
    *, num_requests: int, max_new_tokens: int, seed: int, vocab_size: int, byte_level: bool,
    prompt_len: tuple[int, int], arrival_gap: tuple[int, int], stop_token_ids: frozenset[int],
) -> list[Request]:
    """Requests with seeded prompts and arrival iterations, so batch sizes change as they come and go."""
    rng = random.Random(seed)
    text = held_out_text() if byte_level else b""
    reqs, arrival = [], 0
    for i in range(num_requests):
        n = rng.randint(*prompt_len)
        if byte_level and len(text) > n + 1:
            start = pick_prompt_start(text, n, rng)
            prompt = list(text[start:start + n]) or [10]
        else:
            prompt = [rng.randrange(1, vocab_size) for _ in range(n)]
        reqs.append(Request(request_id=i, prompt=prompt, max_new_tokens=max_new_tokens,
                            arrival_iteration=arrival, stop_token_ids=stop_token_ids))
        arrival += rng.randint(*arrival_gap)
    return reqs
