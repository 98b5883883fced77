"""profile, dse: the design-space exploration's verbs."""

from __future__ import annotations

from pathlib import Path

import click

from ..core.errors import AutodiceError
from .app import console, input_shape_option, main, only_with, out, progress


def _thread_list(ctx, param, value):
    if value is None:
        return None
    try:
        threads = tuple(int(t) for t in value.split(","))
    except ValueError:
        raise click.BadParameter(f'"{value}" is not a list of thread counts such as 1,2') from None
    return threads


def _core_list(ctx, param, value):
    from ..core.spec import parse_cores

    try:
        return None if value is None else parse_cores(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


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
@click.option("--on", "on", metavar="HOST", default=None,
              help="Measure the layers on this host of --inventory (a board: the profiler is "
                   "built for it, cross-compiled here as deploy does) instead of here; give "
                   "the result to dse as --profile HOST=FILE.")
@click.option("--gpu/--no-gpu", default=None,
              help="Also time every layer on this machine's Vulkan device [default: when the "
                   "platform lists a GPU and ncnn finds a device].")
@click.option("--little", callback=_core_list, metavar="CORES",
              help="The measuring machine's little cores (a big.LITTLE board, e.g. 4-7): time "
                   "every layer pinned to them and, apart, to its other cores [default with "
                   "--on HOST: the platform's little= of HOST].")
@click.option("--int8", is_flag=True,
              help="Also time every layer quantized, as gen --precision int8 makes it: dse then "
                   "offers keys in int8.")
def profile(model, platform, output, threads, input_shapes, runs, warmup, no_cache, inventory,
            on, gpu, little, int8):
    """Measure every mappable layer of MODEL on the real ncnn engine, and the links."""
    import contextlib

    from rich.table import Table

    from ..core.outdir import check_writable_file
    from ..core.shapes import parse_input_shapes
    from ..core.spec import format_cores
    from ..deploy.inventory import load_inventory
    from ..dse.profile import save_profile
    from ..dse.profile_args import check_profile_args
    from ..dse.profiler import op_summary, run_profile
    from ..dse.remote_tools import host_inventory, on_host

    check_writable_file(Path(output))
    given = "--little"
    if on and not inventory:
        raise AutodiceError(f"--on {on}: needs --inventory, the cluster {on} is a host of")
    shapes = parse_input_shapes(input_shapes)
    cluster = load_inventory(inventory) if inventory else None
    if cluster:  # everything said before the network is used (links measured, tools shipped)
        spec, _ = check_profile_args(Path(model), platform, threads, shapes, warmup, runs, gpu,
                                     bool(on), little)
        if on:
            host_inventory(cluster, on)
            if little is None and on in spec.devices and spec.devices[on].little:
                little, given = spec.devices[on].little, f"{spec.path}: {on}'s little="
    links = None
    if inventory and not (on and len(cluster.targets) < 2):
        from ..dse.links import probe_links

        links = probe_links(inventory, console=console, platform=platform)
        _links_table(links, inventory)
    with on_host(cluster, on, console) if on else contextlib.nullcontext() as machine:
        res = run_profile(model, platform, threads, shapes, warmup, runs, console=console,
                          use_cache=not no_cache, links=links, gpu=gpu, on=machine,
                          little=little, little_from=given, int8=int8)
    p = res.profile
    save_profile(p, output)
    ts = p.threads
    where = f" on {on} ({p.machine['arch']})" if on else ""
    table = Table(title=f"{len(p.layers)} layers of {p.model} ({res.ncnn_layers} ncnn layers)"
                        f"{where}, median ms{' (cached)' if res.cached else ''} -> {output}")
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
    if p.little:
        times = ", ".join(f"{res.whole_ms[f'little {t}']:.3f} ms on {t} thr"
                          for t in p.little.threads)
        out.print(f"little cores {format_cores(p.little.cores)}: the whole model {times}; on 1 "
                  f"thr x{res.whole_ms['little 1'] / res.whole_ms[1]:.2f} a big core's time")
    if int8:
        times = ", ".join(f"{res.whole_ms[f'int8 {t}']:.3f} ms on {t} thr" for t in ts)
        ratio = res.whole_ms["int8 1"] / res.whole_ms[1]
        out.print(f"int8: the whole model {times}; on 1 thr x{ratio:.2f} its fp32 time")
        if p.little:
            times = ", ".join(f"{res.whole_ms[f'little int8 {t}']:.3f} ms on {t} thr"
                              for t in p.little.threads)
            ratio = res.whole_ms["little int8 1"] / res.whole_ms["little 1"]
            out.print(f"int8 on the little cores: the whole model {times}; on 1 thr "
                      f"x{ratio:.2f} its fp32 time there")
    if p.corun:
        out.print(f"co-run: the whole model on 1 thread takes {p.corun.slowdown:.2f}x as long "
                  f"while all {p.corun.cores} cores run it")
    if res.unmatched:
        console.print(f"note: {len(res.unmatched)} layers matched no ncnn blob and share their "
                      f"successor's time: {', '.join(res.unmatched[:8])}"
                      f"{'...' if len(res.unmatched) > 8 else ''}", soft_wrap=True)
    for note in res.notes:
        console.print(f"note: {note}", soft_wrap=True)


def _links_table(links, inventory) -> None:
    from rich.table import Table

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
              help="Output directory: pareto.csv, pareto.json, pareto.png, report.html, "
                   "mappings/.")
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
@click.option("--pace", is_flag=True,
              help="--measure also runs the whole model alone on one core of each host every "
                   "round: each host's pace against its profile, and each point at that pace.")
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
@click.option("--int8", is_flag=True,
              help="Without --profile: profile with int8 times too, so keys may be int8 (a "
                   "point's mappings/<point>.precision is what gen --precision takes).")
