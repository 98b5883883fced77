"""split, check, layers, view, zoo: the front end's verbs."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..core.errors import AutodiceError
from ..core.plan import human_bytes
from .app import (
    POSITIVE,
    console,
    input_shape_option,
    main,
    numpy_without_threads,
    only_with,
    out,
    report,
    text_table,
    visible,
)


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
    if check and samples < 1:
        raise AutodiceError(f"--samples {samples}: need at least 1")
    # No spinner and a plain table: the split takes about half a second, rich a fifth of that.
    numpy_without_threads()
    from ..core.shapes import parse_input_shapes
    from ..core.spec import parse_platform
    from ..frontend.split import split as run_split

    only_with("--check", check, "samples")
    plan = run_split(model, mapping, platform, output, parse_input_shapes(input_shapes))
    rows = [(str(r.rank), r.key, ",".join(map(str, r.slots)), str(len(r.layers)),
             human_bytes(r.memory.params), human_bytes(r.memory.peak_activations),
             human_bytes(r.memory.recv_bytes), human_bytes(r.memory.send_bytes))
            for r in plan.ranks]
    click.echo(text_table(f"{len(plan.ranks)} ranks, {len(plan.edges)} cut tensors -> {output}",
                          ("rank", "key", "slots", "layers", "params", "peak act.",
                           "recv/frame", "send/frame"), rows, left=("key",)))
    _kinds_notes({r.key: (r.host, r.slots) for r in plan.ranks if r.device == "cpu"},
                 parse_platform(platform))
    if check:
        _check(output, samples, 1e-4, None)


def _kinds_notes(keys: dict, platform) -> None:
    from ..frontend.place import mixed_kinds

    for note in mixed_kinds(keys, platform):
        console.print(f"note: {visible(note)}", soft_wrap=True)


def _check(output, samples, rtol, model) -> None:
    from ..frontend.check import check as run_check

    with console.status(f"running sub-models and whole model in onnxruntime ({samples} inputs)"):
        diffs = run_check(output, samples=samples, model=model)
    report(diffs, rtol)


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
@click.option("--samples", type=int, default=None,
              help="Number of random inputs [default: 1], or of --frames' frames [default: 50].")
@click.option("--rtol", default=1e-4, show_default=True, type=POSITIVE,
              help="Fail above this max|diff| / max|reference| per output.")
@click.option("--model", type=click.Path(dir_okay=False), default=None,
              help="The whole model, if it moved since the split.")
@click.option("--frames", "source", metavar="SOURCE", default=None,
              help="Also, after gen: each key's ncnn model (int8, fp16 or fp32 as gen made it) "
                   "against fp32 on these frames (images, a batch .npy, a video), and the keys "
                   "chained in ncnn against the whole model: top-1/top-5 agreement, mask IoU.")
@click.option("--preprocess", default=None, metavar="RECIPE",
              help="How --frames' images become frames, as run --preprocess.")
def check(output, samples, rtol, model, source, preprocess):
    """Chain OUTPUT's sub-models in onnxruntime and compare with the whole model (exit 1 if off)."""
    only_with("--frames", source is not None, "preprocess")
    _check(output, 1 if source or samples is None else samples, rtol, model)
    if source is not None:
        _agreement(output, source, preprocess, 50 if samples is None else samples)


def _agreement(output, source, preprocess, frames) -> None:
    from ..backend.agreement import agreement

    with console.status(f"each key in ncnn against fp32 ({source})"):
        found = agreement(output, source, preprocess, frames)
    for line in found.lines():
        out.print(visible(line), soft_wrap=True)
    for note in found.notes():
        console.print(f"note: {note}", soft_wrap=True)


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@input_shape_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--balance", metavar="KEY,KEY,...", default=None,
              help="Print a mapping that cuts the layers, in order, into these keys so the "
                   "slowest key is fastest: by time measured on this machine's CPU (cached), "
                   "by --profile's, or by FLOPs (--by flops).")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False), default=None,
              help="profile.json (`autodice profile`, e.g. on the boards) for --balance.")
@click.option("--platform", "-p", "platform_path", type=click.Path(dir_okay=False), default=None,
              help="platform.txt for --balance: a key also pays for receiving what crosses "
                   "into it over the link from the key before (its bandwidth= and latency=).")
@click.option("--by", type=click.Choice(["time", "flops"]), default="time", show_default=True,
              help="What --balance evens out.")
@click.option("--check", is_flag=True,
              help="Will ncnn run it? The whole model converted and run in ncnn against "
                   "onnxruntime (cached by the model's bytes): every layer runs, with the "
                   "largest error, or the first layer that fails and how (exit 1).")
@click.option("--verify-with", metavar="FRAME", default=None,
              help="--check on this frame (an image, a folder's first, a .npy), not noise.")
@click.option("--preprocess", default=None, metavar="RECIPE",
              help="How --verify-with's image becomes a frame, as run --preprocess.")
