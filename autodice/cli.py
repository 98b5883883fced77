"""The ``autodice`` command. Each verb parses options, calls one library function, prints."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from .core.errors import AutodiceError
from .core.plan import human_bytes as _human

console = Console(stderr=True)
# Tables stay readable when piped (rich would squeeze them to 80 columns).
out = Console(width=None if sys.stdout.isatty() else 130)


class Main(click.Group):
    """Turns AutodiceError into one ``error:`` line per problem and exit code 2.

    click's own complaints about the command line (an unknown option, a value that is not a
    number, a file that is a directory) get the same one-line form, and so does an error of
    the machine (a full disk, a folder autodice may not write) that no check foresaw.
    """

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except AutodiceError as e:
            for line in e.problems:
                click.echo(f"error: {visible(line)}", err=True)
            sys.exit(2)
        except click.UsageError as e:
            hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
            click.echo(f"error: {e.format_message()}{hint}", err=True)
            sys.exit(2)
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            click.echo(f"error: {where}{e.strerror or e}", err=True)
            sys.exit(2)


def visible(line: str) -> str:
    """``line`` with control characters spelled out (``\\n``, ``\\x1b``): a name from a model
    or a mapping key is data, and must neither start a line of its own nor drive the terminal."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
                   for ch in line)


def progress(*columns, **kwargs):
    """A ``rich.progress.Progress`` that appears with its first step, not on entering ``with``:
    the checks that run before any work then print their errors as the first lines."""
    from rich.progress import Progress

    class Lazy(Progress):
        started = False

        def __enter__(self):
            return self

        def start(self):
            if not self.started:
                self.started = True
                super().start()

        def stop(self):  # rich ends with a blank line where no terminal is; errors come next
            if self.started:
                self.live.stop()

        def update(self, *args, **kw):
            self.start()
            super().update(*args, **kw)

        def advance(self, *args, **kw):
            self.start()
            super().advance(*args, **kw)

    return Lazy(*columns, console=console, transient=True, **kwargs)


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
    from .core.model import parse_input_shapes
    from .frontend.split import split as run_split

    if check and samples < 1:
        raise AutodiceError(f"--samples {samples}: need at least 1")
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
    from .frontend.check import check as run_check

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
    from .core.model import load_model, parse_input_shapes
    from .core.spec import mapping_json
    from .frontend.layers import layer_table
    from .frontend.suggest import balanced_mapping

    graph = load_model(model, parse_input_shapes(input_shapes))
    if balance:
        keys = balance.split(",")
        click.echo(mapping_json(balanced_mapping(graph, keys, "--balance")), nl=False)
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
    from .frontend.view import render

    with console.status("drawing"):
        render(output, image, model)
    out.print(f"wrote {image}")


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
    from .backend.gen import gen as run_gen
    from .core.plan import load_plan

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
    from .backend.build import build as run_build

    with console.status("building (ncnn once, then the program)"):
        program = run_build(output, console=console)
    out.print(f"built {program}")


def _inputs(plan, specs) -> dict[str, Path]:
    """``--input [NAME=]FILE.npy`` options as model input name -> file."""
    names = [t.name for t in plan.model_inputs]
    given = {}
    for spec in specs:
        name, eq, path = spec.rpartition("=")
        if not eq and len(names) == 1:
            name = names[0]
        elif not eq or name not in names:
            raise AutodiceError(f'--input {spec}: name one of the model inputs '
                                f'({", ".join(names)}) as NAME=FILE.npy')
        given[name] = Path(path)
    return given


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
@click.option("--input", "inputs", multiple=True, required=True, metavar="[NAME=]FILE.npy",
              help="Model input as .npy (NAME= needed when the model has several inputs).")
@click.option("--frames", default=1, show_default=True, help="Frames to stream through.")
@click.option("--results", type=click.Path(file_okay=False), default=None,
              help="Where outputs and stats.json go (default OUTPUT/results).")
@click.option("--no-pipeline", is_flag=True, help="Frame by frame, as the AutoDiCE paper ran.")
@click.option("--check", is_flag=True, help="Compare the outputs with onnxruntime.")
@click.option("--rtol", type=float, default=None,
              help="Tolerance for --check [default: 1e-4, or 1e-2 when a rank ran in fp16].")
