"""The ``autodice`` command. Each verb parses options, calls one library function, prints."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from .errors import AutodiceError
from .plan import human_bytes as _human

console = Console(stderr=True)
# Tables stay readable when piped (rich would squeeze them to 80 columns).
out = Console(width=None if sys.stdout.isatty() else 130)


class Main(click.Group):
    """Turns AutodiceError into one ``error:`` line per problem and exit code 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except AutodiceError as e:
            for line in e.problems:
                click.echo(f"error: {line}", err=True)
            sys.exit(2)


@click.group(cls=Main)
@click.version_option(package_name="autodice")
def main():
    """Split a CNN across edge devices and generate the distributed program (AutoDiCE)."""


input_shape_option = click.option(
    "--input-shape", "input_shapes", multiple=True, metavar="NAME=1x3x224x224",
    help="Static shape for a model input with symbolic dimensions (repeatable).")


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--mapping", "-m", required=True, type=click.Path(dir_okay=False),
              help="mapping.json: {\"host_resource\": [layer, ...]}; key order = rank order.")
@click.option("--platform", "-p", required=True, type=click.Path(dir_okay=False),
              help="platform.txt: one device per line.")
@click.option("--output", "-o", required=True, type=click.Path(file_okay=False),
              help="Output directory (replaced atomically if it holds an earlier split).")
@input_shape_option
@click.option("--check", is_flag=True, help="Then compare the sub-models with the whole model.")
@click.option("--samples", default=1, show_default=True, help="Random inputs for --check.")
def split(model, mapping, platform, output, input_shapes, check, samples):
    """Split MODEL into one sub-model per mapping key, with rankfile, tables and plan."""
    from .model import parse_input_shapes
    from .split import split as run_split

    with console.status("splitting"):
        plan = run_split(model, mapping, platform, output, parse_input_shapes(input_shapes))
    table = Table(title=f"{len(plan.ranks)} ranks, {len(plan.edges)} cut tensors -> {output}")
    for col in ("rank", "key", "slots", "layers", "params", "peak act.", "recv/frame",
                "send/frame"):
        table.add_column(col, justify="right" if col not in ("key",) else "left")
    for r in plan.ranks:
        m = r.memory
        table.add_row(str(r.rank), r.key, ",".join(map(str, r.slots)), str(len(r.layers)),
                      _human(m.params), _human(m.peak_activations), _human(m.recv_bytes),
                      _human(m.send_bytes))
    out.print(table)
    if check:
        _check(output, samples, 1e-4, None)


def _check(output, samples, rtol, model) -> None:
    from .check import check as run_check

    with console.status(f"running sub-models and whole model in onnxruntime ({samples} inputs)"):
        diffs = run_check(output, samples=samples, model=model)
    _report(diffs, rtol)


def _report(diffs, rtol) -> None:
    bad = [d for d in diffs if not d.rel <= rtol]
    for d in diffs:
        verdict = "[red]FAIL[/red]" if d in bad else "[green]ok[/green]"
        out.print(f"check {d.name}: max abs {d.max_abs:.3g}, rel {d.rel:.3g} (rtol {rtol:g}) "
                  f"{verdict}")
    if bad:
        sys.exit(1)


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
@click.option("--samples", default=1, show_default=True, help="Number of random inputs.")
@click.option("--rtol", default=1e-4, show_default=True,
              help="Fail above this max|diff| / max|reference| per output.")
@click.option("--model", type=click.Path(dir_okay=False), default=None,
              help="The whole model, if it moved since the split.")
def check(output, samples, rtol, model):
    """Chain OUTPUT's sub-models in onnxruntime and compare with the whole model (exit 1 if off)."""
    _check(output, samples, rtol, model)


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@input_shape_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--balance", metavar="KEY,KEY,...", default=None,
              help="Print a mapping that cuts the layers into these keys with balanced FLOPs.")
def layers(model, input_shapes, as_json, balance):
    """List MODEL's layers: the names a mapping uses, with shapes, parameters and FLOPs."""
    from .model import load_model, parse_input_shapes
    from .spec import mapping_json
    from .split import layer_table
    from .suggest import balanced_mapping

    graph = load_model(model, parse_input_shapes(input_shapes))
    if balance:
        click.echo(mapping_json(balanced_mapping(graph, balance.split(","))), nl=False)
        return
    rows = layer_table(graph)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    table = Table(title=f"{model}: {sum(not r['follows'] for r in rows)} layers to map "
                        f"({sum(r['follows'] for r in rows)} constants/shape ops follow them)")
    for col in ("name", "op", "output shape", "params", "FLOPs", ""):
        table.add_column(col, justify="right" if col in ("params", "FLOPs") else "left")
    for r in rows:
        table.add_row(r["name"], r["op"], r["shape"], _human(r["param_bytes"]),
                      f"{r['flops'] / 1e6:.1f} M", "follows" if r["follows"] else "")
    out.print(table)


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
@click.option("--image", "-o", required=True, type=click.Path(dir_okay=False),
              help="Picture to write: .svg, .png or .pdf.")
