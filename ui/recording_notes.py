"""What a trace says its recording could not record, as a small typed summary both viewers show.

A recorded SGLang server's trace carries these beside its steps: the `meta` rows `recording_problems` (JSON list:
what failed, how often, from which step) and `unmodelled_features` (JSON list: features of the server specscope does
not model), and in the run config `sglang` (provenance; `untested` for a release specscope is not tested against)
and `not_recorded` (`fields`: names the backend does not have, with why; `replay_metadata`: why graph replays carry
no metadata). `specscope info` prints the same facts (ui/cmd_info.py). Torch-free: the TUI and the dashboard import
it, and so can a laptop reading a copied trace.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One kind of recording failure: counted, with the step it first happened at (None: outside a step)."""

    what: str
    count: int
    first_step: int | None
    detail: str


@dataclass(frozen=True)
class Feature:
    """A feature the recorded server uses that specscope does not model (`source`: where it was seen)."""

    feature: str
    detail: str
    source: str


@dataclass(frozen=True)
class RecordingNotes:
    """Everything a trace says it could not record (all empty for a trace that records everything)."""

    problems: tuple[Problem, ...] = ()
    untested: str | None = None  # e.g. "untested SGLang 0.5.24"
    unmodelled: tuple[Feature, ...] = ()
    absent_fields: tuple[tuple[str, str], ...] = ()  # (field, why) the backend does not have
    replay_metadata: str | None = None  # why graph replays hold no metadata, e.g. "computed inside the graph (...)"
    no_provenance: bool = False  # an SGLang trace from a recorder before provenance was recorded
    unreadable: tuple[tuple[str, str], ...] = field(default=())  # (meta key, raw text) that was not the JSON expected

    def __bool__(self) -> bool:
        """Whether there is anything to say."""
        return bool(self.problems or self.untested or self.unmodelled or self.absent_fields or self.replay_metadata
                    or self.no_provenance or self.unreadable)

    def is_absent(self, name: str) -> bool:
        """Whether `name` is a field this backend does not have (recorded absent, never made up)."""
        return any(f == name for f, _ in self.absent_fields)

    def replay_reason(self) -> str | None:
        """The short reason a replay holds no metadata ("computed inside the graph"), without the release note
        in parentheses that the full text keeps."""
        r = self.replay_metadata
        if not r:
            return None
        head, sep, tail = r.rpartition(" (")
        return head if sep and tail.endswith(")") and head else r

    def parts(self) -> list[str]:
        """The short items of the one-line notice, most important first (failures, then what is not modelled,
        then what the backend does not give)."""
        out: list[str] = []
        if self.problems:
            n = sum(p.count for p in self.problems)
            kinds = len(self.problems)
            out.append(f"{n} recording problem{'s' if n != 1 else ''}" + (f" ({kinds} kinds)" if kinds > 1 else ""))
        if self.unreadable:
            out.append("unreadable: " + ", ".join(k for k, _ in self.unreadable))
        if self.untested:
            out.append(self.untested)
        if self.no_provenance:
            out.append("no provenance")
        if self.unmodelled:
            out.append("unmodelled: " + ", ".join(f.feature for f in self.unmodelled))
        if self.absent_fields:
            out.append("absent: " + ", ".join(f for f, _ in self.absent_fields))
        if self.replay_metadata:
            out.append("replay metadata not recorded")
        return out

    def headline(self, width: int = 80, more: str = "? details") -> str:
        """One line of at most `width` characters: as many items as fit, then `+N more` and `more` (the key that
        shows the full text), so a narrow terminal still says there is something and where to read it."""
        parts = self.parts()
        if not parts:
            return ""
        lead = "⚠ recording: "
        tail = f" · {more}" if more else ""
        for k in range(len(parts), 0, -1):
            rest = len(parts) - k
            line = lead + " · ".join(parts[:k]) + (f" · +{rest} more" if rest else "") + tail
            if len(line) <= width:
                return line
        line = lead + f"{len(parts)} notes" + tail
        return line if len(line) <= width else line[: max(0, width - 1)] + "…"

    def lines(self) -> list[str]:
        """The full text, one fact a line (the help screen and the dashboard show it)."""
        out: list[str] = []
        for p in self.problems:
            at = f", first at step {p.first_step}" if p.first_step is not None else ""
            out.append(f"recording problem  {p.what}: {p.count}x{at}: {p.detail}")
        for key, raw in self.unreadable:
            out.append(f"unreadable {key}: {raw[:200]}")
        if self.untested:
            out.append(f"{self.untested}: specscope recorded what it could, it is not tested against this release")
        if self.no_provenance:
            out.append("provenance not recorded (a trace from a recorder before provenance was recorded)")
        for f in self.unmodelled:
            out.append(f"unmodelled {f.feature}: {f.detail}" + (f" (from {f.source})" if f.source else ""))
        for name, why in self.absent_fields:
            out.append(f"{name} absent in this backend: {why}")
        if self.replay_metadata:
            out.append(f"graph replays' metadata not recorded: {self.replay_metadata} (replay steps hold their "
                       "header, requests and spans)")
        return out


