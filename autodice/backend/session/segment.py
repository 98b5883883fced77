"""Masks from a segmenter's output, in the source image's pixels: ``run --task segment``.

A segmenter's ``(1, classes, H, W)`` scores (torchvision's DeepLabV3 and LRASPP, a U-Net) are no
answer a person can use either. This turns them into one: each pixel's class (the argmax over
classes; with one class, its logit above 0), mapped back through the letterbox the frame was
made with to the source's pixels, as a palette PNG (``masks/<frame>.png``: a pixel's value is its
class, its colour PASCAL VOC's colour for it) and each class's share of the picture.

Frames are letterboxed as a detector's (the whole picture, scaled to fit, padded), normalised by
the run's recipe (``--preprocess``: ImageNet's mean and std unless it says otherwise, which is
what torchvision's segmenters were trained with). An output already reduced to classes
(``(1, H, W)`` or ``(1, 1, H, W)`` of whole numbers, an ``ArgMax`` in the graph) is taken as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...core.errors import AutodiceError
from .detect import Detect, Letterbox
from .frames import ImageRecipe
from .palette import picture, write_png

MAX_CLASSES = 255  # a palette PNG has 256 entries




def classes_of(shape: tuple[int, ...]) -> int | None:
    """How many classes an output of ``shape`` scores (None: already a map of classes).

    Raises:
        AutodiceError: a shape that is no segmenter's, named.
    """
    shape = tuple(shape)
    if len(shape) == 4 and shape[0] == 1 and shape[1] >= 1 and min(shape[2:]) > 1:
        if shape[1] > MAX_CLASSES:
            raise AutodiceError(f"--task segment: the output scores {shape[1]} classes; a mask "
                                f"holds at most {MAX_CLASSES}")
        return shape[1]
    if len(shape) == 3 and shape[0] == 1 and min(shape[1:]) > 1:
        return None
    raise AutodiceError(f"--task segment: the output is {'x'.join(map(str, shape))}, not a "
                        "segmenter's 1xCxHxW scores or 1xHxW classes")


@dataclass(frozen=True)
class Mask:
    """One frame's classes, a pixel each (``uint8``, the source's height and width)."""

    classes: np.ndarray

    def shares(self) -> list[tuple[int, float]]:
        """(class, share of the pixels) of each class present, largest first."""
        counts = np.bincount(self.classes.reshape(-1), minlength=1)
        present = np.flatnonzero(counts)
        order = present[np.argsort(-counts[present], kind="stable")]
        return [(int(c), float(counts[c] / self.classes.size)) for c in order]

    def as_json(self, labels: list[str] | None = None) -> list[dict]:
        """The classes present, as ``frames.json`` and ``--format jsonl`` give them."""
        return [{"class": c, "share": round(s, 6), **({"label": labels[c]} if labels and
                                                       c < len(labels) else {})}
                for c, s in self.shares()]

    def picture(self):
        """The mask as a palette PIL image: each pixel's value its class."""
        return picture(self.classes)


@dataclass(frozen=True)
class Segment:
    """A segmenter's output read as a :class:`Mask` (see the module docstring): pictures are
    letterboxed into the ``input_hw`` input and normalised by ``recipe`` (ImageNet's when
    None)."""

    input_hw: tuple[int, int]
    recipe: ImageRecipe | None = None

    def read(self, scores: np.ndarray, box: Letterbox | None) -> Mask:
        """The mask of one frame's first output; ``box``: how the picture was letterboxed
        (None: the frame was an array, the mask stays the output's)."""
        scores = np.asarray(scores)
        n = classes_of(scores.shape)
        if n is None:
            classes = scores[0].astype(np.uint8)
        elif n == 1:
            classes = (scores[0, 0] > 0).astype(np.uint8)
        else:
            classes = scores[0].argmax(axis=0).astype(np.uint8)
        return Mask(classes if box is None else to_source(classes, box, self.input_hw))


def to_source(classes: np.ndarray, box: Letterbox, input_hw: tuple[int, int]) -> np.ndarray:
    """A mask over the input (at the output's resolution, which may be a fraction of the
    input's) cut to where the picture is in the letterbox and scaled, nearest class, to the
    source's pixels."""
    from PIL import Image

    h, w = classes.shape
    ky, kx = h / input_hw[0], w / input_hw[1]
    (w0, h0), (px, py) = box.size, box.pad
    region = (px * kx, py * ky, (px + w0 * box.scale) * kx, (py + h0 * box.scale) * ky)
    image = Image.fromarray(classes, "L").resize((w0, h0), Image.NEAREST, box=region)
    return np.asarray(image, dtype=np.uint8)


Task = Detect | Segment  # what a session reads its results with (``Session.task``)


def write_mask(folder: Path, name: str, mask: Mask) -> Path:
    """``mask`` as ``folder/<name>.png`` (a palette PNG), whole or not at all."""
    return write_png(folder, name, mask.classes)