@click.option("--gpu-fallback", type=click.Choice(["none", "cpu"]), default="none",
              show_default=True,
              help="cpu: a GPU rank on a host without a Vulkan device computes on its CPU.")
def run(output, inputs, frames, results, no_pipeline, check, rtol, gpu_fallback):
    """Run all ranks of OUTPUT on this machine under mpirun; write outputs and stats.json."""
    import numpy as np

    from .backend.run import run as run_job
    from .core.plan import load_plan
    from .frontend.check import compare_with_model

    plan = load_plan(output)
    given = _inputs(plan, inputs)
    with console.status(f"running {len(plan.ranks)} ranks x {frames} frames under mpirun"):
        res = run_job(output, given, frames, results, pipeline=not no_pipeline,
                      gpu_fallback=gpu_fallback == "cpu")
    s = res.stats
    out.print(f"{s['frames']} frames in {s['seconds']:.3f} s: [bold]{s['fps']:.2f} frames/s[/bold]"
              f" ({'pipelined' if s['pipeline'] else 'frame by frame'}); results in {res.results}")
    _stats_table(s)
    for line in res.warnings:
        console.print(f"[yellow]warning:[/yellow] {line}")
    if check:
        feeds = {n: np.load(p) for n, p in given.items()}
        _report_run(compare_with_model(plan, Path(output), feeds, res.outputs), rtol, s)


def _stats_table(stats: dict) -> None:
    """One row per rank: where it ran (device, precision, cores) and where its time went."""
    table = Table()
    for col in ("rank", "key", "device", "precision", "on cores", "load s", "compute s",
                "recv wait s", "send wait s", "sent", "peak RSS"):
        table.add_column(col, justify="left" if col in ("key", "device", "precision",
                                                         "on cores") else "right")
    for r in stats["ranks"]:
        device = r.get("device", "?")  # "vulkan:llvmpipe (LLVM 15.0.6, 256 bits)" in full
        device = "cpu (fallback)" if device.startswith("cpu (") else device.split(" (")[0]
        table.add_row(str(r["rank"]), r["key"], device, r.get("precision", "?"),
                      ",".join(map(str, r["omp_cpus"])), f"{r['load_s']:.3f}",
                      f"{r['compute_s']:.3f}", f"{r['recv_wait_s']:.3f}",
                      f"{r['send_wait_s']:.3f}", _human(r["bytes_sent"]), _human(r["peak_rss"]))
    out.print(table)


def _report_run(diffs, rtol, stats) -> None:
    """--check of a run: the tolerance is the user's, else what the ranks' precision allows."""
    from .backend.run import check_tolerance

    if rtol is None:
        rtol, why = check_tolerance(stats)
        out.print(f"tolerance {rtol:g} ({why})")
    _report(diffs, rtol)


@main.command()
@click.argument("name")
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False),
              help="Where to write the .onnx file.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random weights.")
def zoo(name, output, seed):
    """Write the full-size ONNX-zoo model NAME with seeded weights (from the onnx wheel)."""
    from .frontend import zoo as zoo_models

    with console.status(f"materializing {name}"):
        zoo_models.save(zoo_models.materialize(name, seed), Path(output))
    out.print(f"wrote {output}")


def _thread_list(ctx, param, value):
    if value is None:
        return None
    try:
        threads = tuple(int(t) for t in value.split(","))
    except ValueError:
        raise click.BadParameter(f'"{value}" is not a list of thread counts such as 1,2') from None
    return threads


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--platform", "-p", required=True, type=click.Path(dir_okay=False),
              help="platform.txt: picks the thread counts and gives the host-to-host links.")
@click.option("--output", "-o", default="profile.json", show_default=True,
              type=click.Path(dir_okay=False), help="Where to write the profile.")
@click.option("--threads", callback=_thread_list, metavar="1,2",
              help="Thread counts to measure (default: 1 and each device's cores, up to this "
                   "machine's).")