def layers(model, input_shapes, as_json, balance, profile_path, platform_path, by, check,
           verify_with, preprocess):
    """List MODEL's layers: the names a mapping uses, with shapes, parameters and FLOPs."""
    from ..core.mapping import mapping_json
    from ..core.model import load_model
    from ..core.shapes import parse_input_shapes
    from ..core.spec import parse_platform
    from ..frontend.layers import layer_table
    from ..frontend.suggest import balanced_mapping

    only_with("--balance", bool(balance), "profile_path", "platform_path", "by")
    only_with("--by time", by == "time", "profile_path", "platform_path")
    only_with("a listing (no --balance: it prints a mapping)", not balance, "as_json")
    only_with("--check", check, "verify_with", "preprocess")
    shapes = parse_input_shapes(input_shapes)
    if check:
        if balance:
            raise AutodiceError("--check and --balance: one or the other")
        _check_model(model, shapes, verify_with, preprocess)
        return
    graph = load_model(model, shapes)
    if balance:
        keys = balance.split(",")
        if platform_path:
            from ..core.mapping import parse_keys

            _kinds_notes({r.key: (r.host, r.cores) for r in parse_keys(keys, "--balance")
                          if r.kind == "cpu"}, parse_platform(platform_path))
        if by == "flops":
            mapping = balanced_mapping(graph, keys, "--balance")
        else:
            from ..dse.balance import balance as by_time
            from ..dse.profile import load_profile

            given = load_profile(profile_path) if profile_path else None
            platform = parse_platform(platform_path) if platform_path else None
            done = by_time(graph, model, keys, given, console=console, input_shapes=shapes,
                           platform=platform)
            where = f"by {profile_path}" if profile_path else "measured on this machine's CPU"
            what = (f"compute and receiving over {platform_path}'s links" if platform_path
                    else "compute, and receiving where the profile has the link")
            # soft_wrap: a line of its own whatever the width (a path cut in two cannot be
            # copied, and a test that searched it once failed with a longer temporary path)
            console.print(f"predicted per frame ({visible(what)}), {visible(where)}: " + ", ".join(
                f"{visible(k)} {s * 1e3:.2f} ms" for k, s in done.seconds.items()), soft_wrap=True)
            for note in done.notes:
                console.print(f"note: {visible(note)}", soft_wrap=True)
            mapping = done.mapping
        click.echo(mapping_json(mapping), nl=False)
        return
    from rich.table import Table

    rows = layer_table(graph)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    table = Table(title=f"{visible(model)}: {sum(not r['follows'] for r in rows)} layers to "
                        f"map ({sum(r['follows'] for r in rows)} constants/shape ops follow them)")
    for col in ("name", "op", "output shape", "params", "FLOPs", ""):
        table.add_column(col, justify="right" if col in ("params", "FLOPs") else "left")
    for r in rows:  # names are the model's: data, never terminal controls
        table.add_row(visible(r["name"]), visible(r["op"]), r["shape"],
                      human_bytes(r["param_bytes"]),
                      f"{r['flops'] / 1e6:.1f} M", "follows" if r["follows"] else "")
    out.print(table)


def _check_model(model, shapes, verify_with, preprocess) -> None:
    """``layers --check``: the answer on stdout, one line; exit 1 where ncnn fails the model."""
    from ..backend.model_check import check_model

    with console.status("converting the whole model and running it in ncnn"):
        found = check_model(model, shapes, verify_with, preprocess, console=console)
    on = "your frame" if verify_with else "a random frame"
    cached = " (cached)" if found.cached else ""
    if found.runs:
        out.print(visible(f"{model}: every layer runs in ncnn ({found.layers} layers): largest "
                          f"error {found.worst:.3g} of an output's scale against onnxruntime "
                          f"on {on}{cached}"), soft_wrap=True)
        return
    where = (f'the first layer that fails is "{found.layer}"' if found.layer else
             "no single layer fails alone")
    out.print(visible(f"{model}: ncnn does not run it as onnxruntime does ({on}): {where}: "
                      f"{found.problem}{cached}"), soft_wrap=True)
    if not verify_with:
        console.print("note: checked on a random frame: a model whose outputs are near 0 on "
                      "noise (a trained detector) may pass on a real one: --verify-with FRAME",
                      soft_wrap=True)
    raise SystemExit(1)


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
@click.option("--image", "-o", required=True, type=click.Path(dir_okay=False),
              help="What to write: a picture (.svg, .png, .pdf) or a page (.html: the partition "
                   "to pan and zoom, each key's figures, the run, a search's front).")
@click.option("--model", type=click.Path(dir_okay=False), default=None,
              help="The whole model, if it moved since the split.")
@click.option("--profile", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A page: each key's predicted time from this profile.json.")
@click.option("--stats", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A page: the run's figures [default: OUTPUT/results/stats.json, if any].")
@click.option("--front", type=click.Path(exists=True, file_okay=False), default=None,
              help="A page: the front of the search written to this folder (dse -o).")
def view(output, image, model, profile, stats, front):
    """Draw OUTPUT's partition (layers coloured by rank, cut tensors with their bytes), or write
    its page: the partition to pan and zoom, each key's figures, the run, a search's front."""
    if Path(image).suffix.lower() in (".html", ".htm"):
        from ..api import report

        with console.status("writing the page"):
            report(output, image, model=model, profile=profile, stats=stats, front=front)
    else:
        if profile or stats or front:
            raise AutodiceError("--profile, --stats and --front are for a page (-o NAME.html)")
        from ..frontend.view import render

        with console.status("drawing"):
            render(output, image, model)
    out.print(f"wrote {image}")


@main.command()
@click.argument("name")
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False),
              help="Where to write the .onnx file.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0),
              help="Seed of the random weights.")
def zoo(name, output, seed):
    """Write the full-size ONNX-zoo model NAME with seeded weights (from the onnx wheel; resnet101
    is its ResNet-50 with the res4 stage grown to 23 blocks)."""
    from rich.markup import escape

    from ..frontend import zoo as zoo_models

    with console.status(f"materializing {escape(visible(name))}"):  # a spinner's text is markup
        zoo_models.save(zoo_models.materialize(name, seed), Path(output))
    out.print(f"wrote {output}")
