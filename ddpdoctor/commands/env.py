"""`ddpdoctor env`: the local environment as a paste-ready block (or JSON); no process group."""

from __future__ import annotations

import typer

from ddpdoctor.commands.options import JsonOption


def env(
    json_path: JsonOption = None,
    no_torch: bool = typer.Option(False, "--no-torch", help="Do not import torch (fast; works when torch "
                                  "itself is broken)."),
) -> None:
    """Versions, GPUs, network interfaces and relevant variables, ready to paste into a bug report."""
    from ddpdoctor.env import collect, render
    from ddpdoctor.outputs import Plan, emit_json, json_to_stdout

    Plan("env").json("--json", json_path)
    facts = collect(with_torch=not no_torch)
    if not json_to_stdout(json_path):
        typer.echo(render(facts))
    if json_path is not None:
        emit_json(json_path, facts, "env")


def register(app: typer.Typer) -> None:
    """Add ``env``."""
    app.command("env")(env)