@input_shape_option
@click.option("--runs", default=15, show_default=True, help="Timed runs per thread count.")
@click.option("--warmup", default=3, show_default=True, help="Untimed runs first.")
@click.option("--no-cache", is_flag=True, help="Measure again even if a cached profile fits.")
@click.option("--inventory", "-i", type=click.Path(dir_okay=False), default=None,
              help="inventory.toml of the cluster: measure the links between its hosts there "
                   "(instead of the platform's bandwidth/latency fields).")
@click.option("--gpu/--no-gpu", default=None,
              help="Also time every layer on this machine's Vulkan device [default: when the "
                   "platform lists a GPU and ncnn finds a device].")
def profile(model, platform, output, threads, input_shapes, runs, warmup, no_cache, inventory,
            gpu):
    """Measure every mappable layer of MODEL on the real ncnn engine, and the links."""
    from .core.model import parse_input_shapes
    from .core.outdir import check_writable_file
    from .dse.profile import save_profile
    from .dse.profiler import op_summary, run_profile

    check_writable_file(Path(output))
    links = None
    if inventory:
        from .dse.links import probe_links

        links = probe_links(inventory, console=console, platform=platform)
        _links_table(links, inventory)
    res = run_profile(model, platform, threads, parse_input_shapes(input_shapes), warmup, runs,
                      console=console, use_cache=not no_cache, links=links, gpu=gpu)
    p = res.profile
    save_profile(p, output)
    ts = p.threads
    table = Table(title=f"{len(p.layers)} layers of {p.model} ({res.ncnn_layers} ncnn layers), "
                        f"median ms{' (cached)' if res.cached else ''} -> {output}")
    table.add_column("op")
    table.add_column("layers", justify="right")
    for t in ts:
        table.add_column(f"{t} thr ms", justify="right")
    for t in ts[1:]:
        table.add_column(f"x{t} speed-up (eff.)", justify="right")
    if p.gpu:
        table.add_column("GPU ms", justify="right")
    rows = op_summary(p)
    cols = [*ts, *(["gpu"] if p.gpu else [])]
    total = {t: sum(r[2].get(t, 0.0) for r in rows) for t in cols}
    for op, n, per in [*rows, ("all layers", len(p.layers), total),
                       ("whole model", len(p.layers), res.whole_ms)]:
        table.add_row(op, str(n), *(f"{per[t]:.3f}" for t in ts),
                      *(f"{per[ts[0]] / per[t]:.2f} ({per[ts[0]] / per[t] / t * ts[0]:.0%})"
                        for t in ts[1:]), *([f"{per['gpu']:.3f}"] if p.gpu else []))
    out.print(table)
    if p.gpu:
        out.print(f"GPU {p.gpu.device}: upload {p.gpu.upload.bandwidth / 1e6:.0f} MB/s + "
                  f"{p.gpu.upload.latency * 1e6:.0f} us, download "
                  f"{p.gpu.download.bandwidth / 1e6:.0f} MB/s + "
                  f"{p.gpu.download.latency * 1e6:.0f} us")
    for name, link in sorted(p.links.items()):
        out.print(f"link {name}: {link.bandwidth / 1e6:.0f} MB/s, {link.latency * 1e6:.1f} us")
    if p.corun:
        out.print(f"co-run: the whole model on 1 thread takes {p.corun.slowdown:.2f}x as long "
                  f"while all {p.corun.cores} cores run it")
    if res.unmatched:
        console.print(f"note: {len(res.unmatched)} layers matched no ncnn blob and share their "
                      f"successor's time: {', '.join(res.unmatched[:8])}"
                      f"{'...' if len(res.unmatched) > 8 else ''}")
    for note in res.notes:
        console.print(f"note: {note}")


def _links_table(links, inventory) -> None:
    table = Table(title=f"links measured on the hosts of {inventory}")
    for col in ("hosts", "bandwidth MB/s", "latency us"):
        table.add_column(col, justify="left" if col == "hosts" else "right")
    for pair, link in sorted(links.items()):
        table.add_row(pair, f"{link.bandwidth / 1e6:.2f}", f"{link.latency * 1e6:.1f}")
    console.print(table)


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--platform", "-p", required=True, type=click.Path(dir_okay=False),
              help="platform.txt: the devices (mem, power_* and bandwidth fields feed the model).")
