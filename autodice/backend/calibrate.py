"""``gen``'s int8 step: calibrate and quantize the int8 ranks' converted models, then say what
each lost against fp32.

Calibration frames are made as a session makes its frames (``--preprocess``'s recipe), and every
rank is calibrated on what the fp32 model gives it for them: a rank after a cut sees the values
the ranks before it would send. Which layers stay fp32 is the user's to say (``--keep-fp32``:
ncnn layer names as gen prints them; ``first``, the network's first layer; ``last``, the one
making its output; ``sensitive``, those that alone move their rank's output by more than 5 %,
measured). By default ``first,sensitive``: the first convolution reads the picture itself, whose
values are the least like the rest, and a layer whose input has a few channels far larger than
the others loses the small ones to one int8 scale (:func:`sensitive_layers`).
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import AutodiceError
from ..core.plan import Plan, Rank
from ..frontend.check import chain_values, difference
from .int8 import QUANTIZED, Calibrated, Quantized, read_param
from .verify import run_checker

CALIBRATION_FRAMES = 200  # at most; ncnn's own guide suggests some hundreds


def calibration_frames(plan: Plan, source: str | Path, preprocess: str | None = None,
                       limit: int = CALIBRATION_FRAMES, flag: str = "--calibration"
                       ) -> list[dict[str, np.ndarray]]:
    """The model's inputs for up to ``limit`` frames of ``source`` (a folder of images, a batch
    .npy, a video: anything ``run --input`` reads), errors said as of ``flag``.

    Raises:
        AutodiceError: one line naming ``source``: no frame in it, or the frame that cannot be
            read or made (its index and file).
    """
    from .session.results import source_frames

    where = f"{flag} {source}"
    try:
        _, pairs = source_frames(plan, source, limit, preprocess)
        t = plan.model_inputs[0]
        frames = []
        for _, frame, *_ in pairs:
            if isinstance(frame, Exception):  # it names the frame and its file
                raise AutodiceError(f"{where}: {frame}")
            frames.append({t.name: np.asarray(frame, t.dtype).reshape(t.shape)})
    except AutodiceError as e:
        said = str(e)
        raise AutodiceError(said if said.startswith(where) else f"{where}: {said}") from None
    if not frames:
        raise AutodiceError(f"{where}: no frame in it")
    return frames


def _ends(plan: Plan, ranks: list[Rank], quantizable: dict[int, list[str]]
          ) -> dict[str, list[tuple[int, str]]]:
    """``first`` and ``last``: the first quantizable ncnn layer of each of ``ranks`` that reads
    the model's input, and the last of each that makes a model output, as (rank, layer)."""
    inputs = {t.name for t in plan.model_inputs}
    outputs = {t.name for t in plan.model_outputs}
    ends: dict[str, list[tuple[int, str]]] = {"first": [], "last": []}
    for r in ranks:  # a stage's copies each read the input (make the output): each is marked
        names = quantizable[r.rank]
        if names and inputs & set(r.inputs):
            ends["first"].append((r.rank, names[0]))
        if names and outputs & set(r.outputs):
            ends["last"].append((r.rank, names[-1]))
    return ends


KEYWORDS = {"first": "the network's first layer", "last": "the network's last layer",
            "sensitive": "alone it moves the output"}


def keep_lists(plan: Plan, ncnn_dir: Path, ranks: list[Rank], keep_fp32: tuple[str, ...]
               ) -> dict[int, dict[str, str]]:
    """The layers each int8 rank keeps in fp32 (layer -> why): ``keep_fp32``'s names, and the
    layers ``first`` and ``last`` name (``sensitive`` is measured later).

    Raises:
        AutodiceError: a name no int8 rank has (the names it could be, by rank).
    """
    quantizable = {r.rank: [layer.name for layer in
                            read_param(ncnn_dir / f"{r.key}.ncnn.param")[1]
                            if layer.type in QUANTIZED] for r in ranks}
    ends = _ends(plan, ranks, quantizable)
    names = {k: set(v) for k, v in quantizable.items()}
    keep: dict[int, dict[str, str]] = {r.rank: {} for r in ranks}
    for name in keep_fp32:
        if name in KEYWORDS:
            for rank, layer in ends.get(name, ()):
                keep[rank][layer] = KEYWORDS[name]
            continue
        holders = [k for k, have in names.items() if name in have]
        if not holders:
            shown = "; ".join(f"rank {k}: {', '.join(sorted(v)[:6])}"
                              + (" ..." if len(v) > 6 else "") for k, v in names.items())
            raise AutodiceError(f"--keep-fp32 {name}: no int8 rank has a layer of that name "
                                f"({', '.join(KEYWORDS)}, or an ncnn layer: {shown})")
        for k in holders:
            keep[k][name] = "--keep-fp32"
    return keep


