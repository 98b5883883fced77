"""The command's frame: the group, its one-line errors, lazy progress bars, and the reports
several verbs print (check results, the per-rank run table).

rich is imported on first use, not with the command: it costs a tenth of a second, and
``autodice split`` — which prints a plain table — takes about half a second in all.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import click

from ..core.errors import AutodiceError, JobError, Stopped
from ..core.plan import human_bytes
from ..core.stops import SIGNALS, on_stop


class PositiveFloat(click.ParamType):
    """A finite number above 0 (click's FloatRange lets NaN through: every check then failed)."""

    name = "number"

    def convert(self, value, param, ctx):
        v = click.FLOAT.convert(value, param, ctx)
        if not (0 < v < float("inf")):
            self.fail(f"{value} is not a finite number above 0", param, ctx)
        return v


POSITIVE = PositiveFloat()


class LazyConsole:
    """A ``rich.console.Console`` made on first use, with these options. It stands for the
    console wherever one is passed (rich's progress bars enter it as a context manager)."""

    def __init__(self, **options):
        self._options = options
        self._console = None

    def _get(self):
        if self._console is None:
            from rich.console import Console

            options = {k: v() if callable(v) else v for k, v in self._options.items()}
            self._console = Console(**options)
        return self._console

    def __getattr__(self, name):
        return getattr(self._get(), name)

    def __enter__(self):
        return self._get().__enter__()

    def __exit__(self, *exc):
        return self._get().__exit__(*exc)


# No markup in what is printed: names from models and specs are data, and "[/x]" in one would
# end a style that never began (an error) or start one. Colour goes in as rich Text.
console = LazyConsole(stderr=True, markup=False)
# Tables stay readable when piped (rich would squeeze them to 80 columns).
out = LazyConsole(width=lambda: None if sys.stdout.isatty() else 130, markup=False)


def numpy_without_threads() -> None:
    """Load numpy (which onnx imports) without OpenBLAS's thread pool, for a verb that is over
    in a second and does no linear algebra: the pool's threads start beside the imports and
    spin (measured: 40 to 60 ms CPU of a ~0.6 s ``autodice split``, 2 cores). A user's own
    OPENBLAS_NUM_THREADS is kept, and so is a numpy already loaded (as in a test process)."""
    if "numpy" not in sys.modules and "OPENBLAS_NUM_THREADS" not in os.environ:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"  # read once, when numpy loads OpenBLAS
        try:
            import numpy  # noqa: F401
        finally:
            del os.environ["OPENBLAS_NUM_THREADS"]


def text_table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]],
               left: tuple[str, ...] = ()) -> str:
    """``rows`` under ``columns`` as aligned plain text (columns named in ``left`` align left,
    the rest right), below ``title``: a table printed without importing rich."""
    rows = [tuple(map(visible, r)) for r in rows]  # keys and names are data
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]

    def line(cells) -> str:
        return "  ".join(cell.ljust(w) if col in left else cell.rjust(w)
                         for col, cell, w in zip(columns, cells, widths)).rstrip()

    return "\n".join([title, line(columns), line("─" * w for w in widths),
                      *(line(r) for r in rows)])


# Exit codes (docs/running.md, "Exit codes and signals"): besides 0, and 1 for a failed --check.
EXIT_REFUSED = 2  # bad input or an unusable environment, said before anything ran
EXIT_FRAMES_FAILED = 3  # a stream delivered what it could; some frames (or all) failed
EXIT_JOB_FAILED = 4  # the job started and then failed (a rank died, a board or a live source lost)


class Main(click.Group):
    """Turns AutodiceError into one ``error:`` line per problem and exit code 2 (4 for a job that
    failed once started), and a signal into a clean stop with exit code 128 + its number.

    click's own complaints about the command line (an unknown option, a value that is not a
    number, a file that is a directory) get the same one-line form, and so does an error of
    the machine (a full disk, a folder autodice may not write) that no check foresaw.
    SIGTERM and SIGHUP stop a verb as Ctrl-C does (:class:`~autodice.core.errors.Stopped`): the
    job ends in order, and a stream writes what it delivered (:mod:`autodice.core.stops`).
    """

    def invoke(self, ctx):
        main_thread = threading.current_thread() is threading.main_thread()
        before = {s: signal.signal(s, on_stop) for s in SIGNALS
                  if main_thread}  # (a test's runner in-process: its handlers come back)
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as e:
            signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
            click.echo(f"stopped by {signal.Signals(signum).name}", err=True)
            sys.exit(128 + signum)
        except AutodiceError as e:
            for line in e.problems:
                click.echo(f"error: {visible(line)}", err=True)
            sys.exit(EXIT_JOB_FAILED if isinstance(e, JobError) else EXIT_REFUSED)
        except click.UsageError as e:
            hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
            click.echo(f"error: {visible(e.format_message())}{hint}", err=True)
            sys.exit(EXIT_REFUSED)
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            click.echo(f"error: {visible(where + (e.strerror or str(e)))}", err=True)
            sys.exit(EXIT_REFUSED)
        finally:
            for signum, handler in before.items():
                signal.signal(signum, handler)


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


