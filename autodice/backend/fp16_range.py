"""Which ranks can compute in fp16: the largest value each one holds, on the inputs gen checks
its conversions with.

fp16 holds magnitudes up to 65504. A larger value becomes inf, and the next subtraction or
multiplication by zero makes it NaN, which then spreads to every output. ncnn computes in fp16 on
a GPU by default, so a model whose activations pass that range gives NaN there: on an H100, a
seeded ResNet-50 (activations up to 2.7e5) gave NaN for every frame in fp16 and matched
onnxruntime to 6e-7 in fp32. Under ``gen --precision auto`` such a GPU rank computes in fp32 and
gen says why; ``--precision fp16`` keeps fp16, as asked, and warns.

One seeded draw of inputs stands for every frame, and real frames can reach further, so a rank
keeps fp32 once its values pass a quarter of the range.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx

from ..core.plan import Rank
from ..frontend.check import every_value

FP16_MAX = 65504.0
HEADROOM = 4.0
CONSTANTS = ("Constant", "ConstantOfShape")


class Largest(NamedTuple):
    """A rank's largest magnitude and the tensor that holds it."""
    tensor: str
    value: float

    def note(self) -> str:
        return (f"values up to {self.value:.3g} (tensor \"{self.tensor}\"), past fp16's "
                f"{FP16_MAX:.0f} / {HEADROOM:.0f}")


def largest_value(rank: Rank, out_dir: Path, values: dict[str, np.ndarray]) -> Largest:
    """The largest finite magnitude among the floats ``rank`` receives and its layers compute,
    its sub-model fed what the model gives it (``values``: :func:`~..frontend.check.chain_values`).
    """
    feeds = {t.name: values[t.name] for t in rank.submodel_inputs}
    path = out_dir / rank.submodel
    # Constants (a mask's -1e9) and shape arithmetic are not activations the GPU computes on.
    skip = set(rank.followers)
    computed = [t for node in onnx.load(str(path), load_external_data=False).graph.node
                if node.op_type not in CONSTANTS and (node.name or node.output[0]) not in skip
                for t in node.output if t]
    best = Largest("", 0.0)
    for name, value in (*feeds.items(), *every_value(path, feeds, computed).items()):
        value = np.asarray(value)
        if value.dtype.kind == "f" and value.size:
            finite = np.abs(value[np.isfinite(value)])
            if finite.size and float(finite.max()) > best.value:
                best = Largest(name, float(finite.max()))
    return best


def past_range(value: float) -> bool:
    """Whether a largest magnitude ``value`` passes fp16's range with headroom (fp32 then)."""
    return value > FP16_MAX / HEADROOM


def past_fp16(out_dir: Path, values: dict[str, np.ndarray],
              ranks: list[Rank]) -> dict[int, Largest]:
    """The ranks among ``ranks`` whose values pass fp16's range with headroom, by rank number."""
    found = {r.rank: largest_value(r, out_dir, values) for r in ranks}
    return {k: v for k, v in found.items() if past_range(v.value)}
