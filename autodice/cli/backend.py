"""gen, build, run: the back end's verbs."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import click

from ..backend.precision import DEFAULT_KEEP_FP32
from ..core.errors import AutodiceError, Stopped
from .app import (EXIT_FRAMES_FAILED, INPUT_HELP, console, job_options, main, model_inputs,
                  only_with, out, progress, rate_line, report_run, stats_table, stream_options,
                  visible)


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
@click.option("--precision", default="auto", show_default=True, metavar="PRECISION",
              help="auto, fp32, fp16 or int8 for every key, or KEY=PRECISION,... key by key (a "
                   "bare one sets the rest). auto: fp16 on GPU ranks (ncnn's default there) whose "
                   "values fit fp16's range, fp32 on the rest; fp16: fp16 weights too; int8: "
                   "convolutions and fully connected layers of CPU ranks in int8 "
                   "(--calibration).")
@click.option("--fp16", is_flag=True, help="Same as --precision fp16.")
@click.option("--calibration", metavar="SOURCE", default=None,
              help="int8's calibration frames: a folder of images, a batch .npy, a video (up to "
                   "200 frames), made frames by --preprocess.")
@click.option("--keep-fp32", default=",".join(DEFAULT_KEEP_FP32), show_default=True,
              metavar="LAYER,...",
              help="Layers int8 ranks keep in fp32: ncnn layer names as gen prints them, first "
                   "(the network's first layer, fed the picture), last, sensitive (those that "
                   "alone move their rank's output by more than 5 %, measured); '' for none.")
@click.option("--wire", type=click.Choice(["fp32", "fp16", "int8"]), default="fp32",
              show_default=True,
              help="How float32 tensors that cross hosts travel: fp16 (half the bytes) or int8 "
                   "(8-bit steps between each frame's min and max: a quarter) where the link is "
                   "the bottleneck; within a host they travel as fp32.")
@click.option("--no-verify", "verify", flag_value=False, default=True,
              help="Skip loading and running each converted model in ncnn against onnxruntime.")
@click.option("--verify-with", metavar="FRAME", default=None,
              help="Check each conversion on this frame (an image, a folder's first, a .npy) "
                   "instead of random ones: a detector finds nothing in noise.")
@click.option("--preprocess", default=None, metavar="RECIPE",
              help="How --verify-with's and --calibration's images become frames, as run "
                   "--preprocess.")
def gen(output, precision, fp16, calibration, keep_fp32, wire, verify, verify_with,
        preprocess):
    """Convert OUTPUT's sub-models to ncnn, check each conversion, write a package per host."""
    from ..backend.gen import gen as run_gen
    from ..core.plan import load_plan

    if fp16:  # its own flag: sharing --precision's destination, click 8.1 let it clear that
        if precision not in ("auto", "fp16"):
            raise AutodiceError(f"--fp16 and --precision {precision}: one or the other")
        precision = "fp16"

    n = len(load_plan(output).ranks)
    with progress() as bar:
        task = bar.add_task("converting sub-models with pnnx, then checking them in ncnn",
                            total=n)
        plan = run_gen(output, precision=precision, progress=lambda r: bar.advance(task),
                       verify=verify, console=console, verify_with=verify_with,
                       preprocess=preprocess, calibration=calibration,
                       keep_fp32=tuple(n.strip() for n in keep_fp32.split(",") if n.strip()),
                       wire=wire)
    out.print(visible(f"wrote {output}/packages/ for {', '.join(plan.hosts())}"))


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
def build(output):
    """Build OUTPUT's program (once per architecture), building ncnn first if needed."""
    from ..backend.build import build as run_build

    with console.status("building (ncnn once, then the program)"):
        program = run_build(output, console=console)
    out.print(visible(f"built {program}"))


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
@click.option("--input", "inputs", multiple=True, required=True, metavar="[NAME=]SOURCE",
              help=INPUT_HELP)
@click.option("--results", type=click.Path(file_okay=False), default=None,
              help="Where outputs and stats.json go (default OUTPUT/results).")