def job_options(command):
    """The options of a job that runs frames (``run`` and ``deploy --run``)."""
    for option in reversed((
            click.option("--no-pipeline", is_flag=True,
                         help="Frame by frame, as the AutoDiCE paper ran."),
            click.option("--check", is_flag=True, help="Compare the outputs with onnxruntime."),
            click.option("--rtol", type=POSITIVE, default=None,
                         help="Tolerance for --check [default: 1e-4, or 1e-2 when a rank ran in "
                              "fp16]."),
            click.option("--gpu-fallback", type=click.Choice(["none", "cpu"]), default="none",
                         show_default=True,
                         help="cpu: a GPU rank on a host without a Vulkan device computes on "
                              "its CPU."))):
        command = option(command)
    return command


def stream_options(command):
    """The options of a stream of real frames (``run`` and ``deploy --run`` with a batch, a
    folder of images or stdin as the input)."""
    for option in reversed((
            click.option("--frames", type=int, default=None,
                         help="One frame: how many times to stream it [default: 1]. A stream: "
                              "stop after this many frames."),
            click.option("--preprocess", default=None, metavar="KEY=VALUE,...",
                         help="Images: resize (shorter side over the input's, default 1.143), "
                              "mean and std (a/b/c; default ImageNet's), scale (255), layout "
                              "(nchw|nhwc), bgr (0|1)."),
            click.option("--task", type=click.Choice(["classify", "detect", "segment", "none"]),
                         default=None,
                         help="detect: a YOLO head's output as boxes in the source's pixels "
                              "(frames letterboxed as Ultralytics does; detections.jsonl; a "
                              "YOLO segmenter's instance masks too, masks/*.png). "
                              "segment: each pixel's class, in the source's pixels (frames "
                              "letterboxed, normalised by --preprocess; masks/*.png). none: "
                              "the outputs alone. [default: detect for pictures through a "
                              "YOLO head, else classify with --labels, else none]"),
            click.option("--conf", type=float, default=0.25, show_default=True,
                         help="detect: the least score a box keeps."),
            click.option("--iou", type=float, default=0.7, show_default=True,
                         help="detect: boxes of a class overlapping past this are one (NMS)."),
            click.option("--max-det", "max_det", type=int, default=300, show_default=True,
                         help="detect: boxes a frame at most."),
            click.option("--annotate", type=click.Path(), default=None, metavar="DIR|FILE.mp4",
                         help="detect, segment: each frame with its boxes or mask drawn, into "
                              "a video (by its suffix) or a folder of pictures."),
            click.option("--labels", type=click.Path(dir_okay=False), default=None,
                         help="Class names, one a line: print each frame's top-k classes "
                              "(with --task detect or segment, each box's or mask's class "
                              "names)."),
            click.option("--top-k", "top", default=5, show_default=True, type=click.IntRange(1),
                         help="Classes printed per frame."),
            click.option("--format", "fmt", type=click.Choice(["text", "jsonl"]),
                         default="text", show_default=True,
                         help="Per-frame results on stdout: text (with --labels, a line of "
                              "classes a frame) or jsonl (a JSON object a frame: its label, "
                              "classes, error)."),
            click.option("--window", type=int, default=None,
                         help="A stream: frames in flight at most [default: 2 x ranks + 2]."),
            click.option("--metrics", default=None, metavar="[HOST]:PORT",
                         help="A stream: Prometheus metrics served there while it runs "
                              "(:9464 binds to loopback)."))):
        command = option(command)
    return command


INPUT_HELP = ("Model input: FILE.npy holding one frame (repeated --frames times) or a batch "
              "(N, ...) of frames, a folder of images, one image, a video (a file, rtsp://..., "
              "/dev/videoN), or - for raw frames on stdin (NAME= needed when the model has "
              "several inputs).")


