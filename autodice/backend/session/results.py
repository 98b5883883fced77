"""``autodice run --input DIR|VIDEO|BATCH.npy|-``: a stream of real frames through a session,
results into one folder.

The results folder gets one stacked ``<output>.npy`` per model output (``(N, ...)``, frame i at
index i; a frame that failed is left zero), ``frames.json`` (each frame's label: the image's file
name, the video's or the batch's index, its error if it had one, and what the :class:`Reading`
makes of it: with class names its top-k classes, with ``--task detect`` its boxes, with
``--task segment`` its mask's file and each class's share), for a detector ``detections.jsonl``
(one line a frame, written as frames come), for a segmenter ``masks/<frame>.png`` (palette PNGs
in the source's pixels: each pixel's class; a YOLO segmenter's, each pixel's instance, see
:mod:`.instances`) and ``stats.json`` (the session's figures: frames/s, latency
percentiles, each rank's share).
"""

from __future__ import annotations

import json
import math
import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np

from ...core.errors import AutodiceError, read_text
from ...core.outdir import tensor_files
from ...core.plan import Plan
from .annotate import Annotator, picture_name
from .detect import CONF, IOU, MAX_DET, Detect, Letterbox, layout
from .feed import read_result
from .frames import ImageRecipe
from .gateway import FrameError
from .instances import numbered, prototypes, write_instances
from .segment import Segment, classes_of, write_mask
from .session import Session


@dataclass
class StreamResult:
    results: Path
    stats: dict
    errors: list[FrameError] = field(default_factory=list)
    # --check: per model output, the largest (abs, rel) difference from onnxruntime over frames
    worst: dict[str, tuple[float, float]] = field(default_factory=dict)
    delivered: int = 0  # frames whose result (or error) was handed out, in order
    interrupted: str | None = None  # the signal that stopped the stream early ("SIGINT", ...)
    records: list[dict] = field(default_factory=list)  # frames.json: each frame's record
    dropped: int | None = None  # a live source's frames the pipeline could not take


@dataclass(frozen=True)
class Reading:
    """What a stream makes of each frame's result beside its arrays, by the first model
    output: its ``top`` classes by ``labels`` (a classifier); with a ``task``, pictures
    letterboxed and the result read in the source's pixels: boxes (:class:`~.detect.Detect`)
    or a mask (:class:`~.segment.Segment`), classes named by ``labels`` when given."""

    labels: list[str] | None = None
    top: int = 5
    task: Detect | Segment | None = None

    @staticmethod
    def of(plan: Plan, task: str | None = None, labels: str | Path | None = None, top: int = 5,
           conf: float = CONF, iou: float = IOU, max_det: int = MAX_DET,
           preprocess: str | None = None) -> Reading:
        """The reading a run asks for (``--task``, ``--labels``, ...), the labels file read;
        ``task="none"``: the outputs alone, as without a task.

        Raises:
            AutodiceError: before any job starts: an unknown task, settings out of range, a
                labels file that does not fit, an output of no detector (segmenter) for
                ``detect`` (``segment``), ``--preprocess`` for a detector's frames.
        """
        if task not in (None, "none", "classify", "detect", "segment"):
            raise AutodiceError(f"task {task!r}: classify, detect, segment or none")
        if task == "classify" and not labels:
            raise AutodiceError("--task classify: give the class names (--labels FILE)")
        reader: Detect | Segment | None = None
        if task == "detect":
            if preprocess:
                raise AutodiceError("--task detect: frames are letterboxed as Ultralytics does "
                                    "it, not by --preprocess")
            layout(plan.model_outputs[0].shape)
            given = plan.model_inputs[0].shape
            hw = (given[2], given[3]) if len(given) == 4 else None
            reader = Detect(conf, iou, max_det, prototypes(plan.model_outputs, hw) if hw
                            else None, hw)
            reader.check()
        elif task == "segment":
            classes_of(plan.model_outputs[0].shape)
            shape = plan.model_inputs[0].shape
            if len(shape) != 4 or tuple(shape[:2]) != (1, 3):
                raise AutodiceError("--task segment: frames are letterboxed into a 1x3xHxW "
                                    f"input; this one is {'x'.join(map(str, shape))}")
            reader = Segment((shape[2], shape[3]), ImageRecipe.parse(preprocess))
        names = read_labels(labels, plan, task=task) if labels else None
        return Reading(names, top, reader)

    def read(self, arrays: dict[str, np.ndarray], outputs, box: Letterbox | None):
        """The task's reading of a frame's outputs: its boxes, its mask, or None."""
        return read_result(arrays, outputs, self.task, box) if self.task is not None else None

    def record(self, scores: np.ndarray, read) -> dict:
        """The reading's part of a frame's record (``read``: :meth:`read`'s)."""
        if isinstance(self.task, Detect):
            if not self.task.protos:
                return {"detections": [d.as_json(self.labels) for d in read]}
            return {"detections": [{**d.as_json(self.labels), "instance": k,
                                    "area": int(d.mask.sum())}
                                   for d, k in zip(read, numbered(read))]}
        if isinstance(self.task, Segment):
            return {"shares": read.as_json(self.labels)}
        if self.labels is not None:
            return {"classes": classes(scores, self.labels, self.top)}
        return {}