@click.option("--profile", "profiles", multiple=True, metavar="[HOST=]profile.json",
              help="Per-layer latencies from `autodice profile`; HOST=FILE for boards profiled "
                   "apart (repeatable). Omitted: profile the model now.")
@click.option("--output", "-o", required=True, type=click.Path(file_okay=False),
              help="Output directory: pareto.csv, pareto.json, pareto.png, mappings/.")
@click.option("--pop", default=100, show_default=True, help="Population size (the paper's 100).")
@click.option("--gens", default=400, show_default=True, help="Generations (the paper's 400).")
@click.option("--seed", default=0, show_default=True,
              help="Random seed: the same seed, the same front.")
@click.option("--crossover", default=0.5, show_default=True,
              help="Probability that two parents are crossed (two-point).")
@click.option("--mutation", default=0.1, show_default=True,
              help="Probability that an offspring is mutated.")
@click.option("--encoding", default="layer", show_default=True,
              help="layer: a resource per layer (the paper's); segment: K contiguous runs.")
@click.option("--segments", type=int, default=None,
              help="K for --encoding segment (default: the number of resources, at most 16).")
@click.option("--measure", "measure_k", default=0, show_default=True,
              help="Then run this many front points for real here and compare with the model.")
@click.option("--frames", default=100, show_default=True, help="Frames per --measure run.")
@click.option("--rounds", default=5, show_default=True,
              help="--measure runs each point this many times, the points in turn; the median "
                   "round counts.")
@click.option("--inventory", "-i", type=click.Path(dir_okay=False), default=None,
              help="--measure on these hosts (inventory.toml, as deploy takes) instead of here.")
@click.option("--objectives", default="throughput,energy,memory", show_default=True,
              help="What the front trades off: some of throughput, energy, memory.")
@click.option("--max-memory", default=None, metavar="SIZE",
              help="Only mappings whose every device holds at most SIZE (1GB, 512MiB).")
@click.option("--min-fps", "min_fps", type=float, default=None,
              help="Only mappings predicted to reach this many frames/s.")
@click.option("--hosts", default=None, metavar="HOST,HOST,...",
              help="Only these boards of the platform.")
@click.option("--parallel", default="", metavar="data,horizontal",
              help="Also propose stage copies (data) and layers split across resources "
                   "(horizontal) on top of the searched mappings.")