def _json_list(meta: Mapping[str, str], key: str, unreadable: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """A meta row holding a JSON list of objects; anything else is kept as unreadable (said, not lost)."""
    raw = meta.get(key)
    if raw is None:
        return []
    try:
        val = json.loads(raw)
    except ValueError:
        val = None
    if not isinstance(val, list) or not all(isinstance(x, dict) for x in val):
        unreadable.append((key, str(raw)))
        return []
    return val


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def recording_notes(meta: Mapping[str, str], config: Mapping[str, Any] | None) -> RecordingNotes:
    """The notes of one trace from its reader's `meta()` and its run config (`reader.run.config`)."""
    config = config or {}
    unreadable: list[tuple[str, str]] = []
    problems = tuple(
        Problem(str(p.get("what", "?")), int(p.get("count") or 0), _int_or_none(p.get("first_step")),
                str(p.get("detail", ""))) for p in _json_list(meta, "recording_problems", unreadable))
    sg = config.get("sglang")
    sg = sg if isinstance(sg, Mapping) else {}
    untested = None
    if sg and not sg.get("tested"):
        untested = str(sg.get("untested") or f"untested SGLang {sg.get('version', '?')}")
    # The run info's list, then those found after the trace opened (the meta row holds both when present).
    feats: dict[str, Feature] = {}
    listed: Sequence[Any] = sg.get("unmodelled") or ()
    for f in [*listed, *_json_list(meta, "unmodelled_features", unreadable)]:
        if isinstance(f, Mapping) and f.get("feature") and str(f["feature"]) not in feats:
            feats[str(f["feature"])] = Feature(str(f["feature"]), str(f.get("detail", "")), str(f.get("source", "")))
    nr = config.get("not_recorded")
    nr = nr if isinstance(nr, Mapping) else {}
    fields = nr.get("fields")
    absent = tuple((str(k), str(v)) for k, v in fields.items()) if isinstance(fields, Mapping) else ()
    replay = nr.get("replay_metadata")
    return RecordingNotes(problems=problems, untested=untested, unmodelled=tuple(feats.values()),
                          absent_fields=absent, replay_metadata=str(replay) if replay else None,
                          no_provenance=config.get("source") == "sglang" and not sg,
                          unreadable=tuple(unreadable))


def replay_without_metadata(notes: RecordingNotes, graph: str, array_names: Sequence[str],
                            scalar_names: Sequence[str]) -> bool:
    """Whether a step is a graph replay whose metadata the trace says is not recorded: a replay without the
    arrays and the `max_seq_len_q` a recorded step has (a verify replay still records its acceptance)."""
    return bool(notes.replay_metadata) and graph == "replay" and not array_names and "max_seq_len_q" not in \
        scalar_names
