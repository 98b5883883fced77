"""The front: its points, and the files and table that show it.

``OUT/pareto.csv`` and ``pareto.json`` (every point, its mapping file, its predicted figures and
the references), ``OUT/mappings/<point>.json`` (mappings ``split`` takes; a point with int8 keys
also ``<point>.precision``, what ``gen --precision`` takes), ``pareto.png``
(three projections) and ``report.html`` (the front to explore: a point shows its mapping and
saves it; :mod:`autodice.report`). All byte-stable: numbers at six significant digits, sorted
keys, no timestamps, so a seed reproduces the files.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..core.mapping import mapping_json
from ..core.outdir import staged
from .cost import Cost
from .profile import six_digits

if TYPE_CHECKING:
    from .settings import Floor, Settings


@dataclass(frozen=True)
class Point:
    """One mapping of the front (or a reference) with its predicted cost."""

    name: str
    mapping: dict[str, list[str]]
    cost: Cost
    proposed: bool = False  # grown on top of the search (copies, split layers): see expand
    precision: dict[str, str] = field(default_factory=dict)  # int8 keys: KEY -> "int8"
    # measured against the whole model (dse --min-agreement): the figure, and what it is
    agreement: tuple[float, str] | None = None

    @property
    def gen_precision(self) -> str | None:
        """``gen --precision`` for this point (None: every key as gen's default)."""
        return ",".join(f"{k}={v}" for k, v in self.precision.items()) or None

    @property
    def devices(self) -> int:
        return len(self.cost.devices)


@dataclass(frozen=True)
class Front:
    """What a search found: the front, the paper's references, and how it was searched."""

    points: tuple[Point, ...]  # by throughput, fastest first
    references: tuple[Point, ...]  # 1-device CPU, 1-device GPU
    settings: Settings
    evaluations: int
    seconds: float
    notes: tuple[str, ...] = field(default=())
    floor: Floor | None = None  # what the points' accuracy was held to (dse --min-agreement)


def point_row(p: Point) -> dict:
    """A point as a row of ``pareto.csv`` (and the common part of its ``pareto.json`` entry)."""
    c = p.cost
    return {"point": p.name, "throughput_fps": six_digits(c.throughput),
            "energy_j": six_digits(c.max_energy_j), "memory_bytes": c.max_memory,
            "devices": p.devices, "cores": c.cores, "gpus": c.gpus, "ranks": len(c.ranks),
            "period_s": six_digits(c.period_s), "bottleneck": c.bottleneck}


def point_json(p: Point, mapping_file: str | None) -> dict:
    """A point as an entry of ``pareto.json``: its row, per-device and per-rank detail."""
    c = p.cost
    return {**point_row(p), "mapping": mapping_file,
            **({"precision": p.gen_precision} if p.precision else {}),
            **({"agreement": six_digits(p.agreement[0]), "agreement_of": p.agreement[1]}
               if p.agreement else {}),
            "devices_detail": [{"host": d.host, "memory_bytes": d.memory, "ram_bytes": d.ram,
                                "gpu_mem_bytes": d.gpu_mem, "energy_j": six_digits(d.energy_j)}
                               for d in c.devices],
            "ranks_detail": [{"rank": r.rank, "key": r.key, "layers": r.layers,
                              "compute_s": six_digits(r.compute_s), "comm_s": six_digits(r.comm_s),
                              "memory_bytes": r.memory,
                              **({"precision": p.precision.get(r.key, "fp32")}
                                 if p.precision else {})} for r in c.ranks],
            "over_capacity": list(c.over_capacity)}


def write_front(front: Front, out: Path, model: str, platform: str) -> None:
    """``OUT/pareto.csv``, ``pareto.json``, ``mappings/<point>.json``, ``pareto.png``,
    ``report.html`` (written to a temporary directory, then renamed)."""
    from ..report import front_page

    with staged(Path(out)) as tmp:
        (tmp / "mappings").mkdir()
        for p in front.points:
            (tmp / "mappings" / f"{p.name}.json").write_text(mapping_json(p.mapping))
            if p.precision:  # what gen takes: gen OUT --precision "$(cat mappings/p03.precision)"
                (tmp / "mappings" / f"{p.name}.precision").write_text(p.gen_precision + "\n")
        buf = io.StringIO()
        cols = list(point_row(front.points[0]))
        writer = csv.DictWriter(buf, cols + ["mapping"], lineterminator="\n")
        writer.writeheader()
        for p in front.points:
            writer.writerow({**point_row(p), "mapping": f"mappings/{p.name}.json"})
        (tmp / "pareto.csv").write_text(buf.getvalue())
        s = front.settings
        doc = {"model": model, "platform": platform,
               "settings": {"pop": s.pop, "gens": s.gens, "seed": s.seed, "crossover": s.crossover,
                            "mutation": s.mutation, "encoding": s.encoding,
                            "segments": s.segments, **({"wire": s.wire} if s.wire != "fp32"
                                                        else {})},
               "evaluations": front.evaluations,
               "objectives": {"throughput_fps": "max", "energy_j": "min (largest per device, "
                              "per frame)", "memory_bytes": "min (largest per device)"},
               "points": [point_json(p, f"mappings/{p.name}.json") for p in front.points],
               "references": [{**point_json(p, None), "mapping_keys": list(p.mapping)}
                              for p in front.references],
               "notes": list(front.notes),
               **({"floor": {"min_agreement": front.floor.min_agreement,
                             "source": str(front.floor.source),
                             "preprocess": front.floor.preprocess,
                             "frames": front.floor.frames}} if front.floor else {})}
        (tmp / "pareto.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        (tmp / "report.html").write_text(front_page(doc, {p.name: p.mapping for p in front.points}),
                                         encoding="utf-8")
        plot_front(front, tmp / "pareto.png")


def plot_front(front: Front, path: Path) -> None:
    """The front in three projections, references marked; byte-stable PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = {"fps": [p.cost.throughput for p in front.points],
              "mj": [p.cost.max_energy_j * 1e3 for p in front.points],
              "mb": [p.cost.max_memory / 1e6 for p in front.points]}
    refs = {"fps": [p.cost.throughput for p in front.references],
            "mj": [p.cost.max_energy_j * 1e3 for p in front.references],
            "mb": [p.cost.max_memory / 1e6 for p in front.references]}
    label = {"fps": "throughput (frames/s)", "mj": "max per-device energy (mJ/frame)",
             "mb": "max per-device memory (MB)"}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for ax, (x, y, c) in zip(axes, (("fps", "mj", "mb"), ("fps", "mb", "mj"),
                                     ("mj", "mb", "fps"))):
        sc = ax.scatter(values[x], values[y], c=values[c], cmap="viridis", s=22,
                        label="Pareto front")
        fig.colorbar(sc, ax=ax, label=label[c])
        for k, p in enumerate(front.references):
            ax.scatter([refs[x][k]], [refs[y][k]], marker="*^"[k % 2], s=120,
                       color="tab:red", label=p.name)
        ax.set_xlabel(label[x])
        ax.set_ylabel(label[y])
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    s = front.settings
    fig.suptitle(f"NSGA-II front: {len(front.points)} mappings ({s.encoding} encoding, "
                 f"pop {s.pop}, {s.gens} generations, seed {s.seed})")
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def table_rows(front: Front, limit: int = 12) -> list[Point]:
    """The points the printed table shows: all when few, else the extremes and evenly spaced
    ones in between (the CSV has them all)."""
    pts = list(front.points)
    if len(pts) <= limit:
        return pts
    pick = set(np.unique(np.round(np.linspace(0, len(pts) - 1, limit - 2)).astype(int)))
    pick.add(min(range(len(pts)), key=lambda k: pts[k].cost.max_energy_j))
    pick.add(min(range(len(pts)), key=lambda k: pts[k].cost.max_memory))
    return [pts[k] for k in sorted(pick)]
