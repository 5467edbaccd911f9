"""A request's life inside the engine: prompt, committed length, the root token, outputs."""

from __future__ import annotations

from dataclasses import dataclass, field

from .memory import RequestKV


@dataclass
class Request:
    """One generation request. `seq_len` = KV length committed in both models; `root` sits at that position."""

    request_id: int
    prompt: list[int]
    max_new_tokens: int
    arrival_iteration: int
    stop_token_ids: frozenset[int] = frozenset()
    output: list[int] = field(default_factory=list)
    kv: RequestKV | None = None
    seq_len: int = 0
    finish_iteration: int | None = None
    finish_reason: str = "unfinished"

    @property
    def root(self) -> int:
        """The newest committed token: generated but not yet in the KV cache."""
        return self.output[-1]

    @property
    def slot(self) -> int:
        """Row of req_to_token."""
        assert self.kv is not None
        return self.kv.slot

    def commit(self, tokens: list[int], iteration: int) -> list[int]:
        """Append generated tokens, stopping at max_new_tokens or a stop token; returns what was kept."""
        if (self.finish_iteration is None and len(self.output) + len(tokens) < self.max_new_tokens
                and self.stop_token_ids.isdisjoint(tokens)):
            self.output += tokens  # the common case, without a per-token loop (bs 64 commits every iteration)
            return list(tokens)
        kept = []
        for t in tokens:
            if self.finish_iteration is not None:
                break
            self.output.append(t)
            kept.append(t)
            if t in self.stop_token_ids:
                self.finish_iteration, self.finish_reason = iteration, "stop"
            elif len(self.output) >= self.max_new_tokens:
                self.finish_iteration, self.finish_reason = iteration, "length"
        return kept
