"""The three columns of panes under the status line: steps and streams; the step; violations, chain, acceptance."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical

from .acceptance import AcceptPanel
from .draft_chain import ChainPanel
from .page_grid import PageGrid
from .requests_table import RequestsTable
from .source import TraceSource
from .step_detail import DetailPanel
from .step_list import StepList
from .step_violations import StepViolations
from .streams import Timeline
from .violations_panel import ViolationsPanel

TITLES = {"steps": "steps", "timeline": "plan / compute streams", "detail": "step", "requests": "requests",
          "grid": "page table × logical page  (cache_seqlens, cu_seqlens_q/k)", "violations": "violations by invariant",
          "chain": "draft chain", "accept": "acceptance by position"}


class PaneColumns(Horizontal):
    """Left: the step list and the streams; centre: the step's violations, detail, requests and page grid; side
    (wide terminals, or `v`): the violation tree, draft chain and acceptance."""

    def __init__(self, source: TraceSource, id: str | None = None) -> None:
        super().__init__(id=id)
        self.source = source

    def compose(self) -> ComposeResult:
        """The columns and their panes."""
        with Vertical(id="left"):
            yield StepList(self.source, id="steps")
            yield Timeline(self.source, id="timeline")
        with Vertical(id="center"):
            yield StepViolations(id="stepviol")
            yield DetailPanel(id="detail")
            yield RequestsTable(id="requests")
            yield PageGrid(id="grid")
        with Vertical(id="side"):
            yield ViolationsPanel(id="violations")
            yield ChainPanel(id="chain")
            yield AcceptPanel(id="accept")

    def on_mount(self) -> None:
        """Each pane's title on its border."""
        for wid, title in TITLES.items():
            self.query_one(f"#{wid}").border_title = title