input_shape_option = click.option(
    "--input-shape", "input_shapes", multiple=True, metavar="NAME=1x3x224x224",
    help="Static shape for a model input with symbolic dimensions (repeatable).")


def report(diffs, rtol) -> None:
    from rich.text import Text

    bad = [d for d in diffs if not d.rel <= rtol]
    for d in diffs:
        out.print(Text.assemble(f"check {visible(d.name)}: max abs {d.max_abs:.3g}, rel "
                                f"{d.rel:.3g} (rtol {rtol:g}) ",
                                ("FAIL", "red") if d in bad else ("ok", "green")))
    if bad:
        sys.exit(1)


def only_with(needed: str, present: bool, *params: str) -> None:
    """Options that mean something only with another one, given without it: an error naming
    both, instead of a run that ignores what the user asked for. ``params``: the parameters'
    names; given means on the command line (a default is no request).

    Raises:
        AutodiceError: one line, the first such option.
    """
    if present:
        return
    ctx = click.get_current_context()
    for name in params:
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            option = next(p for p in ctx.command.params if p.name == name)
            raise AutodiceError(f"{option.opts[0]}: only with {needed}")


def model_inputs(plan, specs) -> dict[str, Path | str]:
    """``--input [NAME=]FILE.npy`` options as model input name -> file, or a stream's URL as
    it is (``rtsp://cam/x?channel=1``: a Path would make ``rtsp:/``). A name is one of the
    model's (names and paths may both hold "="); with one input, a path or URL alone will do."""
    from ..backend.session.video import URL_SCHEMES

    names = [t.name for t in plan.model_inputs]
    given = {}
    for spec in specs:
        name = max((n for n in names if spec.startswith(n + "=")), key=len, default=None)
        if name is not None:
            path = spec[len(name) + 1:]
        elif len(names) == 1 and ("=" not in spec or Path(spec).exists()
                                  or spec.startswith(URL_SCHEMES)):
            name, path = names[0], spec
        else:
            raise AutodiceError(f'--input {spec}: name one of the model inputs '
                                f'({", ".join(names)}) as NAME=FILE.npy')
        if name in given:
            raise AutodiceError(f'--input {spec}: input "{name}" is given twice')
        given[name] = path if path.startswith(URL_SCHEMES) else Path(path)
    return given


def rate_line(stats: dict, *more: str):
    """Frames, seconds and frames/s of a job, and its steady state where it has one (the
    pipeline's filling and draining left out: what a long stream of frames would get), then
    ``more``: a rich Text."""
    from rich.text import Text

    steady = stats.get("steady_fps")
    return Text.assemble(f"{stats['frames']} frames in {stats['seconds']:.3f} s: ",
                         (f"{stats['fps']:.2f} frames/s", "bold"),
                         f", {steady:.2f} once the pipeline is full"
                         if steady and stats["frames"] > 2 else "", *more)


def stats_table(stats: dict) -> None:
    """One row per rank: where it ran (device, precision, cores) and where its time went
    (nothing from a job that did not end in order)."""
    from rich.table import Table

    if not stats.get("ranks"):
        return
    table = Table()
    for col in ("rank", "key", "device", "precision", "on cores", "load s", "compute s",
                "recv wait s", "send wait s", "sent", "peak RSS"):
        table.add_column(col, justify="left" if col in ("key", "device", "precision",
                                                         "on cores") else "right")
    for r in stats["ranks"]:
        device = r.get("device", "?")  # "vulkan:llvmpipe (LLVM 15.0.6, 256 bits)" in full
        device = "cpu (fallback)" if device.startswith("cpu (") else device.split(" (")[0]
        table.add_row(str(r["rank"]), visible(r["key"]), visible(device), r.get("precision", "?"),
                      ",".join(map(str, r["omp_cpus"])), f"{r['load_s']:.3f}",
                      f"{r['compute_s']:.3f}", f"{r['recv_wait_s']:.3f}",
                      f"{r['send_wait_s']:.3f}", human_bytes(r["bytes_sent"]),
                      human_bytes(r["peak_rss"]))
    out.print(table)


def report_run(diffs, rtol, stats, output) -> None:
    """--check of a run: the tolerance is the user's, else what the ranks' precision and
    OUTPUT's wire format allow."""
    from ..backend.run import check_tolerance
    from ..backend.wire import Wire

    if rtol is None:
        rtol, why = check_tolerance(stats, Wire.of_output(output))
        out.print(f"tolerance {rtol:g} ({why})")
    report(diffs, rtol)
