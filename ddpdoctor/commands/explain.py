"""`ddpdoctor explain`: not built yet (see the issue that delivers it)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the command to the app; filled in by the issue that builds `explain`."""
