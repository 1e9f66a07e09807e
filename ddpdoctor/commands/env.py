"""`ddpdoctor env`: the local environment as a paste-ready block (or JSON); no process group."""

from __future__ import annotations

import json

import typer


def register(app: typer.Typer) -> None:
    """Add ``env``."""

    @app.command("env")
    def env(
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the text block."),
        no_torch: bool = typer.Option(False, "--no-torch", help="Do not import torch (fast; works when torch "
                                      "itself is broken)."),
    ) -> None:
        """Versions, GPUs, network interfaces and relevant variables, ready to paste into a bug report."""
        from ddpdoctor.env import report as envreport

        facts = envreport.collect(with_torch=not no_torch)
        typer.echo(json.dumps(facts, indent=2, default=str) if as_json else envreport.render(facts))
