"""Instance masks of a YOLO segmenter (YOLOv8-seg, YOLO11-seg): each detection's own pixels.

Such a model has two outputs. The first is a detector's ``(1, 4 + classes + M, N)``: each
candidate's box and class scores, then M mask coefficients. The second is ``(1, M, H/4, W/4)``:
M prototype masks over the input. A detection's mask is the sigmoid of its coefficients times
the prototypes, cut to its box, scaled to the source's pixels (bilinear) and taken where it
passes 0.5, as Ultralytics computes it.

``results/masks/<frame>.png`` holds a frame's instances, a palette PNG whose pixel values are
instance numbers: 0 no instance, k the frame's k-th detection (best first; where two overlap, the
better one's). A PNG of 8 bits numbers the first 255; ``detections.jsonl`` gives each detection
its ``instance`` number (null past 255) and its ``area`` in pixels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...core.errors import AutodiceError
from .palette import write_png

MOST = 255  # instances an 8-bit PNG can number


def prototypes(outputs, input_hw: tuple[int, int] | None) -> str | None:
    """The name of the model's prototype masks (its second output, ``1xMxhxw``, where the first
    output has more than M rows after the box), or None for a plain detector.

    Raises:
        AutodiceError: a second output of that shape whose size is not a fraction of the
            input's, named.
    """
    if len(outputs) < 2:
        return None
    first, second = tuple(outputs[0].shape), tuple(outputs[1].shape)
    if not (len(first) == 3 and len(second) == 4 and second[0] == 1
            and first[2] > first[1] > 4 + second[1]):  # YOLO's 1x(4+classes+M)xN
        return None
    if input_hw is not None and any(i % s for i, s in zip(input_hw, second[2:])):
        raise AutodiceError(f'--task detect: the prototype masks "{outputs[1].name}" are '
                            f"{'x'.join(map(str, second))}, not a fraction of the "
                            f"{input_hw[0]}x{input_hw[1]} input")
    return outputs[1].name


def masks_of(coefs: np.ndarray, protos: np.ndarray, boxes: np.ndarray,
             input_hw: tuple[int, int], letterbox=None) -> np.ndarray:
    """``(n, height, width)`` bool masks: in the source's pixels where ``letterbox`` says how
    the frame was made, else in the input's. ``coefs``: ``(n, M)``; ``protos``: ``(1, M, h,
    w)``; ``boxes``: ``(n, 4)`` corners in input pixels.

    Each mask is computed and scaled only over its box and the prototype cells around it
    (bilinear reaches one cell further, and the mask is cut to its box before scaling): the
    pixels of scaling the whole picture (a test holds them equal): 15 masks in a 720p picture
    took 2.8 ms, against 37 ms scaled whole (bench/detect_bench.py times 27: 4.4 ms)."""
    from PIL import Image

    _, m, h, w = protos.shape
    ky, kx = h / input_hw[0], w / input_hw[1]
    cut = boxes * np.array([kx, ky, kx, ky], np.float32)  # the boxes in prototype cells
    # A picture pixel X lies at prototype column (X * s + px) * kx (rows alike).
    (w0, h0), (px, py), s = ((letterbox.size, letterbox.pad, letterbox.scale) if letterbox
                             else ((input_hw[1], input_hw[0]), (0.0, 0.0), 1.0))
    out = np.zeros((len(coefs), h0, w0), bool)
    margin = np.array([-1, -1, 1, 1]) * (2 + np.ceil(1 / (s * min(kx, ky))))
    spans = np.floor((boxes - np.array([px, py, px, py])) / s) + margin
    spans = spans.clip(0, [w0, h0, w0, h0]).astype(int)
    for k, (xa, ya, xb, yb) in enumerate(spans):
        if xb <= xa or yb <= ya:
            continue
        region = ((xa * s + px) * kx, (ya * s + py) * ky, (xb * s + px) * kx, (yb * s + py) * ky)
        c0, r0 = max(int(region[0]) - 1, 0), max(int(region[1]) - 1, 0)
        c1, r1 = min(int(np.ceil(region[2])) + 2, w), min(int(np.ceil(region[3])) + 2, h)
        logits = coefs[k].astype(np.float32) @ protos[0, :, r0:r1, c0:c1].reshape(m, -1)
        soft = (1.0 / (1.0 + np.exp(-logits))).reshape(r1 - r0, c1 - c0)
        cols, rows = np.arange(c0, c1), np.arange(r0, r1)[:, None]
        soft *= (cols >= cut[k, 0]) & (cols < cut[k, 2]) & (rows >= cut[k, 1]) & \
            (rows < cut[k, 3])
        scaled = Image.fromarray(soft.astype(np.float32), "F").resize(
            (xb - xa, yb - ya), Image.BILINEAR,
            box=(region[0] - c0, region[1] - r0, region[2] - c0, region[3] - r0))
        out[k, ya:yb, xa:xb] = np.asarray(scaled) > 0.5
    return out


def numbered(detections) -> list[int | None]:
    """Each detection's instance number in the frame's PNG (None: past :data:`MOST`)."""
    return [k + 1 if k < MOST else None for k in range(len(detections))]


def write_instances(folder: Path, name: str, detections, size: tuple[int, int]) -> Path:
    """The frame's instances as ``folder/<name>.png`` (see the module docstring), whole or not
    at all; ``size``: the picture's (width, height)."""
    canvas = np.zeros((size[1], size[0]), np.uint8)
    for k in reversed(range(min(len(detections), MOST))):  # the best painted last: on top
        canvas[detections[k].mask] = k + 1
    return write_png(folder, name, canvas)