@click.option("--wire", type=click.Choice(["fp32", "fp16", "int8"]), default="fp32",
              show_default=True,
              help="Price tensors that cross hosts as gen --wire sends them: fp16 (half the "
                   "bytes) or int8 (a quarter).")
@click.option("--min-agreement", type=float, default=None, metavar="SHARE",
              help="After the search, make every point with int8 keys (or a smaller --wire) as "
                   "gen would and hold it to the whole model on --calibration's frames: top-1 "
                   "agreement, mask IoU, else 1 - the share an output moved. Points below it "
                   "keep their mapping in fp32 (e.g. 0.99).")
@click.option("--calibration", metavar="SOURCE", default=None,
              help="--min-agreement's frames, int8's calibration too: images, a batch .npy, a "
                   "video.")
@click.option("--preprocess", default=None, metavar="RECIPE",
              help="How --calibration's images become frames, as run --preprocess.")
@click.option("--agreement-frames", type=int, default=50, show_default=True,
              help="Frames of --calibration each point is measured on.")
@input_shape_option
def dse(model, platform, profiles, output, pop, gens, seed, crossover, mutation, encoding,
        segments, measure_k, frames, rounds, inventory, pace, objectives, max_memory, min_fps,
        hosts, parallel, int8, wire, min_agreement, calibration, preprocess, agreement_frames,
        input_shapes):
    """Search mappings of MODEL on the platform with NSGA-II: throughput, energy, memory."""
    from rich.table import Table

    from ..core.shapes import parse_input_shapes
    from ..core.spec import parse_bytes
    from ..dse.front import table_rows
    from ..dse.measure import measure
    from ..dse.search import Settings, profile_arg
    from ..dse.search import dse as run_dse
    from ..dse.settings import Floor

    try:
        cap = parse_bytes(max_memory) if max_memory else None
    except ValueError as e:
        raise AutodiceError(f"--max-memory {max_memory}: {e}") from None
    settings = Settings(pop, gens, seed, crossover, mutation, encoding, segments,
                        tuple(o.strip() for o in objectives.split(",")), cap, min_fps,
                        tuple(k.strip() for k in parallel.split(",") if k.strip()), wire)
    settings.check()
    floor = Floor.asked(min_agreement, calibration, preprocess, agreement_frames)
    only_with("--min-agreement", min_agreement is not None, "calibration", "preprocess",
              "agreement_frames")
    only_with("--measure", measure_k > 0, "pace", "inventory", "frames", "rounds")
    only_with("--encoding segment", encoding == "segment", "segments")
    if measure_k < 0 or frames < 1 or rounds < 1:
        raise AutodiceError(f"--measure {measure_k} --frames {frames} --rounds {rounds}: need "
                            f"--measure >= 0, --frames >= 1 and --rounds >= 1")
    if inventory:  # read now: a typo there is said before the search, not after it
        from ..deploy.inventory import load_inventory

        load_inventory(inventory)
    shapes = parse_input_shapes(input_shapes)
    if int8 and profiles:
        raise AutodiceError("--int8 profiles the model; with --profile, give a profile made "
                            "with `autodice profile --int8`")
    profile = profile_arg(profiles, model, platform, shapes, int8)
    with progress() as bar:
        task = bar.add_task(f"NSGA-II, population {pop}", total=gens)
        held = bar.add_task("accuracy floor", total=None, visible=False)

        def floor_progress(done: int, total: int, what: str) -> None:
            bar.update(held, visible=True, completed=done, total=total,
                       description=f"accuracy floor: {what}")

        front = run_dse(model, platform, profile, output, settings,
                        progress=lambda g, n: bar.update(task, completed=g),
                        hosts=hosts.split(",") if hosts else None, input_shapes=shapes,
                        floor=floor, floor_progress=floor_progress)
    table = Table(title=f"{len(front.points)} Pareto points, {front.evaluations} mappings scored "
                        f"in {front.seconds:.1f} s -> {output}")
    quantized = any(p.precision for p in front.points)
    for col in ("mapping", "energy mJ/frame", "throughput frames/s", "memory MB", "#devices",
                "#cores", "#GPUs", *(["#int8 keys"] if quantized else []),
                *(["agreement"] if floor else [])):
        table.add_column(col, justify="left" if col == "mapping" else "right")
    shown = table_rows(front)
    for p in (*front.references, *shown):
        c = p.cost
        table.add_row(p.name, f"{c.max_energy_j * 1e3:.1f}", f"{c.throughput:.2f}",
                      f"{c.max_memory / 1e6:.1f}", str(p.devices), str(c.cores), str(c.gpus),
                      *([str(len(p.precision))] if quantized else []),
                      *([f"{p.agreement[0]:.3f}" if p.agreement else ""] if floor else []),
                      style="dim" if p in front.references else None)
    out.print(table)
    if len(shown) < len(front.points):
        out.print(f"({len(front.points) - len(shown)} more points in {output}/pareto.csv)")
    if quantized:
        out.print(f"int8 keys: gen OUT --precision \"$(cat {output}/mappings/POINT.precision)\" "
                  "--calibration FRAMES")
    for note in front.notes:
        out.print(f"note: {note}", soft_wrap=True)
    if measure_k:
        with progress() as bar:
            task = bar.add_task("measuring", total=None)
            results = measure(output, model, platform, profile, measure_k, frames, rounds,
                              inventory, hosts=hosts.split(",") if hosts else None, pace=pace,
                              input_shapes=shapes,
                              progress=lambda k, n, what: bar.update(task, completed=k, total=n,
                                                                      description=what))
        where = f"on the hosts of {inventory}" if inventory else "on this machine"
        table = Table(title=f"predicted vs measured {where} ({rounds} rounds of {frames} "
                            f"frames; median round)")
        paced = ("at the hosts' pace",) if pace else ()
        for col in ("point", "predicted fps", "measured fps", "rounds", "error", *paced,
                    "predicted MB", "measured MB (peak RSS)", "error", "notes"):
            table.add_column(col, justify="left" if col in ("point", "notes") else "right")
        for m in results:
            table.add_row(m.point, f"{m.predicted_fps:.2f}", f"{m.measured_fps:.2f}",
                          f"{min(m.runs_fps):.0f}-{max(m.runs_fps):.0f}", f"{m.fps_error:+.0%}",
                          *((f"{m.paced_fps_error:+.0%}",) if pace else ()),
                          f"{m.predicted_memory / 1e6:.1f}",
                          f"{m.measured_memory / 1e6:.1f}", f"{m.memory_error:+.0%}",
                          "; ".join(m.notes))
        out.print(table)
        _print_energy(out, results, where)


def _print_energy(out, results, where: str) -> None:
    """The energy objective checked where a host has a sensor (dse/measure.py), or one line
    saying that nothing measured it."""
    from rich.table import Table

    checks = [(m.point, e) for m in results for e in m.energy]
    if not any(e.measured_j is not None for _, e in checks):
        hosts = ", ".join(sorted({e.host for _, e in checks}))
        out.print(f"energy: no power sensor {where} ({hosts}): the energy objective rests on "
                  "platform.txt's watts, unmeasured", soft_wrap=True)
        return
    table = Table(title=f"energy per frame, predicted vs measured {where}")
    for col in ("point", "host", "predicted mJ", "measured mJ", "error", "sensor"):
        table.add_column(col, justify="left" if col in ("point", "host", "sensor") else "right")
    for point, e in checks:
        table.add_row(point, e.host, f"{e.predicted_j * 1e3:.2f}",
                      "-" if e.measured_j is None else f"{e.measured_j * 1e3:.2f}",
                      "-" if e.error is None else f"{e.error:+.0%}", e.sensor or "no sensor")
    out.print(table)
