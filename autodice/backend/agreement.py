"""``autodice check OUT --frames SOURCE``: what the converted keys (int8, fp16 or fp32, as gen
made them) lose against the fp32 model in onnxruntime, on frames like those they will see.

Two views, on every frame of ``SOURCE``:

- **key by key**: each key's ncnn model fed the fp32 values it would receive (the sub-models
  chained in onnxruntime), its outputs against the fp32 ones: what that key alone loses, so
  the key that loses the most is named;
- **on the wire** (``gen --wire fp16|int8``): what each cut tensor that crosses hosts loses on
  its way, the runtime's rounding applied to its fp32 values;
- **end to end**: the keys chained in ncnn, each fed what the keys before it computed in ncnn
  (as it arrives: after the wire's rounding),
  the model's outputs against the whole model's: top-1 and top-5 agreement for a classifier's
  scores (1 x C), the mean IoU of the argmax masks (C x H x W, C > 1) or of the binarized map
  (1 x 1 x H x W: above 0.5 where the map is a probability, else above 0) for dense outputs, and
  the error of every other output.

ncnn runs here, on the CPU (``ncnn_check``): an int8 key computes in int8 as on a board; a
GPU key's fp16 is its fp16 weights computed in fp32, less than the GPU's fp16 arithmetic loses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.errors import AutodiceError
from ..core.plan import Plan, Rank, load_plan
from ..frontend.check import chain_values, difference, whole_session
from .calibrate import calibration_frames, moved
from .engine import ensure_ncnn
from .precision import Precision
from .tools import build_tools
from .verify import run_checker
from .wire import Wire, through


@dataclass
class Loss:
    """Per tensor, over the frames: the worst share it moved and the worst error of its
    scale."""
    moved: dict[str, float] = field(default_factory=dict)
    scale: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, got: np.ndarray, want: np.ndarray) -> None:
        self.moved[name] = max(self.moved.get(name, 0.0), moved(got, want))
        self.scale[name] = max(self.scale.get(name, 0.0), difference(got, want)[1])

    @property
    def worst(self) -> float:
        return max(self.moved.values(), default=0.0)


@dataclass
class KeyLoss(Loss):
    """One key's own loss: its ncnn model on the fp32 values it receives, against fp32."""
    rank: Rank | None = None
    precision: str = "fp32"

    def title(self) -> str:
        return f"key {self.rank.key} ({self.precision})"


@dataclass
class EdgeLoss(Loss):
    """What one cut tensor loses on its way to another host (``src`` and ``dst``: ranks)."""
    src: int = 0
    dst: int = 0
    wire: str = "fp32"

    def title(self) -> str:
        return f"the wire from rank {self.src} to {self.dst} ({self.wire})"


@dataclass
class OutputAgreement:
    """One model output, end to end: how it is judged and the figures."""
    name: str
    kind: str  # "classes", "mask", "map" or "tensor"
    agree: list[float] = field(default_factory=list)  # per frame: top-1 hit, or IoU
    top5: list[float] = field(default_factory=list)
    moved: list[float] = field(default_factory=list)


def judge(name: str, got: np.ndarray, want: np.ndarray, out: OutputAgreement) -> None:
    got = np.asarray(got, np.float32).reshape(want.shape)
    out.moved.append(moved(got, want))
    core = want.reshape(want.shape[1:]) if want.ndim and want.shape[0] == 1 else want
    g = got.reshape(core.shape)
    if core.ndim == 1 and core.size > 1:
        out.kind = "classes"
        best = int(core.argmax())
        out.agree.append(float(int(g.argmax()) == best))
        out.top5.append(float(best in np.argsort(-g)[:5]))
    elif core.ndim == 3 and core.shape[0] > 1:
        out.kind = "mask"
        out.agree.append(iou(g.argmax(0), core.argmax(0)))
    elif core.ndim == 3 and core.shape[0] == 1 and core.size > 1:  # 1 x 1 x H x W
        out.kind = "map"
        cut = 0.5 if core.min() >= 0 and core.max() <= 1 else 0.0
        out.agree.append(iou(g > cut, core > cut))


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two masks (of two label maps: the mean over their labels)."""
    if a.dtype == bool:
        union = (a | b).sum()
        return float((a & b).sum() / union) if union else 1.0
    labels = np.union1d(np.unique(a), np.unique(b))
    return float(np.mean([iou(a == k, b == k) for k in labels]))


def chain_order(plan: Plan) -> list[Rank] | None:
    """The keys in an order where each has its inputs once those before it ran whole; None
    where a key needs another's later outputs (a ping-pong mapping: steps interleave)."""
    known = {t.name for t in plan.model_inputs}
    order: list[Rank] = []
    left = list(plan.ranks)
    while left:
        ready = [r for r in left if all(t.name in known for t in r.submodel_inputs)]
        if not ready:
            return None
        for r in ready:
            known |= {t.name for t in r.submodel_outputs}
            order.append(r)
            left.remove(r)
    return order


def ncnn_chain(plan: Plan, ncnn: Path, checker: Path, feeds: dict[str, np.ndarray],
               arrive=None) -> dict[str, np.ndarray] | None:
    """Every tensor with the keys chained in ncnn (:func:`chain_order`), each fed its inputs
    as ``arrive`` hands them over, where given (:meth:`~.wire.Wire.arrival`); None where the
    keys cannot be chained."""
    order = chain_order(plan)
    if order is None:
        return None
    values = dict(feeds)
    for r in order:
        got = run_checker(checker, ncnn / f"{r.key}.ncnn",
                          [arrive(r, t.name, values[t.name]) if arrive else values[t.name]
                           for t in r.submodel_inputs])
        values |= {t.name: g for t, g in zip(r.submodel_outputs, got)}
    return values