@stream_options
@job_options
def run(output, inputs, results, frames, preprocess, task, conf, iou, max_det, annotate, labels,
        top, fmt, window, metrics, no_pipeline, check, rtol, gpu_fallback):
    """Run all ranks of OUTPUT on this machine under mpirun; write outputs and stats.json."""
    from ..core.plan import load_plan

    plan = load_plan(output)
    given = model_inputs(plan, inputs)
    streaming = is_a_stream(plan, given, no_pipeline)
    task = task_for(plan, given, task) if streaming else task
    only_with("--task detect", task == "detect", "conf", "iou", "max_det")
    only_with("--task detect or segment", task in ("detect", "segment"), "annotate")
    if streaming:
        from ..backend.session.results import Reading

        reading = Reading.of(plan, task, labels, top, conf, iou, max_det, preprocess)
        return run_stream(output, plan, given, frames, results, preprocess, reading, fmt,
                          window, check, rtol, gpu_fallback, annotate=annotate, metrics=metrics)
    names = one_frame_labels(plan, given, preprocess, labels, task)
    res = run_repeated(output, plan, given, 1 if frames is None else frames, results, no_pipeline,
                       check, rtol, gpu_fallback)
    if names is not None:
        show_top_k(plan, given, res.outputs, names, top, fmt)


def task_for(plan, given: dict, task: str | None) -> str | None:
    """``--task`` as given or, when absent, the one a stream's outputs leave no doubt about
    (:func:`~autodice.backend.session.results.inferred_task`), said on stderr."""
    from ..backend.session.results import inferred_task

    if task is not None or len(given) != 1:
        return task
    found = inferred_task(plan, next(iter(given.values())))
    if found is not None:
        t = plan.model_outputs[0]
        console.print(f"--task {found}: {t.name} is {'x'.join(map(str, t.shape))}, a YOLO "
                      "head's output (--task none: the outputs alone)", soft_wrap=True)
    return found


def is_a_stream(plan, given: dict, no_pipeline: bool) -> bool:
    """Whether the inputs are a stream of frames (a batch, a folder, stdin), not one frame."""
    from ..backend.session.frames import is_stream

    shapes = {t.name: t.shape for t in plan.model_inputs}
    if not any(is_stream(str(src), shapes[name]) for name, src in given.items()):
        return False
    if no_pipeline:
        raise AutodiceError("--no-pipeline: a stream is pipelined (--window 1 sends one "
                            "frame at a time)")
    return True


def run_repeated(output, plan, given, frames, results, no_pipeline, check, rtol, gpu_fallback):
    """One frame from a .npy, streamed ``frames`` times by the program itself; the run's
    result."""
    import numpy as np
    from rich.text import Text

    from ..backend.run import run as run_job
    from ..frontend.check import compare_with_model

    with console.status(f"running {len(plan.ranks)} ranks x {frames} frames under mpirun"):
        res = run_job(output, given, frames, results, pipeline=not no_pipeline,
                      gpu_fallback=gpu_fallback == "cpu")
    s = res.stats
    out.print(rate_line(s, f" ({'pipelined' if s['pipeline'] else 'frame by frame'}); "
                           f"results in {res.results}"))
    stats_table(s)
    for line in res.warnings:
        console.print(Text.assemble(("warning:", "yellow"), f" {visible(line)}"))
    if check:
        feeds = {n: np.load(p) for n, p in given.items()}
        report_run(compare_with_model(plan, Path(output), feeds, res.outputs), rtol, s, output)
    return res


def one_frame_labels(plan, given: dict, preprocess, labels, task=None) -> list[str] | None:
    """``--labels`` read for one ``.npy`` frame (None without); ``--preprocess`` and ``--task
    detect`` (``segment``) are refused there, as they are for any source of no images."""
    from ..backend.session.results import read_labels

    for flag, given_flag in (("--preprocess", preprocess),
                             (f"--task {task}", task in ("detect", "segment"))):
        if given_flag:
            raise AutodiceError(f"{flag}: {', '.join(map(str, given.values()))} holds no "
                                "images, its frame is fed as it is")
    return read_labels(labels, plan) if labels else None



