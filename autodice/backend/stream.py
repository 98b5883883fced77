"""``autodice run --input DIR|BATCH.npy|-``: a stream of real frames through a session, results
into one folder.

The results folder gets one stacked ``<output>.npy`` per model output (``(N, ...)``, frame i at
index i; a frame that failed is left zero), ``frames.json`` (each frame's label: the image's file
name or the batch index, and its error if it had one) and ``stats.json`` (the session's figures:
frames/s, latency percentiles, each rank's share).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.errors import AutodiceError
from ..core.outdir import tensor_files
from ..core.plan import Plan
from .session import FrameError, Session


@dataclass
class StreamResult:
    results: Path
    stats: dict
    errors: list[FrameError] = field(default_factory=list)
    # --check: per model output, the largest (abs, rel) difference from onnxruntime over frames
    worst: dict[str, tuple[float, float]] = field(default_factory=dict)


def read_labels(path: str | Path) -> list[str]:
    """One class name per line (ImageNet's synset files work as they are).

    Raises:
        AutodiceError: the file cannot be read.
    """
    try:
        return [ln.strip() for ln in Path(path).read_text().splitlines()]
    except OSError as e:
        raise AutodiceError(f"{path}: cannot read the labels ({e.strerror})") from None


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


def stream(session: Session, plan: Plan, frames: Iterable, count: int | None, results: Path,
           whole=None,
           on_frame: Callable[[str, object], None] | None = None) -> StreamResult:
    """Every ``(label, frame)`` of ``frames`` through ``session``; results stacked in ``results``.

    Args:
        count: how many frames there are, when known (the stacked files are written in place).
        whole: onnxruntime's session of the whole model: each frame's result is compared with
            its run of the frame (``out.worst``).
        on_frame: called with each frame's label and its result (or FrameError), in order.
    """
    results.mkdir(parents=True, exist_ok=True)
    files = tensor_files(plan)
    labels: list[str] = []
    status: list[dict] = []
    stacks: dict[str, list | np.ndarray] = {}
    out = StreamResult(results, {})
    name_in = session.inputs[0].name
    pending: list = []  # frames sent, kept only to check them

    def frames_only():
        for label, frame in frames:
            labels.append(label)
            if whole is not None:
                pending.append(frame)
            yield frame

    for i, result in enumerate(session.map(frames_only())):
        frame = pending.pop(0) if whole is not None else None
        if isinstance(result, FrameError):
            out.errors.append(result)
            status.append({"frame": labels[i], "error": str(result)})
        else:
            status.append({"frame": labels[i]})
            arrays = result if isinstance(result, dict) else {session.outputs[0].name: result}
            for t in session.outputs:
                a = arrays[t.name]
                stack = stacks.get(t.name)
                if stack is None:
                    stack = (np.lib.format.open_memmap(results / files[t.name], "w+", t.dtype,
                                                       (count, *t.shape))
                             if count is not None else [])
                    stacks[t.name] = stack
                if isinstance(stack, list):
                    stack.append(a.copy())
                else:
                    stack[i] = a
            if whole is not None:
                _check(out.worst, whole, {name_in: np.asarray(frame).reshape(
                    session.inputs[0].shape)}, arrays)
        if on_frame is not None:
            on_frame(labels[i], result)
    for t in session.outputs:
        stack = stacks.get(t.name)
        if isinstance(stack, list):
            np.save(results / files[t.name], np.stack(stack) if stack else
                    np.zeros((0, *t.shape), t.dtype))
        elif stack is not None:
            stack.flush()
    (results / "frames.json").write_text(json.dumps(status, indent=1) + "\n")
    return out


def _check(worst: dict, whole, feeds: dict, arrays: dict) -> None:
    from ..frontend.check import compare

    names = list(arrays)
    for name, want in zip(names, whole.run(names, feeds)):
        abs_diff, rel = compare(arrays[name], want)
        a0, r0 = worst.get(name, (0.0, 0.0))
        worst[name] = (max(a0, abs_diff), max(r0, rel))


def finish(session: Session, res: StreamResult) -> StreamResult:
    """Close ``session`` and write its figures (the ranks' own included) as stats.json."""
    session.close()
    res.stats = session.stats()
    (res.results / "stats.json").write_text(json.dumps(res.stats, indent=1) + "\n")
    return res