def inferred_task(plan: Plan, source: str | Path) -> str | None:
    """The task a run without ``--task`` reads pictures with: ``detect`` when the first output
    can only be a YOLO head's (``1x(4+classes)xN`` with N the anchors of strides 8, 16 and 32
    over the input, or YOLO26's ``1x300x6``), else None. A ``1xSxD`` alone could be a
    transformer's tokens, and a segmenter's ``1xCxHxW`` an image-to-image model's output: those
    are not guessed."""
    from .frames import holds_pictures

    shape, given = tuple(plan.model_outputs[0].shape), tuple(plan.model_inputs[0].shape)
    if not holds_pictures(source) or len(given) != 4 or len(shape) != 3:
        return None
    anchors = sum((given[2] // s) * (given[3] // s) for s in (8, 16, 32))
    try:
        kind = layout(shape)
    except AutodiceError:
        return None
    return "detect" if (kind, shape[2 if kind == "yolo" else 1]) in (
        ("yolo", anchors), ("end2end", MAX_DET)) else None


def read_labels(path: str | Path, plan: Plan | None = None,
                task: str | None = None) -> list[str]:
    """One class name per line (ImageNet's synset files work as they are); with ``plan``,
    checked to name each score of the model's first output (each class of a detector's or a
    segmenter's, with ``task``), before any job starts.

    Raises:
        AutodiceError: the file cannot be read, is not UTF-8 text, or has another number of
            labels than the output has scores (classes).
    """
    names = [ln.strip() for ln in read_text(path).splitlines()]
    if plan is not None and task in ("detect", "segment"):
        shape = plan.model_outputs[0].shape
        protos = prototypes(plan.model_outputs, None) if task == "detect" else None
        coefs = plan.model_outputs[1].shape[1] if protos else 0  # a segmenter's, after them
        n = ((shape[1] - 4 - coefs if layout(shape) == "yolo" else None) if task == "detect"
             else classes_of(shape))
        if n is not None and len(names) != n:
            kind = "detector" if task == "detect" else "segmenter"
            raise AutodiceError(f"{path}: {len(names)} labels, but the {kind}'s output "
                                f'"{plan.model_outputs[0].name}" has {n} classes')
    elif plan is not None:
        scores = math.prod(plan.model_outputs[0].shape)
        if len(names) != scores:
            raise AutodiceError(f"{path}: {len(names)} labels, but the model's output "
                                f'"{plan.model_outputs[0].name}" has {scores} scores: not a '
                                "classifier for these labels")
    return names


def classes(scores: np.ndarray, labels: list[str], k: int) -> list[dict]:
    """A frame's ``k`` best classes as ``frames.json`` and ``--format jsonl`` give them."""
    return [{"label": n, "score": v} for n, v in top_k(scores, labels, k)]


def top_k(scores: np.ndarray, labels: list[str], k: int) -> list[tuple[str, float]]:
    """The k best classes of one frame's scores, best first.

    Raises:
        AutodiceError: the output has not one score per label.
    """
    flat = np.asarray(scores).reshape(-1)
    if flat.size != len(labels):
        raise AutodiceError(f"the labels file has {len(labels)} labels, the model's output "
                            f"{flat.size} scores: not a classifier for these labels")
    best = np.argsort(-flat, kind="stable")[:k]
    return [(labels[i], float(flat[i])) for i in best]


PARTIAL = ".partial"  # a results file being written; renamed into place once whole


class Stacks:
    """Each model output stacked over frames (frame i at index i) into ``results``, under a
    hidden partial name until :meth:`close` renames it into place: whatever stops the stream
    (an error, a signal, a kill), no file under a result's name is half-written. Partial files
    that a killed stream left are removed by the next one."""

    def __init__(self, results: Path, outputs, files: dict[str, str], count: int | None):
        self.results, self.outputs, self.files, self.count = results, outputs, files, count
        results.mkdir(parents=True, exist_ok=True)
        for stale in results.glob(f".*{PARTIAL}*"):
            stale.unlink(missing_ok=True)
        self._stacks: dict[str, list | np.ndarray] = {}

    def _partial(self, file: str) -> Path:
        return self.results / f".{file}{PARTIAL}"

    def put(self, i: int, arrays: dict[str, np.ndarray]) -> None:
        """Frame ``i``'s outputs (frames that failed before it stay zero)."""
        for t in self.outputs:
            stack = self._stacks.get(t.name)
            if stack is None:
                stack = (np.lib.format.open_memmap(self._partial(self.files[t.name]), "w+",
                                                   t.dtype, (self.count, *t.shape))
                         if self.count is not None else [])
                self._stacks[t.name] = stack
            if isinstance(stack, list):
                stack.extend(np.zeros(t.shape, t.dtype) for _ in range(i - len(stack)))
                stack.append(arrays[t.name].copy())
            else:
                stack[i] = arrays[t.name]

    def close(self, n: int) -> None:
        """Write the first ``n`` frames of every output under its own name."""
        for t in self.outputs:
            stack = self._stacks.pop(t.name, None)
            final, partial = self.results / self.files[t.name], self._partial(self.files[t.name])
            if isinstance(stack, np.ndarray) and n == len(stack):
                stack.flush()
            else:  # cut short, or a stream of unknown length: a file of n frames
                cut = np.lib.format.open_memmap(partial.with_name(partial.name + "2"), "w+",
                                                t.dtype, (n, *t.shape))
                for at in range(0, min(n, 0 if stack is None else len(stack)), 256):
                    part = stack[at:min(n, at + 256)]
                    cut[at:at + len(part)] = np.stack(part) if isinstance(part, list) else part
                cut.flush()
                del cut
                partial.unlink(missing_ok=True)
                partial = partial.with_name(partial.name + "2")
            del stack
            os.replace(partial, final)


def source_frames(plan: Plan, source: str | Path, frames: int | None = None,
                  preprocess: str | None = None,
                  task: Detect | Segment | None = None) -> tuple[int | None, Iterable]:
    """(how many frames, if known; the ``(label, frame)`` pairs) of ``source`` (a folder of
    images, an image, a video, a batch ``.npy``, ``-`` for stdin) for the model's one input, at
    most ``frames`` of them; with a ``task`` (a :class:`Reading`'s), pictures letterboxed as it
    asks: ``(label, frame, Letterbox, picture)``.

    Raises:
        AutodiceError: a model of several inputs, a bad count or recipe, an unusable source.
    """
    from .feed import check_count
    from .frames import frames_from

    if frames is not None:
        check_count("frames", frames, "frame")
    if len(plan.model_inputs) != 1:
        raise AutodiceError("a stream feeds a model with one input; this one has "
                            f"{', '.join(t.name for t in plan.model_inputs)}")
    t = plan.model_inputs[0]
    recipe = (task.recipe if task is not None else
              ImageRecipe.parse(preprocess) if preprocess else None)
    count, pairs = frames_from(str(source), t.shape, t.dtype, recipe, task is not None)
    if frames is not None:
        count = min(count, frames) if count is not None else frames
        pairs = _First(pairs, frames)
    return count, pairs


class _First:
    """The first ``n`` of ``items``, and what ``items`` dropped if it counts that (a live
    video: :class:`~.video.VideoFrames`)."""

    def __init__(self, items: Iterable, n: int):
        self.items, self.n = items, n

    @property
    def dropped(self) -> int | None:
        return getattr(self.items, "dropped", None)

    def __iter__(self):
        return islice(iter(self.items), self.n)


def write_json(path: Path, data) -> None:
    """``data`` as ``path`` (indented JSON), whole or not at all."""
    partial = path.with_name(f".{path.name}{PARTIAL}")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(partial, path)


def stream(session: Session, plan: Plan, frames: Iterable, count: int | None, results: Path,
           whole=None, on_frame: Callable[[dict, object], None] | None = None,
           reading: Reading = Reading(), annotate: Annotator | None = None) -> StreamResult:
    """Every ``(label, frame)`` (or ``(label, frame, Letterbox, picture)``) of ``frames``
    through ``session``; results stacked in ``results``.

    Ctrl-C (or SIGTERM: :class:`~autodice.core.errors.Stopped`) ends the stream early and
    cleanly: the results of the frames delivered so far are written, cut to them, and
    ``interrupted`` names the signal. A job that fails writes them too, then raises.

    Args:
        count: how many frames there are, when known (the stacked files are written in place).
        whole: onnxruntime's session of the whole model: each frame's result is compared with
            its run of the frame (``out.worst``).
        on_frame: called with each frame's record (its entry of ``frames.json``) and its
            result (or FrameError), in order.
        reading: what each frame's record says of its result (classes, boxes).
        annotate: each picture with its boxes drawn (``--annotate``).
    """
    stacks = Stacks(results, session.outputs, tensor_files(plan), count)
    (results / "stats.json").unlink(missing_ok=True)  # an earlier run's: written at the end
    boxes = _Lines(results / "detections.jsonl") if isinstance(reading.task, Detect) else None
    instances = isinstance(reading.task, Detect) and bool(reading.task.protos)
    masks = results / "masks" if isinstance(reading.task, Segment) or instances else None
    if masks is not None:  # never emptied: --results may name a folder of the user's
        masks.mkdir(parents=True, exist_ok=True)
    labels: list[str] = []
    letterboxes: list[Letterbox | None] = []
    pictures: dict[int, object] = {}  # the frames in flight's, until their boxes are drawn
    out = StreamResult(results, {})
    status = out.records
    name_in = session.inputs[0].name
    pending: list = []  # frames sent, kept only to check them

    def frames_only():
        for label, frame, *made in frames:
            if annotate is not None and len(made) > 1:
                pictures[len(labels)] = made[1]
            labels.append(label)
            letterboxes.append(made[0] if made else None)
            if whole is not None:
                pending.append(frame)
            yield frame

    results_of = session.map(frames_only())
    try:
        for i, result in enumerate(results_of):
            frame = pending.pop(0) if whole is not None else None
            record = {"frame": labels[i]}
            if isinstance(result, FrameError):
                out.errors.append(result)
                record["error"] = str(result)
            else:
                arrays = result if isinstance(result, dict) else {session.outputs[0].name: result}
                stacks.put(i, arrays)
                first = arrays[session.outputs[0].name]
                read = reading.read(arrays, session.outputs, letterboxes[i])
                record.update(reading.record(first, read))
                if boxes is not None:
                    boxes.add({"frame": i, "source": labels[i],
                               "detections": record["detections"]})
                if masks is not None:
                    name = picture_name(i, labels[i])
                    box, hw = letterboxes[i], reading.task.input_hw
                    written = (write_instances(masks, name, read,
                                               box.size if box else (hw[1], hw[0]))
                               if instances else write_mask(masks, name, read))
                    record["mask"] = str(written.relative_to(results))
                if i in pictures:
                    annotate.add(i, labels[i], pictures[i], read)
                if whole is not None:
                    _check(out.worst, whole, {name_in: np.asarray(frame).reshape(
                        session.inputs[0].shape)}, arrays)
            pictures.pop(i, None)
            session.note_dropped(getattr(frames, "dropped", None))
            status.append(record)
            out.delivered = i + 1
            if on_frame is not None:
                on_frame(record, result)
    except KeyboardInterrupt as e:
        out.interrupted = signal.Signals(getattr(e, "signum", signal.SIGINT)).name
        results_of.close()  # the frames in flight are taken: the session stays in step
    finally:
        out.dropped = getattr(frames, "dropped", None)
        stacks.close(out.delivered)
        if boxes is not None:
            boxes.close()
        if annotate is not None:
            annotate.close()
        write_json(results / "frames.json", status[:out.delivered])
    return out


class _Lines:
    """A JSON-lines file written a line a frame as results come (a reader can follow it), under
    its partial name until closed: cut short, it still holds every frame delivered."""

    def __init__(self, path: Path):
        self.path, self.partial = path, path.with_name(f".{path.name}{PARTIAL}")
        path.unlink(missing_ok=True)  # an earlier run's
        self.file = open(self.partial, "w", encoding="utf-8")  # noqa: SIM115 - closed in close

    def add(self, line: dict) -> None:
        self.file.write(json.dumps(line) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()
        os.replace(self.partial, self.path)


def _check(worst: dict, whole, feeds: dict, arrays: dict) -> None:
    from ...frontend.check import compare

    names = list(arrays)
    for name, want in zip(names, whole.run(names, feeds)):
        abs_diff, rel = compare(arrays[name], want, name)
        a0, r0 = worst.get(name, (0.0, 0.0))
        worst[name] = (max(a0, abs_diff), max(r0, rel))


def finish(session: Session, res: StreamResult) -> StreamResult:
    """Close ``session`` and write its figures (the ranks' own included) as stats.json, which
    says when the stream was interrupted."""
    session.close()
    res.stats = session.stats()
    if res.dropped is not None:
        res.stats["frames_dropped"] = res.dropped
    if res.interrupted:
        res.stats["interrupted"] = res.interrupted
        # The session counts a frame as it hands it over; a stop that came after that and
        # before the stream wrote it leaves one frame counted that no results file holds.
        # stats.json speaks of the results beside it.
        res.stats["frames"] = res.delivered
    write_json(res.results / "stats.json", res.stats)
    return res
