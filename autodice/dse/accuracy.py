"""``dse --min-agreement A --calibration SOURCE``: a front that holds accuracy, not only speed.

The search prices int8 keys (and cut tensors in fewer bytes, ``--wire``) by their time and
memory. What they cost in accuracy is measured here, after the search, on every front point they
touch:

1. the point's mapping is split and generated as ``gen`` would make it: int8 keys calibrated on
   SOURCE's frames (made frames by ``--preprocess``), the wire format the search priced;
2. its keys are chained in ncnn on those frames and held to the whole model in onnxruntime
   (:func:`~autodice.backend.agreement.agreement`): a classifier's top-1 agreement, a mask's or
   map's mean IoU, else 1 less the mean share an output moved; the least of its outputs is the
   point's agreement (:meth:`~autodice.backend.agreement.Agreement.figure`).

A point below the floor gives way to its fp32 twin, the same mapping with every key in fp32 and
priced from its plan, which is exact where the wire is fp32 and is measured like any point
where it is not. The front is then the non-dominated points again. Each point measured says its
agreement in ``pareto.json``; the notes say which points fell to fp32 and why.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..core.mapping import mapping_json
from ..core.plan import load_plan
from .cost import plan_cost
from .front import Point
from .settings import Floor, Settings
from .timing import Timing


def measured(point: Point, wire: str) -> bool:
    """Whether a point may lose accuracy: int8 keys, or tensors between hosts in fewer bytes."""
    return bool(point.precision) or (wire != "fp32" and len(point.cost.devices) > 1)


def point_agreement(model: Path, platform: Path, point: Point, floor: Floor, wire: str,
                    work: Path, input_shapes=None) -> tuple[float, str]:
    """Split and generate ``point`` in ``work`` as gen would, then its agreement on the floor's
    frames: (figure, what it is)."""
    from rich.console import Console

    from ..backend.agreement import agreement
    from ..backend.gen import gen
    from ..frontend.split import split

    work.mkdir(parents=True)
    (work / "mapping.json").write_text(mapping_json(point.mapping))
    split(model, work / "mapping.json", platform, work / "out", input_shapes)
    gen(work / "out", precision=point.gen_precision or "auto", console=Console(quiet=True),
        calibration=floor.source if point.precision else None, preprocess=floor.preprocess,
        wire=wire)
    return agreement(work / "out", floor.source, floor.preprocess, floor.frames,
                     per_key=False).figure()


def hold_floor(points: tuple[Point, ...], model: Path, platform: Path, timing: Timing,
               settings: Settings, floor: Floor,
               progress: Callable[[int, int, str], None] | None = None, input_shapes=None
               ) -> tuple[tuple[Point, ...], tuple[str, ...]]:
    """``points`` with each measured point's agreement, those below the floor replaced by their
    fp32 twins (or left out where the twin too is below it), and the notes that say so.

    Raises:
        AutodiceError: frames that cannot be made, a point gen cannot make.
    """
    from ..frontend.split import plan_graph

    say = progress or (lambda done, total, what: None)
    todo = [p for p in points if measured(p, settings.wire)]
    kept, fell, dropped = [], [], []
    with tempfile.TemporaryDirectory(prefix="autodice-floor-") as tmp:
        for k, p in enumerate(todo):
            say(k, len(todo), f"{p.name}: gen and {floor.frames} frames end to end")
            value, what = point_agreement(model, platform, p, floor, settings.wire,
                                          Path(tmp) / p.name, input_shapes)
            if value >= floor.min_agreement:
                kept.append(replace(p, agreement=(value, what)))
                continue
            fell.append(f"{p.name} {value:.3f} ({what})")
            if not p.precision:
                dropped.append(p.name)
                continue
            twin = replace(p, precision={})
            if settings.wire != "fp32":  # the wire alone may be what loses
                value, what = point_agreement(model, platform, twin, floor, settings.wire,
                                              Path(tmp) / f"{p.name}-fp32", input_shapes)
                if value < floor.min_agreement:
                    dropped.append(p.name)
                    continue
                twin = replace(twin, agreement=(value, what))
            out = Path(tmp) / p.name / "out"  # the same mapping's plan, every key fp32
            plan = load_plan(out)
            kept.append(replace(twin, cost=plan_cost(plan, timing, plan_graph(out, plan, model),
                                                     wire=settings.wire)))
    say(len(todo), len(todo), "done")
    done = {p.name: p for p in kept}
    result, seen = [], set()
    for p in (done.get(p.name, p) for p in points if p.name not in dropped):
        same = (mapping_json(p.mapping), p.gen_precision)  # a twin may be a point already
        if same not in seen:
            seen.add(same)
            result.append(p)
    notes = (f"--min-agreement {floor.min_agreement:g} on {floor.frames} frames of "
             f"{floor.source}: {len(todo)} points measured",)
    if fell:
        notes += (f"below it: {'; '.join(fell)}"
                  + (f"; left out (fp32 keys too fall below it): {', '.join(dropped)}"
                     if dropped else "")
                  + ("; the rest keep their mappings with every key fp32"
                     if len(dropped) < len(fell) else ""),)
    return tuple(result), notes
