"""``autodice dse --measure``: run front points for real and set the model's figures beside them.

Each chosen point goes through ``split``, ``gen`` and ``build`` once, then runs ``rounds`` times
here under mpirun (or deployed to an inventory's hosts); ``OUT/measure.json`` holds predicted
and measured throughput (each run's rate once its pipeline is full, as the model predicts; the
whole run's too) and memory, with notes on what makes a run here unlike the boards.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import AutodiceError
from ..core.model import load_model
from ..core.outdir import claim
from ..core.spec import parse_platform
from .cost import plan_cost
from .profile import six_digits
from .search import only_hosts
from .timing import make_timing


@dataclass(frozen=True)
class Measurement:
    """One front point run for real: the model's figures beside the measured ones."""

    point: str
    predicted_fps: float
    runs_fps: tuple[float, ...]  # one per round, in round order: the run's steady_fps
    predicted_memory: int  # bytes, largest device
    measured_memory: int  # bytes, largest host's summed peak RSS (median over the rounds)
    notes: tuple[str, ...]

    @property
    def measured_fps(self) -> float:
        """The median round: one slow round (a busy neighbour on a shared machine) moves it
        less than it moves the mean."""
        return float(np.median(self.runs_fps))

    @property
    def fps_error(self) -> float:
        return (self.measured_fps - self.predicted_fps) / self.predicted_fps

    @property
    def memory_error(self) -> float:
        return (self.measured_memory - self.predicted_memory) / max(self.predicted_memory, 1)


def pick_points(n: int, k: int) -> list[int]:
    """``k`` front indices spread from the fastest to the slowest point."""
    return sorted(set(np.round(np.linspace(0, n - 1, min(k, n))).astype(int).tolist()))


def measure(out: str | Path, model: str | Path, platform: str | Path, profile, k: int,
            frames: int = 100, rounds: int = 5, inventory: str | Path | None = None,
            progress=None, power=None, hosts=None) -> list[Measurement]:
    """Re-run ``k`` front points of ``out`` for real: split -> gen -> build -> run, ``rounds``
    times each.

    Without ``inventory`` every rank runs here under mpirun (hosts mapped to localhost; when the
    plan needs more cores than this machine has, ranks are oversubscribed and the note says so).
    With it, each point is deployed to the inventory's hosts and run there (``autodice deploy
    --run``). The rounds visit the points in turn, so a stretch of time when the machine is busy
    with something else slows one round of each point rather than every round of one point;
    each point's figure is its median round. Writes ``out/measure/<point>/`` and
    ``out/measure.json``.

    ``hosts``: the boards the search was restricted to (``dse --hosts``): the profiles cover
    those only.

    Raises:
        AutodiceError: no front in ``out``, or a step failed (its message).
    """
    from ..backend.build import build
    from ..backend.gen import gen
    from ..frontend.split import split

    if rounds < 1 or frames < 1:
        raise AutodiceError(f"--rounds {rounds} --frames {frames}: need at least 1 of each")
    out = Path(out)
    try:
        doc = json.loads((out / "pareto.json").read_text())
    except (OSError, json.JSONDecodeError):
        raise AutodiceError(f"{out}/pareto.json: no front here; run `autodice dse` first") from None
    names = [doc["points"][i]["point"] for i in pick_points(len(doc["points"]), k)]
    claim(out, "measure/", "measure.json")
    timing = make_timing(only_hosts(parse_platform(platform), hosts), profile, power)
    graph = load_model(model)
    steps = len(names) * (rounds + 1)
    say = progress or (lambda done, total, what: None)
    (out / "measure").mkdir(exist_ok=True)
    points = []
    for step, name in enumerate(names):
        work = out / "measure" / name
        say(step, steps, f"{name}: split, gen, build")
        plan = split(model, out / "mappings" / f"{name}.json", platform, work)
        gen(work)
        if inventory is None:
            build(work)
        points.append((name, work, plan, _measure_inputs(plan, work)))
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in names}
    with_fill: dict[str, list[float]] = {name: [] for name in names}
    elsewhere: dict[str, float] = {name: 0.0 for name in names}
    for rnd in range(rounds):
        for j, (name, work, plan, inputs) in enumerate(points):
            say(len(names) * (rnd + 1) + j, steps, f"{name}: round {rnd + 1} of {rounds}")
            before = _cpu_clock()
            stats = _run_point(work, inputs, frames, inventory)
            if inventory is None:  # remote ranks are not our children: no gauge
                elsewhere[name] = max(elsewhere[name], _busy_elsewhere(before, _cpu_clock()))
            by_host: dict[str, int] = {}
            for r, st in zip(plan.ranks, stats["ranks"]):
                by_host[r.host] = by_host.get(r.host, 0) + int(st["peak_rss"])
            # The model predicts a full pipeline: each run's steady_fps (its first frame left
            # out), not its fps, whose fill cost VGG-19's points 4-10 % of 40-frame runs.
            runs[name].append((float(stats.get("steady_fps") or stats["fps"]),
                               max(by_host.values())))
            with_fill[name].append(float(stats["fps"]))
    cpus = os.cpu_count() or 1
    results = []
    for name, work, plan, _ in points:
        predicted = plan_cost(plan, timing, graph)
        notes = _measure_notes(plan, cpus, elsewhere[name], inventory)
        results.append(Measurement(name, predicted.throughput, tuple(f for f, _ in runs[name]),
                                   predicted.max_memory,
                                   int(np.median([m for _, m in runs[name]])), tuple(notes)))
    (out / "measure.json").write_text(json.dumps(
        [{"point": m.point, "predicted_fps": six_digits(m.predicted_fps),
          "measured_fps": six_digits(m.measured_fps),
          "runs_fps": [six_digits(f) for f in m.runs_fps], "fps_error": six_digits(m.fps_error),
          "runs_fps_with_fill": [six_digits(f) for f in with_fill[m.point]],
          "predicted_memory_bytes": m.predicted_memory,
          "measured_peak_rss_bytes": m.measured_memory,
          "memory_error": six_digits(m.memory_error),
          "frames": frames, "where": "here" if inventory is None else str(inventory),
          "notes": list(m.notes)} for m in results], indent=1, sort_keys=True) + "\n")
    return results


