"""`ddpdoctor ras [--addr HOST:PORT]`: NCCL's RAS service asked which ranks are dead, unresponsive or behind.

Thin: validate options, ask :mod:`ddpdoctor.ras`, print. Never imports torch (run it on a node of a hung
job while the job holds every GPU).
"""

from __future__ import annotations

from typing import Optional

import typer

from ddpdoctor.commands.options import JsonOption
from ddpdoctor.errors import EXIT_OK, EXIT_PROBLEM, DoctorError


def ras(
    addr: Optional[str] = typer.Option(None, "--addr", metavar="HOST:PORT",
                                       help="The RAS service (default: $NCCL_RAS_ADDR, else localhost:28028)."),
    timeout: float = typer.Option(5.0, "--timeout", help="Seconds allowed for the whole exchange."),
    text: bool = typer.Option(False, "--text", help="Ask for NCCL's text status even where JSON is offered."),
    verbose: bool = typer.Option(False, "--verbose", help="VERBOSE STATUS: NCCL lists more outlier ranks."),
    json_path: JsonOption = None,
) -> None:
    """Ask NCCL's RAS service (NCCL >= 2.24) for the job's dead/unresponsive ranks and operation counts.

    Exit 0: every rank answered; 1: dead or unresponsive ranks, or the service did not answer in time or
    broke off its reply; 2: no RAS service at the address (nothing listens, the host does not resolve, or
    what answers is not RAS) or a bad option.
    """
    from ddpdoctor.outputs import Plan, emit_json, json_to_stdout
    from ddpdoctor.ras import (
        PROBLEM,
        RasUnavailable,
        ask,
        parse_addr,
        ras_addr_from_env,
        render_text,
        to_json,
    )

    Plan("ras").json("--json", json_path)
    if not 0 < timeout <= 3600:
        raise DoctorError(f"--timeout must be between 0 and 3600 seconds, got: {timeout:g}")
    target = addr if addr is not None else ras_addr_from_env()
    try:
        parse_addr(target)
    except ValueError as exc:
        source = "--addr" if addr is not None else "NCCL_RAS_ADDR"
        raise DoctorError(f"{source} must be HOST:PORT (e.g. localhost:28028), got: {target!r} ({exc})") from None
    try:
        verdict = ask(target, timeout, fmt="text" if text else "json", verbose=verbose)
    except RasUnavailable as exc:
        raise DoctorError(str(exc)) from None
    if not json_to_stdout(json_path):
        typer.echo(render_text(verdict), nl=False)
    if json_path is not None:
        emit_json(json_path, to_json(verdict), "ras")
    raise typer.Exit(EXIT_PROBLEM if verdict.status == PROBLEM else EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add ``ras``."""
    app.command("ras")(ras)
