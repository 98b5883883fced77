"""gen, build, run: the back end's verbs."""

from __future__ import annotations

from pathlib import Path

import click

from .app import console, job_options, main, model_inputs, out, progress, report_run, stats_table


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
@click.option("--precision", type=click.Choice(["auto", "fp32", "fp16"]), default="auto",
              show_default=True,
              help="auto: fp16 on GPU ranks (ncnn's default there), fp32 on CPU ranks; fp32 or "
                   "fp16 on every rank (fp16: fp16 weights too).")
@click.option("--fp16", "precision", flag_value="fp16", help="Same as --precision fp16.")
@click.option("--no-verify", "verify", flag_value=False, default=True,
              help="Skip loading and running each converted model in ncnn against onnxruntime.")
def gen(output, precision, verify):
    """Convert OUTPUT's sub-models to ncnn, check each conversion, write a package per host."""
    from ..backend.gen import gen as run_gen
    from ..core.plan import load_plan

    n = len(load_plan(output).ranks)
    with progress() as bar:
        task = bar.add_task("converting sub-models with pnnx, then checking them in ncnn",
                            total=n)
        plan = run_gen(output, precision=precision, progress=lambda r: bar.advance(task),
                       verify=verify, console=console)
    out.print(f"wrote {output}/packages/ for {', '.join(plan.hosts())}")


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
def build(output):
    """Build OUTPUT's program (once per architecture), building ncnn first if needed."""
    from ..backend.build import build as run_build

    with console.status("building (ncnn once, then the program)"):
        program = run_build(output, console=console)
    out.print(f"built {program}")


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
@click.option("--input", "inputs", multiple=True, required=True, metavar="[NAME=]FILE.npy",
              help="Model input as .npy (NAME= needed when the model has several inputs).")
@click.option("--frames", default=1, show_default=True, help="Frames to stream through.")
@click.option("--results", type=click.Path(file_okay=False), default=None,
              help="Where outputs and stats.json go (default OUTPUT/results).")
@job_options
def run(output, inputs, frames, results, no_pipeline, check, rtol, gpu_fallback):
    """Run all ranks of OUTPUT on this machine under mpirun; write outputs and stats.json."""
    import numpy as np

    from ..backend.run import run as run_job
    from ..core.plan import load_plan
    from ..frontend.check import compare_with_model

    plan = load_plan(output)
    given = model_inputs(plan, inputs)
    with console.status(f"running {len(plan.ranks)} ranks x {frames} frames under mpirun"):
        res = run_job(output, given, frames, results, pipeline=not no_pipeline,
                      gpu_fallback=gpu_fallback == "cpu")
    s = res.stats
    out.print(f"{s['frames']} frames in {s['seconds']:.3f} s: [bold]{s['fps']:.2f} frames/s[/bold]"
              f" ({'pipelined' if s['pipeline'] else 'frame by frame'}); results in {res.results}")
    stats_table(s)
    for line in res.warnings:
        console.print(f"[yellow]warning:[/yellow] {line}")
    if check:
        feeds = {n: np.load(p) for n, p in given.items()}
        report_run(compare_with_model(plan, Path(output), feeds, res.outputs), rtol, s)