@dataclass
class Agreement:
    keys: list[KeyLoss]
    edges: list[EdgeLoss]
    outputs: list[OutputAgreement]
    frames: int
    chained: bool  # whether the keys could be chained in ncnn (end to end measured)

    def lines(self) -> list[str]:
        """What ``check --frames`` prints: a line per tensor a key makes, per model output,
        and the key that loses the most."""
        said = [f'{k.title()}: "{name}" moved {share:.3%} (at most '
                f"{k.scale[name]:.3g} of its scale)"
                for k in self.keys for name, share in k.moved.items()]
        said += [f'{e.title()}: "{name}" moved {share:.3%} (at most {e.scale[name]:.3g} of '
                 "its scale)" for e in self.edges for name, share in e.moved.items()]
        for o in self.outputs if self.chained else ():
            if o.kind == "classes":
                what = (f"top-1 agreement {np.mean(o.agree):.3f} ({int(sum(o.agree))} of "
                        f"{len(o.agree)} frames), top-5 {np.mean(o.top5):.3f}")
            elif o.kind in ("mask", "map"):
                what = f"IoU mean {np.mean(o.agree):.3f}, worst {min(o.agree):.3f}"
            else:
                what = f"moved {max(o.moved):.3%} at most"
            said.append(f'output "{o.name}" ({o.kind}), the keys chained in ncnn: {what}')
        worst = max([*self.keys, *self.edges], key=lambda k: k.worst)
        return said + [f"loses the most: {worst.title()}, {worst.worst:.3%} on {self.frames} "
                       "frames"]

    def figure(self) -> tuple[float, str]:
        """The one number an accuracy floor holds (``dse --min-agreement``), and what it is:
        the least of the model's outputs end to end (a classifier's top-1 agreement, a mask's or
        map's mean IoU, else 1 less the mean share the output moved); for keys that could not be
        chained, 1 less the share the worst key or edge moved its tensors."""
        if not self.chained or not self.outputs:
            worst = max([*self.keys, *self.edges], key=lambda k: k.worst)
            return 1.0 - worst.worst, f"1 - the share {worst.title()} moved"
        found = []
        for o in self.outputs:
            if o.kind == "classes":
                found.append((float(np.mean(o.agree)), f'top-1 agreement of "{o.name}"'))
            elif o.kind in ("mask", "map"):
                found.append((float(np.mean(o.agree)), f'mean IoU of "{o.name}"'))
            else:
                found.append((1.0 - float(np.mean(o.moved)), f'1 - the share "{o.name}" moved'))
        return min(found)

    def notes(self) -> list[str]:
        return [] if self.chained else [
            "the keys take turns within a frame (a ping-pong mapping): each key was measured "
            "alone, not chained"]


def agreement(out_dir: str | Path, source: str | Path, preprocess: str | None = None,
              frames: int = 50, per_key: bool = True) -> Agreement:
    """Each key's loss and the model's agreement end to end on ``frames`` frames of ``source``
    (``per_key`` False: end to end only, where the keys can be chained).

    Raises:
        AutodiceError: no gen output, or frames that cannot be made.
    """
    out_dir = Path(out_dir)
    plan = load_plan(out_dir)
    ncnn = out_dir / "ncnn"
    if not all((ncnn / f"{r.key}.ncnn.param").is_file() for r in plan.ranks):
        raise AutodiceError(f"{out_dir}: no ncnn models for every key; run `autodice gen` first")
    asked = Precision.of_output(out_dir)
    feeds = calibration_frames(plan, source, preprocess, frames, "--frames")
    checker = build_tools(ensure_ncnn()) / "ncnn_check"
    keys = [KeyLoss(rank=r, precision=asked.computes(r)) for r in plan.ranks]
    wire = Wire.of_output(out_dir)
    crossing = wire.smaller(plan)  # (edge, destination, format), read once
    edges = [EdgeLoss(src=e.src, dst=d, wire=kind) for e, d, kind in crossing]
    arrive = wire.arrival(plan) if edges else None
    names = [t.name for t in plan.model_outputs]
    outputs = [OutputAgreement(n, "tensor") for n in names]
    whole = whole_session(plan, out_dir, None)
    sessions: dict = {}
    chained = chain_order(plan) is not None
    per_key = per_key or not chained  # nothing else to measure then
    for feed in feeds:
        values = chain_values(plan, out_dir, feed, sessions) if per_key or edges else {}
        for k in keys if per_key else ():
            got = run_checker(checker, ncnn / f"{k.rank.key}.ncnn",
                              [values[t.name] for t in k.rank.submodel_inputs])
            for t, g in zip(k.rank.submodel_outputs, got):
                k.add(t.name, g, np.asarray(values[t.name], np.float32))
        for edge, (e, _, kind) in zip(edges, crossing):
            want = np.asarray(values[e.tensor], np.float32)
            edge.add(e.tensor, through(want, kind), want)
        if chained:
            ncnn_values = ncnn_chain(plan, ncnn, checker, feed, arrive)
            for o, want in zip(outputs, whole.run(names, feed)):
                judge(o.name, ncnn_values[o.name], want, o)
    return Agreement(keys, edges, outputs, len(feeds), chained)
