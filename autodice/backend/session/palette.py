"""The palette PNGs autodice writes of masks: each pixel's value is data (a class, an instance),
its colour PASCAL VOC's colour for that value, so a viewer shows the mask and a program reads
the numbers."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def palette() -> list[int]:
    """PASCAL VOC's colour map: value c's colour from its bits, spread over R, G and B."""
    colours = []
    for c in range(256):
        r = g = b = 0
        bits = c
        for k in range(8):
            r |= (bits & 1) << (7 - k)
            g |= ((bits >> 1) & 1) << (7 - k)
            b |= ((bits >> 2) & 1) << (7 - k)
            bits >>= 3
        colours += [r, g, b]
    return colours


PALETTE = palette()


def picture(values: np.ndarray):
    """``values`` (uint8, height x width) as a palette PIL image."""
    from PIL import Image

    image = Image.fromarray(values, "P")
    image.putpalette(PALETTE)
    return image


def write_png(folder: Path, name: str, values: np.ndarray) -> Path:
    """``values`` as ``folder/<name>.png`` (a palette PNG), whole or not at all."""
    path = folder / f"{name}.png"
    partial = folder / f".{name}.png.partial"
    picture(values).save(partial, format="PNG")
    os.replace(partial, path)
    return path
