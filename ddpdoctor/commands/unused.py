"""`ddpdoctor unused MODULE:FACTORY`: which parameters DDP would wait for in vain, in one process."""

from __future__ import annotations

from typing import Optional

import typer

from ddpdoctor.commands.options import JsonOption
from ddpdoctor.errors import EXIT_OK, EXIT_PROBLEM, DoctorError

# A handful of steps shows input-dependent branches; ten thousand forward/backward passes is already long.
MAX_STEPS = 10_000


def unused(
    model: str = typer.Argument(..., metavar="MODULE:FACTORY",
                                help="Importable factory returning the model (module name or path.py)."),
    batch: Optional[str] = typer.Option(None, "--batch", metavar="MODULE:FN",
                                        help="Returns the input for a step; called with the arguments it "
                                        "declares among step, rank, world_size."),
    input_shape: Optional[str] = typer.Option(None, "--input-shape",
                                              help="Random normal input of this shape instead, e.g. 4,16."),
    loss: Optional[str] = typer.Option(None, "--loss", metavar="MODULE:FN",
                                       help="loss(output, batch) -> scalar; default: sum of the first output "
                                       "that requires grad."),
    steps: int = typer.Option(4, "--steps", help="Forward/backward steps (input-dependent branches need "
                              "several)."),
    ddp_find_unused: bool = typer.Option(False, "--ddp-find-unused",
                                         help="Your DDP sets find_unused_parameters=True: say if it is needed."),
    json_path: JsonOption = None,
) -> None:
    """Classify parameters as always / never / sometimes used and recommend DDP's flags."""
    from ddpdoctor.outputs import Plan, emit_json, json_to_stdout

    if not 1 <= steps <= MAX_STEPS:
        raise DoctorError(f"--steps must be in 1-{MAX_STEPS}, got: {steps}")
    plan = Plan("unused")
    plan.reads_code("MODULE:FACTORY", model)
    plan.reads_code("--batch", batch)
    plan.reads_code("--loss", loss)
    plan.json("--json", json_path)

    from ddpdoctor.modelspec import build_model, load_factory, parse_shape
    from ddpdoctor.runtime.launcher import detect
    from ddpdoctor.unused import batch_source, find_unused_parameters

    if batch is None and input_shape is None:
        raise DoctorError("give the model an input: --batch MODULE:FN or --input-shape (e.g. 4,16)")
    shape = parse_shape(input_shape)
    module = build_model(model)
    launch = detect()  # under a launcher, random batches differ per rank as the sampler's shards do
    batches = batch_source(module, batch, shape, launch.rank, launch.world_size)
    loss_fn = load_factory(loss) if loss is not None else None
    report = find_unused_parameters(module, batches, loss_fn=loss_fn, steps=steps,
                                    ddp_find_unused_parameters=True if ddp_find_unused else None,
                                    copy_model=False)  # built for this run only
    if not json_to_stdout(json_path):
        typer.echo(report.render())
    if json_path is not None:
        emit_json(json_path, report.to_json(), "unused")
    problem = report.has_problem or report.recommendation.find_unused_costs_for_nothing
    raise typer.Exit(EXIT_PROBLEM if problem else EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add ``unused``."""
    app.command("unused")(unused)