def dse(model, platform, profiles, output, pop, gens, seed, crossover, mutation, encoding,
        segments, measure_k, frames, rounds, inventory, objectives, max_memory, min_fps, hosts,
        parallel):
    """Search mappings of MODEL on the platform with NSGA-II: throughput, energy, memory."""
    from .core.spec import parse_bytes
    from .dse.front import table_rows
    from .dse.measure import measure
    from .dse.search import Settings, profile_arg
    from .dse.search import dse as run_dse

    try:
        cap = parse_bytes(max_memory) if max_memory else None
    except ValueError as e:
        raise AutodiceError(f"--max-memory {max_memory}: {e}") from None
    settings = Settings(pop, gens, seed, crossover, mutation, encoding, segments,
                        tuple(o.strip() for o in objectives.split(",")), cap, min_fps,
                        tuple(k.strip() for k in parallel.split(",") if k.strip()))
    settings.check()
    if measure_k < 0 or frames < 1 or rounds < 1:
        raise AutodiceError(f"--measure {measure_k} --frames {frames} --rounds {rounds}: need "
                            f"--measure >= 0, --frames >= 1 and --rounds >= 1")
    profile = profile_arg(profiles, model, platform)
    with progress() as bar:
        task = bar.add_task(f"NSGA-II, population {pop}", total=gens)
        front = run_dse(model, platform, profile, output, settings,
                        progress=lambda g, n: bar.update(task, completed=g),
                        hosts=hosts.split(",") if hosts else None)
    table = Table(title=f"{len(front.points)} Pareto points, {front.evaluations} mappings scored "
                        f"in {front.seconds:.1f} s -> {output}")
    for col in ("mapping", "energy mJ/frame", "throughput frames/s", "memory MB", "#devices",
                "#cores", "#GPUs"):
        table.add_column(col, justify="left" if col == "mapping" else "right")
    shown = table_rows(front)
    for p in (*front.references, *shown):
        c = p.cost
        table.add_row(p.name, f"{c.max_energy_j * 1e3:.1f}", f"{c.throughput:.2f}",
                      f"{c.max_memory / 1e6:.1f}", str(p.devices), str(c.cores), str(c.gpus),
                      style="dim" if p in front.references else None)
    out.print(table)
    if len(shown) < len(front.points):
        out.print(f"({len(front.points) - len(shown)} more points in {output}/pareto.csv)")
    for note in front.notes:
        out.print(f"note: {note}", soft_wrap=True)
    if measure_k:
        with progress() as bar:
            task = bar.add_task("measuring", total=None)
            results = measure(output, model, platform, profile, measure_k, frames, rounds,
                              inventory,
                              progress=lambda k, n, what: bar.update(task, completed=k, total=n,
                                                                      description=what))
        where = f"on the hosts of {inventory}" if inventory else "on this machine"
        table = Table(title=f"predicted vs measured {where} ({rounds} rounds of {frames} "
                            f"frames; median round)")
        for col in ("point", "predicted fps", "measured fps", "rounds", "error", "predicted MB",
                    "measured MB (peak RSS)", "error", "notes"):
            table.add_column(col, justify="left" if col in ("point", "notes") else "right")
        for m in results:
            table.add_row(m.point, f"{m.predicted_fps:.2f}", f"{m.measured_fps:.2f}",
                          f"{min(m.runs_fps):.0f}-{max(m.runs_fps):.0f}",
                          f"{m.fps_error:+.0%}", f"{m.predicted_memory / 1e6:.1f}",
                          f"{m.measured_memory / 1e6:.1f}", f"{m.memory_error:+.0%}",
                          "; ".join(m.notes))
        out.print(table)


@main.group()
def cluster():
    """An emulated edge cluster here: network namespaces on a bridge, each with its own sshd."""


@cluster.command("up")
@click.option("--hosts", required=True, metavar="NAME,NAME,...",
              help="Host names (as in platform.txt), e.g. edge01,edge02,edge03.")
@click.option("--bandwidth", default="1gbit", show_default=True,
              help="Rate of each host's link, both ways (tbf), e.g. 100mbit; 'none': unshaped.")
@click.option("--cores", multiple=True, metavar="HOST=CPUS",
              help="Run a host (its sshd, all it starts) on CPUs, e.g. edge01=0-1 (repeatable).")
@click.option("--subnet", default="10.77.0.0/24", show_default=True,
              help="IPv4 subnet of the cluster; this machine gets its first address.")
@click.option("--ncnn-dir", type=click.Path(file_okay=False), default=None,
              help="ncnn install the hosts build against (default: one already built here).")
@click.option("--output", "-o", default="inventory.toml", show_default=True,
              type=click.Path(dir_okay=False), help="Where to write the inventory for deploy.")
def cluster_up(hosts, bandwidth, cores, subnet, ncnn_dir, output):
    """Create (or repair) the emulated cluster and write its inventory."""
    from .deploy import cluster as emu

    pins = {}
    for spec in cores:
        host, eq, cpus = spec.partition("=")
        if not eq:
            raise AutodiceError(f"--cores {spec}: expected HOST=CPUS, e.g. edge01=0-1")
        pins[host] = cpus
    with console.status("bringing the cluster up"):
        c = emu.up([h for h in hosts.split(",") if h], None if bandwidth == "none" else bandwidth,
                   pins, subnet, output, ncnn_dir, console)
    _cluster_table(c)
    out.print(f"wrote {output}")


@cluster.command("down")
def cluster_down():
    """Remove every namespace, link, sshd and file of the emulated cluster."""
    from .deploy import cluster as emu

    removed = emu.down()
    out.print(f"removed {len(removed)} things" + (": " + ", ".join(removed) if removed else ""))


