"""The Python API: what the CLI does, as functions a script can call and compose.

Every function takes paths or the objects the others return, raises
:class:`~autodice.core.errors.AutodiceError` (one line per problem) on bad input, and leaves
nothing half-written. A typical script::

    import autodice

    profile = autodice.profile("densenet121.onnx", "platform.txt")      # measured once, cached
    front = autodice.search("densenet121.onnx", "platform.txt", profile,
                            objectives=("throughput", "memory"), max_memory="1GB",
                            hosts=["edge01", "edge02"], out="front")
    best = front.points[0]                                                # fastest first
    print(best.cost.throughput, best.cost.max_memory, best.mapping)
    autodice.split("densenet121.onnx", "front/mappings/p0.json", "platform.txt", "out")
    autodice.gen("out")
    autodice.build("out")
    result = autodice.run("out", {"data_0": "x.npy"}, frames=100)
    print(result.stats["fps"], autodice.predict("out", profile).throughput)

Nothing here is imported until used: ``import autodice`` stays cheap (the CLI starts fast).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from .core.errors import AutodiceError


def plan(model, mapping, platform, input_shapes=None):
    """The plan of ``model`` split as ``mapping`` says onto ``platform``, without writing
    anything (``mapping`` may be a path or a ``{key: [layers]}`` dict).

    Returns:
        :class:`~autodice.core.plan.Plan`.
    """
    return _partition(model, mapping, platform, input_shapes).plan


def _partition(model, mapping, platform, input_shapes=None):
    """The model as the mapping rewrites it (layers split across keys) and its plan."""
    from .core.mapping import mapping_from, parse_mapping
    from .core.model import load_model
    from .core.spec import parse_platform
    from .frontend.split import partition_mapping

    spec = (mapping_from(dict(mapping), "mapping") if isinstance(mapping, Mapping)
            else parse_mapping(mapping))
    return partition_mapping(load_model(model, input_shapes), spec, parse_platform(platform),
                             Path("."))


def split(model, mapping, platform, out, input_shapes=None):
    """Split into ``out``: sub-models, rankfile, tables, plan.json (see ``autodice split``)."""
    import autodice.frontend.split

    return autodice.frontend.split.split(model, mapping, platform, out, input_shapes)


def check(out, samples: int = 1):
    """The sub-models chained in onnxruntime against the whole model: one diff per output."""
    import autodice.frontend.check

    return autodice.frontend.check.check(out, samples=samples)


def gen(out, precision: str = "auto", verify: bool = True, verify_with=None, preprocess=None,
        calibration=None, keep_fp32=None, wire="fp32"):
    """Convert to ncnn, check every conversion (on random frames, or on ``verify_with``'s
    first: an image made a frame by ``preprocess``, or a .npy), write the program and a
    package per host. ``precision`` ``int8`` (or ``KEY=int8,...``) calibrates on
    ``calibration``'s frames and keeps ``keep_fp32``'s layers in fp32 (None: the first and the
    sensitive ones). ``wire`` ``fp16`` or ``int8``: float32 tensors that cross hosts travel in
    fewer bytes."""
    import autodice.backend.gen

    return autodice.backend.gen.gen(out, precision=precision, verify=verify,
                                    verify_with=verify_with, preprocess=preprocess,
                                    calibration=calibration, keep_fp32=keep_fp32, wire=wire)


def build(out):
    """Build the program here (ncnn built once first, if needed); returns its path."""
    import autodice.backend.build

    return autodice.backend.build.build(out)


def run(out, inputs: Mapping[str, str | Path] | str | Path, frames: int | None = None,
        pipeline: bool = True, gpu_fallback: bool = False, preprocess: str | None = None,
        labels: str | Path | None = None, top: int = 5, task: str | None = None,
        conf: float = 0.25, iou: float = 0.7, max_det: int = 300, annotate=None):
    """Run every rank here under mpirun; outputs, stats.json (frames/s, per rank times).

    ``inputs``: ``{input name: .npy}`` of one frame, which the program streams ``frames``
    times (default 1); or, for a model of one input, what ``run --input`` takes: a folder of
    images, an image, a video (a file, ``rtsp://...``) or a batch ``.npy``, streamed through a
    session (at most ``frames``), each image made a frame by ``preprocess``, each frame's
    ``top`` classes by ``labels`` in ``frames.json``; ``task="detect"``: frames letterboxed and
    each frame's boxes (``conf``, ``iou``, ``max_det``) in ``detections.jsonl`` and the
    result's ``records``, drawn into ``annotate`` (a video by its suffix, else a folder; the
    task when none is given, for pictures through a YOLO head: ``task="none"`` says no);
    ``task="segment"``: frames letterboxed (normalised by ``preprocess``, ImageNet's by
    default) and each frame's mask in ``masks/<frame>.png``, laid over it in ``annotate``.
    Returns the run's result, or the stream's (``errors`` for the frames that failed).
    """
    if isinstance(inputs, (str, Path)):
        return _run_source(out, inputs, frames, preprocess, gpu_fallback,
                           (task, labels, top, conf, iou, max_det), annotate)
    import autodice.backend.run

    from .backend.session import check_count

    frames = 1 if frames is None else frames
    check_count("frames", frames, "frame")
    return autodice.backend.run.run(out, _inputs(inputs), frames, pipeline=pipeline,
                                    gpu_fallback=gpu_fallback)


def _run_source(out, source, frames, preprocess, gpu_fallback, reading_args, annotate):
    from .backend.run import open_session
    from .backend.session.annotate import Annotator
    from .backend.session.results import Reading, finish, inferred_task, source_frames, stream
    from .core.outdir import claim
    from .core.plan import load_plan

    plan = load_plan(out)
    task, *rest = reading_args
    reading = Reading.of(plan, task or inferred_task(plan, source), *rest,
                         preprocess=preprocess)
    count, pairs = source_frames(plan, source, frames, preprocess, reading.task)
    claim(Path(out), "results/")
    results = Path(out) / "results"
    drawn = Annotator.of(annotate, source, reading.labels) if annotate is not None else None
    with open_session(out, None, gpu_fallback) as session:
        res = stream(session, plan, pairs, count, results, reading=reading, annotate=drawn)
    return finish(session, res)


def _inputs(inputs) -> dict[str, Path]:
    """``{input name: path}`` as given to :func:`run` and :func:`deploy`, checked before any
    process starts."""
    if not isinstance(inputs, Mapping) or not all(
            isinstance(k, str) and isinstance(v, (str, Path)) for k, v in inputs.items()):
        raise AutodiceError(f"inputs {inputs!r}: a dict of model input name -> .npy path")
    return {k: Path(v) for k, v in inputs.items()}


def open(out, inventory=None, window: int | None = None,  # noqa: A001
         gpu_fallback: bool = False, recover: bool | str | Path = False, ahead: bool = True,
         preprocess: str | None = None, task: str | None = None, conf: float = 0.25,
         iou: float = 0.7, max_det: int = 300, metrics: str | None = None):
    """A session: every rank of ``out`` started once, here or (``inventory``) deployed to the
    inventory's hosts first, and frames streamed through in order.

    ::

        with autodice.open("out") as s:
            for result in s.map(frames):   # arrays (or dicts by input name), results in order
                ...
            y = s.infer(x)                 # one frame, blocking
            y = s.infer("cat.jpg")         # an image (a path or a PIL image): preprocessed
            print(autodice.top_k(y, autodice.read_labels("synset.txt"), 5))
            print(s.stats())               # frames/s, latency p50/p90/p99, per rank once closed

    With ``inventory`` and ``recover=True`` (or a ``dse`` output folder to pick from), a host
    lost mid-stream is left out: the session deploys a mapping onto the hosts left and sends
    again every frame whose result had not come back; ``s.rebalance()`` moves back to every
    host once the lost ones answer again; ``s.stats()["incidents"]`` says what happened.
    ``ahead`` (the default) prepares and ships the job for each host's loss while the stream
    runs, so that recovery is a restart rather than a compile. ``preprocess``: how an image
    becomes a frame, as ``run --preprocess`` (``resize=1,mean=0.5/0.5/0.5,...``).
    ``task="detect"``: each result is the frame's boxes (:class:`~autodice.backend.session.
    detect.Detection`, best first; ``conf``, ``iou``, ``max_det`` as ``run --task detect``), an
    image letterboxed as Ultralytics does and its boxes in its own pixels. ``task="segment"``:
    each result is the frame's :class:`~autodice.backend.session.segment.Mask` (a class a
    pixel), an image letterboxed (normalised by ``preprocess``) and its mask in its own
    pixels. ``metrics``:
    ``":9464"`` (loopback) or ``"host:port"``: Prometheus metrics served there while it runs.

    Returns:
        :class:`~autodice.backend.session.Session`.
    Raises:
        AutodiceError: not built (here) or not deployable (as ``deploy``), or the job failed to
            start (the rank and host named).
    """
    from .backend.session import check_window
    from .backend.session.frames import ImageRecipe
    from .backend.session.metrics import parse_address
    from .backend.session.results import Reading
    from .core.plan import load_plan

    check_window(window)
    if metrics is not None:
        parse_address(metrics)  # a bad address before anything starts
    recipe = ImageRecipe.parse(preprocess)
    reading = Reading.of(load_plan(out), task, None, 5, conf, iou, max_det, preprocess)
    if inventory is not None:
        from .deploy.stream import open_deployed

        session = open_deployed(out, inventory, window, gpu_fallback, recover=recover,
                                ahead=ahead)
    elif recover:
        raise AutodiceError("recover needs an inventory: the ranks on this machine have no "
                            "other host to go on with")
    else:
        from .backend.run import open_session

        session = open_session(out, window, gpu_fallback)
    session.preprocess = recipe
    session.task = reading.task
    if metrics is not None:
        try:
            session.serve_metrics(metrics)
        except BaseException:
            session.close()
            raise
    return session


def deploy(out, inventory, inputs: Mapping[str, str | Path] | None = None, frames: int = 1,
           run: bool = False, pipeline: bool = True):
    """Deploy to the inventory's hosts over ssh (and run there with ``run``)."""
    import autodice.deploy.deploy

    from .backend.session import check_count

    check_count("frames", frames, "frame")
    given = _inputs(inputs) if inputs else None
    return autodice.deploy.deploy.deploy(out, inventory, run=run, inputs=given, frames=frames,
                                         pipeline=pipeline)


def platform(inventory, output="platform.txt") -> str:
    """Write ``output``, the platform file, from what each of the inventory's hosts says of
    itself over ssh (:mod:`autodice.deploy.survey`); returns its text."""
    from .deploy.survey import write_platform

    return write_platform(inventory, output)


def report(out, html="report.html", *, profile=None, stats=None, front=None, model=None) -> Path:
    """Write one self-contained page on the split in ``out`` (:mod:`autodice.report`): its
    partition as an interactive graph, each key's figures (predicted times given a profile),
    the run's per-rank bars and latency histogram, and, given a search's folder, its front."""
    from .report import view_report

    return view_report(out, html, model=model, predict=_pricer(out, profile), stats=stats,
                       front=front)


def _pricer(out, profile):
    """What prices a plan by ``profile`` over ``out``'s platform.txt (None without a profile)."""
    if profile is None:
        return None
    from .backend.precision import Precision
    from .backend.wire import Wire
    from .dse.cost import plan_cost
    from .dse.timing import make_timing

    asked, wire = Precision.of_output(out), Wire.of_output(out).kind
    return lambda plan, graph: plan_cost(plan, make_timing(Path(out) / "platform.txt", profile),
                                         graph, asked.int8_keys(plan), wire)


def profile(model, platform, threads=None, gpu: bool | None = None, runs: int = 15,
            inventory=None, little: tuple[int, ...] | None = None, int8: bool = False):
    """Every layer's latency on this machine's ncnn (and Vulkan device), and the links
    (measured on the inventory's hosts when given). Cached by model, engine and settings.
    ``little``: this machine's little cores (a big.LITTLE board): each kind timed apart.
    ``int8``: every layer timed quantized too (the search may then choose int8 keys).

    Returns:
        :class:`~autodice.dse.profile.Profile`.
    """
    from .dse.profiler import run_profile

    links = None
    if inventory is not None:
        from .dse.links import probe_links

        links = probe_links(inventory, platform=platform)
    return run_profile(model, platform, threads, runs=runs, links=links, gpu=gpu,
                       little=little, int8=int8).profile


def predict(out_or_model, profile, mapping=None, platform=None, power=None, input_shapes=None,
            wire: str = "fp32"):
    """Predicted throughput, memory and energy of a mapping (``Cost``), from the cost model.

    Either a split output directory (its plan and platform; priced as gen made it), or a model
    with a ``mapping`` (path or dict) and a ``platform``, scored without writing anything, with
    tensors that cross hosts sent as ``wire`` (``gen --wire``). ``profile`` is a profile.json
    path, a Profile, or ``{host: either}`` (key None: every other host).
    """
    import autodice.dse.cost

    from .dse.timing import make_timing

    if mapping is None:
        return autodice.dse.cost.predict(out_or_model, profile, power)
    if platform is None:
        raise AutodiceError("predict: a mapping needs its platform too")
    parts = _partition(out_or_model, mapping, platform, input_shapes)  # split layers' parts
    return autodice.dse.cost.plan_cost(parts.plan, make_timing(platform, profile, power),
                                       parts.graph, wire=wire)


def search(model, platform, profile, *, objectives: Iterable[str] = ("throughput", "energy",
                                                                      "memory"),
           max_memory: float | str | None = None, min_fps: float | None = None,
           hosts: Iterable[str] | None = None, parallel: Iterable[str] = (), pop: int = 100,
           gens: int = 400, seed: int = 0, encoding: str = "layer", out=None, progress=None,
           input_shapes=None, wire: str = "fp32", min_agreement: float | None = None,
           calibration=None, preprocess: str | None = None, agreement_frames: int = 50):
    """NSGA-II over mappings: the Pareto front of the chosen objectives under the constraints.

    Args:
        objectives: some of ``throughput`` (max), ``energy`` (the largest device's J per
            frame, min), ``memory`` (the largest device's bytes, min).
        max_memory: bytes (or ``"1GB"``) every device may hold at most, beside its ``mem``.
        min_fps: frames/s a point must be predicted to reach.
        hosts: only these boards of the platform.
        parallel: also propose stage copies (``data``) and layers split across resources
            (``horizontal``) on top of the searched vertical mappings.
        out: also write the front there (pareto.csv/json/png, one mapping file per point).
        input_shapes: ``{input: shape}`` for inputs of symbolic size.
        wire: price tensors that cross hosts as ``gen --wire`` sends them (``fp16``,
            ``int8``).
        min_agreement: after the search, make each point with int8 keys (or a smaller wire)
            as gen would and hold it to the whole model on ``agreement_frames`` frames of
            ``calibration`` (made frames by ``preprocess``); points below it keep their mapping
            in fp32 (:mod:`autodice.dse.accuracy`).

    Returns:
        :class:`~autodice.dse.front.Front`; its points sorted fastest first, each checked
        with the compiler's own passes.
    """
    from .core.spec import parse_bytes
    from .dse.search import Settings, dse
    from .dse.settings import Floor

    if isinstance(max_memory, str):
        try:
            max_memory = parse_bytes(max_memory)
        except ValueError as e:
            raise AutodiceError(f"max_memory {max_memory!r}: {e}") from None
    settings = Settings(pop=pop, gens=gens, seed=seed, encoding=encoding,
                        objectives=tuple(objectives), max_memory=max_memory,
                        min_fps=min_fps, parallel=tuple(parallel), wire=wire)
    hosts = list(hosts) if hosts is not None else None
    floor = Floor.asked(min_agreement, calibration, preprocess, agreement_frames)
    return dse(model, platform, profile, out, settings, progress, hosts=hosts,
               input_shapes=input_shapes, floor=floor)