def show_top_k(plan, given: dict, outputs: dict, names: list[str], k: int, fmt: str) -> None:
    """The one frame's ``k`` best classes by its first output, labelled with its file."""
    from ..backend.session.results import classes

    record = {"frame": Path(next(iter(given.values()))).name,
              "classes": classes(outputs[plan.model_outputs[0].name], names, k)}
    emit(frame_line(record, fmt))


BOXES_SHOWN = 5  # boxes a text line names; the rest are counted


def frame_line(record: dict, fmt: str) -> str | None:
    """One frame's result as its line on stdout: its record as JSON (``--format jsonl``), its
    classes, ``cat.jpg: tabby (0.62), tiger cat (0.21), ...``, or its boxes, ``12: 2 boxes:
    person 0.91 [10,20,120,310], car 0.5 [...]`` (and a segmenter's ``-> masks/000012.png``,
    its instances), or its mask's classes, ``12: background 71%,
    person 29% -> masks/000012.png`` (None: nothing to say)."""
    if fmt == "jsonl":
        return json.dumps(record)  # control characters in a file name come escaped
    if "detections" in record:
        found = record["detections"]
        shown = ", ".join(f"{d.get('label', d['class'])} {d['score']:.2g} "
                          f"[{','.join(f'{v:.0f}' for v in d['box'])}]"
                          for d in found[:BOXES_SHOWN])
        more = f", and {len(found) - BOXES_SHOWN} more" if len(found) > BOXES_SHOWN else ""
        return visible(f"{record['frame']}: {len(found)} box{'es' if len(found) != 1 else ''}"
                       + (f": {shown}{more}" if found else "")
                       + (f" -> {record['mask']}" if "mask" in record else ""))
    if "shares" in record:  # a mask: its classes by the share of the picture they cover
        return visible(f"{record['frame']}: " + ", ".join(
            f"{c.get('label', c['class'])} {c['share']:.0%}" for c in record["shares"]
            [:BOXES_SHOWN]) + f" -> {record['mask']}")
    if "classes" not in record:
        return None
    return visible(f"{record['frame']}: " + ", ".join(f"{c['label']} ({c['score']:.3g})"
                                                      for c in record["classes"]))