@cluster.command("status")
def cluster_status():
    """Show the emulated cluster's hosts, addresses and whether their sshd is alive."""
    from .deploy import cluster as emu

    c, _ = emu.status()
    if c is None:
        out.print("no cluster (run `autodice cluster up --hosts ...`)")
        return
    _cluster_table(c)


def _cluster_table(c) -> None:
    from .deploy import cluster as emu

    _, rows = emu.status()
    rate = f"{int(c.bandwidth[:-3]) / 1e6:g} Mbit/s" if c.bandwidth else "unshaped"
    table = Table(title=f"cluster {c.subnet}, links {rate}, "
                        f"state in {c.state_dir}")
    for col in ("host", "address", "cores", "namespace", "sshd"):
        table.add_column(col)
    for s in rows:
        table.add_row(s.name, s.address, s.cores or "all", "ok" if s.netns else "[red]gone[/red]",
                      f"pid {s.sshd_pid}" if s.sshd_pid else "[red]down[/red]")
    out.print(table)


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
@click.option("--inventory", "-i", required=True, type=click.Path(dir_okay=False),
              help="inventory.toml: ssh destination and remote directory per host.")
@click.option("--run", "run_job", is_flag=True, help="Then run the job across the hosts.")
@click.option("--input", "inputs", multiple=True, metavar="[NAME=]FILE.npy",
              help="Model input as .npy for --run (NAME= needed when the model has several).")
@click.option("--frames", default=1, show_default=True, help="Frames to stream through (--run).")
@click.option("--no-pipeline", is_flag=True, help="Frame by frame, as the AutoDiCE paper ran.")
@click.option("--check", is_flag=True, help="Compare the outputs with onnxruntime (--run).")
@click.option("--rtol", type=float, default=None,
              help="Tolerance for --check [default: 1e-4, or 1e-2 when a rank ran in fp16].")
@click.option("--gpu-fallback", type=click.Choice(["none", "cpu"]), default="none",
              show_default=True,
              help="cpu: a GPU rank on a host without a Vulkan device computes on its CPU.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds the job may run.")
def deploy(output, inventory, run_job, inputs, frames, no_pipeline, check, rtol, gpu_fallback,
           timeout):
    """Copy OUTPUT's packages to the hosts over ssh, build there and (--run) run with mpirun."""
    import numpy as np
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    from .core.plan import load_plan
    from .deploy.deploy import deploy as run_deploy
    from .frontend.check import compare_with_model

    plan = load_plan(output)
    given = _inputs(plan, inputs)
    with progress(SpinnerColumn(), TextColumn("{task.fields[host]:<12}"),
                  TextColumn("{task.description}"), TimeElapsedColumn()) as bar:
        tasks = {h: bar.add_task("waiting", host=h, total=None) for h in plan.hosts()}
        res = run_deploy(output, inventory, run=run_job, inputs=given if run_job else None,
                         frames=frames, pipeline=not no_pipeline, timeout_s=timeout,
                         progress=lambda h, step: bar.update(tasks[h], description=step),
                         gpu_fallback=gpu_fallback == "cpu")
    table = Table(title=f"deployed to {len(res.hosts)} hosts in "
                        f"{sum(res.seconds.values()):.1f} s "
                        f"({', '.join(f'{k} {v:.1f} s' for k, v in res.seconds.items())})")
    for col in ("host", "arch", "sent", "files moved", "program"):
        table.add_column(col, justify="right" if col == "sent" else "left")
    for r in res.hosts.values():
        table.add_row(r.host, r.arch, _human(r.bytes_sent), str(len(r.files)),
                      "built here" if r.built else f"built on {r.built_by}")
    out.print(table)
    if res.run is not None:
        s = res.run.stats
        out.print(f"{s['frames']} frames in {s['seconds']:.3f} s: [bold]{s['fps']:.2f} frames/s"
                  f"[/bold]; results in {res.run.results}")
        _stats_table(s)
        if check:
            feeds = {n: np.load(p) for n, p in given.items()}
            _report_run(compare_with_model(plan, Path(output), feeds, res.run.outputs), rtol, s)


if __name__ == "__main__":
    main()
