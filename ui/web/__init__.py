"""The Dash dashboard (`specscope web`): timeline, step explorer, acceptance, violations, A/B comparison.

Importing this package loads nothing: `create_app(...)` (in `app.py`) builds an app for the traces it is given.
Figure and view-model functions (`figures.py`, `models.py`) are pure: trace data in, Plotly figures or rows out.
"""

from __future__ import annotations

from typing import Any


def create_app(*args: Any, **kwargs: Any) -> Any:
    """Build the Dash app; see `specscope.ui.web.app.create_app`."""
    from .app import create_app as _create

    return _create(*args, **kwargs)