def emit(line: str | None, bar=None) -> None:
    """A line of data onto stdout, whole and unwrapped. Where stdout and the progress bar
    share a terminal, above the bar, so neither overwrites the other."""
    if line is None:
        return
    if bar is not None and sys.stdout.isatty() and bar.console.is_terminal:
        bar.console.print(line, soft_wrap=True, markup=False, highlight=False)
    else:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def run_stream(output, plan, given, frames, results, preprocess, reading, fmt, window,
               check, rtol, gpu_fallback, open_session=None, annotate=None, metrics=None):
    """Frames of a batch, a folder of images, a video or stdin through a session, in order;
    ``reading``: what each frame's line says (:class:`~autodice.backend.session.results.
    Reading`).

    ``open_session(status)`` starts the session (default: every rank here); ``status(text)``
    shows what it is doing (deploying, starting the ranks) while the user waits.
    """
    from rich.text import Text

    from ..backend.run import open_session as open_local
    from ..backend.session import check_window
    from ..backend.session.annotate import Annotator
    from ..backend.session.metrics import parse_address
    from ..backend.session.results import finish, source_frames, stream
    from ..core.outdir import claim
    from ..frontend.check import OutputDiff, whole_session

    if frames is not None and frames < 1:
        raise AutodiceError(f"--frames {frames}: need at least 1 frame")
    check_window(window)
    if metrics is not None:
        parse_address(metrics)  # a bad address before anything starts
    count, source = source_frames(plan, next(iter(given.values())), frames, preprocess,
                                  reading.task)
    drawn = (Annotator.of(annotate, next(iter(given.values())), reading.labels) if annotate
             else None)
    if reading.task is not None:
        h, w = plan.model_inputs[0].shape[2:]
        where = Path(results or Path(output) / "results")
        r = reading.task.recipe
        console.print(f"frames letterboxed into {w}x{h} " + (
            "as Ultralytics does (RGB / 255, grey 114 around); boxes into "
            f"{where}/detections.jsonl" if r is None else
            f"(RGB / {r.scale:g}, mean {'/'.join(f'{v:g}' for v in r.mean)}, std "
            f"{'/'.join(f'{v:g}' for v in r.std)}); masks into {where}/masks/"),
            soft_wrap=True)
    whole = whole_session(plan, Path(output), None) if check else None
    if results is None:
        claim(Path(output), "results/")
        results = Path(output) / "results"
    with progress(*_stream_columns()) as bar:
        task = bar.add_task("starting the ranks", total=count)
        opener = open_session or (lambda status: open_local(output, window,
                                                            gpu_fallback == "cpu"))
        with opener(lambda text: bar.update(task, description=text)) as session:
            if metrics is not None:
                console.print(f"metrics at http://{session.serve_metrics(metrics)}/metrics",
                              soft_wrap=True)
            bar.update(task, description="streaming")

            def shown(record, result):
                bar.advance(task)
                if isinstance(result, AutodiceError):
                    console.print(Text.assemble(("error:", "red"), f" {visible(str(result))}"),
                                  soft_wrap=True)
                emit(frame_line(record, fmt), bar)

            res = stream(session, plan, source, count, Path(results), whole, shown, reading,
                         drawn)
        res = finish(session, res)
    s = res.stats
    lat = s["latency_s"]
    out.print(rate_line(s, f", latency p50 {lat['p50'] * 1e3:.1f} ms, p99 "
                           f"{lat['p99'] * 1e3:.1f} ms"
                           f"{f', {len(res.errors)} frames failed' if res.errors else ''}"
                           f"{f', {res.dropped} live frames dropped' if res.dropped else ''}; "
                           f"results in {res.results}"))
    stats_table(s)
    for incident in s.get("incidents", []):
        out.print(incident_line(incident))
    if res.interrupted:  # the frames delivered are written; now end as the signal asked
        console.print(f"{res.delivered} frames delivered before {res.interrupted}; their "
                      f"results are in {res.results}", soft_wrap=True)
        raise Stopped(getattr(signal, res.interrupted))
    if check:
        diffs = [OutputDiff(n, a, r) for n, (a, r) in res.worst.items()]
        report_run(diffs, rtol, s, output)
    if res.errors:
        sys.exit(EXIT_FRAMES_FAILED)


def incident_line(i: dict):
    """What a recovering session did about one lost host (or a rebalance), in one line (a rich
    Text; the failure's words may hold tensor names)."""
    from rich.text import Text

    hosts = ", ".join(i["hosts"])
    if "rebalanced" in i:
        return Text(f"{', '.join(i['rebalanced'])} back: rebalanced onto {hosts}")
    phases = ", ".join(f"{k[:-2]} {i[k]:.1f} s" for k in ("detect_s", "plan_s", "deploy_s",
                                                           "restart_s") if k in i)
    took = f"{i['first_result_s']:.1f} s" if "first_result_s" in i else "no result since"
    return Text.assemble((f"{', '.join(i['lost'])} lost", "yellow"),
                         f" after frame {i['after_frame']} ({visible(i['why'])}): went on over "
                         f"{hosts} ({visible(i['mapping_from'])}), {i['replayed']} frames "
                         f"sent again; to the first new result {took} ({phases})")


def _stream_columns():
    """Description, bar (a stream of unknown length: a pulse), frames done, frames/s, time."""
    from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, TextColumn
    from rich.progress import TimeElapsedColumn
    from rich.text import Text

    class Speed(ProgressColumn):
        def render(self, task):
            return Text(f"{task.speed:.1f} frames/s" if task.speed else "")

    return (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), Speed(),
            TimeElapsedColumn())