def _measure_inputs(plan, work: Path) -> dict[str, Path]:
    """Seeded random inputs of the plan's input shapes, saved in ``work``."""
    rng = np.random.default_rng(0)
    inputs = {}
    for t in plan.model_inputs:
        path = work / f"input_{len(inputs)}.npy"
        np.save(path, rng.standard_normal(t.shape).astype(t.dtype))
        inputs[t.name] = path
    return inputs


def _run_point(work: Path, inputs: dict[str, Path], frames: int, inventory) -> dict:
    """One run of a built point: here, or deployed (a no-op sync after the first) and run."""
    if inventory is None:
        from ..backend.run import run

        return run(work, inputs, frames=frames).stats
    from ..deploy.deploy import deploy

    res = deploy(work, inventory, run=True, inputs=inputs, frames=frames)
    assert res.run is not None
    return res.run.stats


def _cpu_clock() -> tuple[float, float, float]:
    """(wall s, CPU s busy on this machine, CPU s of our finished child processes)."""
    import resource

    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.monotonic(), busy, kids.ru_utime + kids.ru_stime


def _busy_elsewhere(before, after) -> float:
    """Share of this machine's cores that something other than our run kept busy between two
    :func:`_cpu_clock` readings (other processes, or the hypervisor's steal)."""
    wall = after[0] - before[0]
    others = (after[1] - before[1]) - (after[2] - before[2])
    return max(others, 0.0) / max(wall * (os.cpu_count() or 1), 1e-9)


def _measure_notes(plan, cpus: int, elsewhere: float, inventory) -> list[str]:
    """What made these runs unlike the boards', so a large error can be read for what it is."""
    notes = []
    if inventory is None:
        threads = sum(r.threads for r in plan.ranks)
        if threads > cpus:
            notes.append(f"oversubscribed: {threads} threads on {cpus} cores here")
        if len(plan.hosts()) > 1:
            notes.append(f"{len(plan.hosts())} hosts ran on localhost (shared memory, not the "
                         f"network)")
        if any(r.device == "gpu" for r in plan.ranks):
            notes.append("GPU ranks ran on this machine's CPU")
    if elsewhere >= 0.1:
        notes.append(f"other work kept up to {elsewhere:.0%} of the cores busy during its runs")
    return notes