SENSITIVE = 0.05  # a layer that alone moves its rank's output by more (of its mean size)
SENSITIVITY_FRAMES = 2


def moved(got: np.ndarray, want: np.ndarray) -> float:
    """Mean |got - want| over mean |want|: how far a tensor moved, as a share of its size."""
    got, want = np.asarray(got, np.float64).reshape(want.shape), np.asarray(want, np.float64)
    return float(np.abs(got - want).mean() / max(np.abs(want).mean(), 1e-30))


def sensitive_layers(cal: Calibrated, tools: Path, inputs: list[list[np.ndarray]],
                     outputs: list[list[np.ndarray]], keep: dict[str, str]) -> dict[str, str]:
    """The layers that, alone in int8, move the rank's outputs by more than ``SENSITIVE``
    (layer -> why), each measured in ncnn on the first calibration frames.

    Measured on PP-OCRv4's text detector: 10 of the first key's 58 layers, all in its first
    blocks (1x1 convolutions after depthwise ones, whose input is a hard-swish output with a few
    channels far larger than the rest); kept fp32, its binarized map's mean IoU against fp32
    rose from 0.950 to 0.984 on 50 drawn pages.
    """
    def one(name: str) -> tuple[str, float]:
        with tempfile.TemporaryDirectory(prefix="autodice-sensitivity-") as tmp:
            base = Path(tmp) / "m.ncnn"
            cal.write(base, {n: "" for n in cal.int8 if n != name})
            worst = [max(map(moved, run_checker(tools / "ncnn_check", base, feed), want))
                     for feed, want in zip(inputs, outputs)]
        return name, max(worst)

    todo = [n for n in cal.int8 if n not in keep]
    with ThreadPoolExecutor(max_workers=2) as pool:
        found = list(pool.map(one, todo))
    return {n: f"{KEYWORDS['sensitive']} {e:.0%}" for n, e in found if e > SENSITIVE}


@dataclass(frozen=True)
class Int8Rank:
    """One int8 rank after quantization: what became int8, and its error against fp32 over the
    first 8 calibration frames (the largest, of an output's scale)."""
    rank: Rank
    quantized: Quantized
    error: float

    def note(self) -> str:
        q = self.quantized
        kept = ", ".join(f"{name} ({why})" for name, why in q.kept)
        return (f'rank {self.rank.rank} (key "{self.rank.key}"): int8, {len(q.int8)} of '
                f"{len(q.int8) + len(q.kept)} layers"
                + (f"; fp32: {kept}" if kept else "")
                + f"; off by {self.error:.3g} of its outputs' scale against fp32")


def quantize_ranks(plan: Plan, out_dir: Path, ncnn_dir: Path, ranks: list[Rank],
                   frames: list[dict[str, np.ndarray]], keep_fp32: tuple[str, ...],
                   tools: Path) -> list[Int8Rank]:
    """Quantize ``ranks``' models in ``ncnn_dir`` in place, calibrated on ``frames`` (the
    model's inputs), then run each in ncnn on the same frames against fp32."""
    sessions: dict = {}
    values = [chain_values(plan, out_dir, feeds, sessions) for feeds in frames]
    keep = keep_lists(plan, ncnn_dir, ranks, keep_fp32)
    done = []
    for r in ranks:
        base = ncnn_dir / f"{r.key}.ncnn"
        inputs = [[v[t.name] for t in r.submodel_inputs] for v in values]
        outputs = [[np.asarray(v[t.name], np.float32) for t in r.submodel_outputs]
                   for v in values]
        cal = Calibrated.measure(tools / "ncnn_int8", base, inputs)
        kept = dict(keep[r.rank])
        if "sensitive" in keep_fp32:
            kept |= sensitive_layers(cal, tools, inputs[:SENSITIVITY_FRAMES],
                                     outputs[:SENSITIVITY_FRAMES], kept)
        quantized = cal.write(base, kept)
        worst = 0.0
        for feed, want in zip(inputs[:8], outputs):
            got = run_checker(tools / "ncnn_check", base, feed)
            worst = max(worst, *(difference(g, w)[1] for g, w in zip(got, want)))
        if not np.isfinite(worst):
            raise AutodiceError(f'rank {r.rank} (key "{r.key}"): in int8 it computes inf or '
                                "NaN: keep its layers in fp32 (--keep-fp32) or the key in fp32")
        done.append(Int8Rank(r, quantized, worst))
    return done