@click.option("--model", type=click.Path(dir_okay=False), default=None,
              help="The whole model, if it moved since the split.")
def view(output, image, model):
    """Draw OUTPUT's partition: layers coloured by rank, cut tensors with their bytes."""
    from .view import render

    with console.status("drawing"):
        render(output, image, model)
    out.print(f"wrote {image}")


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
@click.option("--fp16", is_flag=True,
              help="fp16 weights and arithmetic (smaller, faster on some boards; check the error).")
def gen(output, fp16):
    """Convert OUTPUT's sub-models to ncnn and write the SPMD program and a package per host."""
    from rich.progress import Progress

    from .gen import gen as run_gen
    from .plan import load_plan

    n = len(load_plan(output).ranks)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("converting sub-models with pnnx", total=n)
        plan = run_gen(output, fp16=fp16, progress=lambda r: bar.advance(task))
    out.print(f"wrote {output}/packages/ for {', '.join(plan.hosts())}")


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
@click.option("--vulkan", is_flag=True, help="Use an ncnn built with Vulkan (GPU ranks).")
@click.option("--lean", is_flag=True, help="Use the quick-to-build AVX2-only ncnn (tests).")
def build(output, vulkan, lean):
    """Build OUTPUT's program (once per architecture), building ncnn first if needed."""
    from .build import build as run_build

    with console.status("building (ncnn once, then the program)"):
        program = run_build(output, vulkan=vulkan, lean=lean, console=console)
    out.print(f"built {program}")


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
@click.option("--input", "inputs", multiple=True, required=True, metavar="[NAME=]FILE.npy",
              help="Model input as .npy (NAME= needed when the model has several inputs).")
@click.option("--frames", default=1, show_default=True, help="Frames to stream through.")
@click.option("--results", type=click.Path(file_okay=False), default=None,
              help="Where outputs and stats.json go (default OUTPUT/results).")
@click.option("--no-pipeline", is_flag=True, help="Frame by frame, as the AutoDiCE paper ran.")
@click.option("--check", is_flag=True, help="Compare the outputs with onnxruntime.")
@click.option("--rtol", default=1e-4, show_default=True, help="Tolerance for --check.")
def run(output, inputs, frames, results, no_pipeline, check, rtol):
    """Run all ranks of OUTPUT on this machine under mpirun; write outputs and stats.json."""
    import numpy as np

    from .check import compare_with_model
    from .plan import load_plan
    from .run import run as run_job

    plan = load_plan(output)
    names = [t.name for t in plan.model_inputs]
    given = {}
    for spec in inputs:
        name, eq, path = spec.rpartition("=")
        if not eq and len(names) == 1:
            name = names[0]
        elif not eq or name not in names:
            raise AutodiceError(f'--input {spec}: name one of the model inputs '
                                f'({", ".join(names)}) as NAME=FILE.npy')
        given[name] = Path(path)
    with console.status(f"running {len(plan.ranks)} ranks x {frames} frames under mpirun"):
        res = run_job(output, given, frames, results, pipeline=not no_pipeline)
    s = res.stats
    out.print(f"{s['frames']} frames in {s['seconds']:.3f} s: [bold]{s['fps']:.2f} frames/s[/bold]"
              f" ({'pipelined' if s['pipeline'] else 'frame by frame'}); results in {res.results}")
    table = Table()
    for col in ("rank", "key", "compute s", "recv wait s", "send wait s", "sent", "peak RSS"):
        table.add_column(col, justify="left" if col == "key" else "right")
    for r in s["ranks"]:
        table.add_row(str(r["rank"]), r["key"], f"{r['compute_s']:.3f}", f"{r['recv_wait_s']:.3f}",
                      f"{r['send_wait_s']:.3f}", _human(r["bytes_sent"]), _human(r["peak_rss"]))
    out.print(table)
    if check:
        feeds = {n: np.load(p) for n, p in given.items()}
        _report(compare_with_model(plan, Path(output), feeds, res.outputs), rtol)


@main.command()
@click.argument("name")
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False),
              help="Where to write the .onnx file.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random weights.")
def zoo(name, output, seed):
    """Write the full-size ONNX-zoo model NAME with seeded weights (from the onnx wheel)."""
    from . import zoo as zoo_models

    with console.status(f"materializing {name}"):
        zoo_models.save(zoo_models.materialize(name, seed), Path(output))
    out.print(f"wrote {output}")


if __name__ == "__main__":
    main()
