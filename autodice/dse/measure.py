"""``autodice dse --measure``: run front points for real and set the model's figures beside them.

Each chosen point goes through ``split``, ``gen`` and ``build`` once, then runs ``rounds`` times
here under mpirun (or deployed to an inventory's hosts); ``OUT/measure.json`` holds predicted
and measured throughput (each run's rate once its pipeline is full, as the model predicts; the
whole run's too) and memory, with notes on what makes a run here unlike the boards.

Where a host has a power sensor (:mod:`autodice.backend.power`; a deployed board's read over
ssh), each point's energy per frame as measured stands beside the model's, which comes from
the platform file's watts: the energy objective checked, host by host on the boards, as one
sum here (every host ran on this machine).

With ``pace``, each round also runs the whole model alone on one core of each host the points
use, the profile's own setting: measured over predicted, that is the host's pace in that round
(a board that throttles, a busy neighbour, a VM's slow phase). Each point's rounds are also
given at the profile's pace, so an error of the model and a change of the machine show apart.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..backend.precision import Precision
from ..core.errors import AutodiceError
from ..core.mapping import cpu_key, mapping_json
from ..core.model import load_model
from ..core.names import file_slug
from ..core.outdir import claim
from ..core.plan import Plan
from .cost import Cost, plan_cost
from .profile import six_digits
from .search import search_timing


@dataclass(frozen=True)
class Measurement:
    """One front point run for real: the model's figures beside the measured ones."""

    point: str
    predicted_fps: float
    runs_fps: tuple[float, ...]  # one per round, in round order: the run's steady_fps
    predicted_memory: int  # bytes, largest device
    measured_memory: int  # bytes, largest host's summed peak RSS (median over the rounds)
    notes: tuple[str, ...]
    runs_pace: tuple[float, ...] = ()  # with pace, one per round: its hosts' mean pace
    energy: tuple[EnergyCheck, ...] = ()

    @property
    def measured_fps(self) -> float:
        """The median round: one slow round (a busy neighbour on a shared machine) moves it
        less than it moves the mean."""
        return float(np.median(self.runs_fps))

    @property
    def fps_error(self) -> float:
        return (self.measured_fps - self.predicted_fps) / self.predicted_fps

    @property
    def paced_fps(self) -> float | None:
        """The median round at the profile's pace (each round's frames/s over its hosts' pace
        in that round); None without pace."""
        if not self.runs_pace:
            return None
        return float(np.median([f / p for f, p in zip(self.runs_fps, self.runs_pace)]))

    @property
    def paced_fps_error(self) -> float | None:
        paced = self.paced_fps
        return None if paced is None else (paced - self.predicted_fps) / self.predicted_fps

    @property
    def memory_error(self) -> float:
        return (self.measured_memory - self.predicted_memory) / max(self.predicted_memory, 1)


@dataclass(frozen=True)
class EnergyCheck:
    """Energy per frame on a host: the model's beside its sensor's (median round)."""

    host: str  # an inventory host, or "here": every host ran on this machine (their sum)
    predicted_j: float
    measured_j: float | None  # None: no sensor there
    sensor: str | None

    @property
    def error(self) -> float | None:
        if self.measured_j is None or self.predicted_j <= 0:
            return None
        return (self.measured_j - self.predicted_j) / self.predicted_j

    def row(self) -> dict:
        return {"predicted_j_per_frame": six_digits(self.predicted_j),
                "measured_j_per_frame": None if self.measured_j is None
                else six_digits(self.measured_j),
                "error": None if self.error is None else six_digits(self.error),
                "sensor": self.sensor}


def pick_points(n: int, k: int) -> list[int]:
    """``k`` front indices spread from the fastest to the slowest point."""
    return sorted(set(np.round(np.linspace(0, n - 1, min(k, n))).astype(int).tolist()))


def measure(out: str | Path, model: str | Path, platform: str | Path, profile, k: int,
            frames: int = 100, rounds: int = 5, inventory: str | Path | None = None,
            progress=None, power=None, hosts=None, pace: bool = False,
            input_shapes: dict[str, tuple[int, ...]] | None = None) -> list[Measurement]:
    """Re-run ``k`` front points of ``out`` for real: split -> gen -> build -> run, ``rounds``
    times each.

    Without ``inventory`` every rank runs here under mpirun (hosts mapped to localhost; when the
    plan needs more cores than this machine has, ranks are oversubscribed and the note says so).
    With it, each point is deployed to the inventory's hosts and run there (``autodice deploy
    --run``). The rounds visit the points in turn, so a stretch of time when the machine is busy
    with something else slows one round of each point rather than every round of one point;
    each point's figure is its median round. Writes ``out/measure/<point>/`` and
    ``out/measure.json``.

    ``pace``: each round also runs the whole model on one core of each host the points use
    (``out/measure/pace/<host>/``), and each point gets its rounds at the profile's pace (see
    the module docstring).

    ``hosts``: the boards the search was restricted to (``dse --hosts``): the profiles cover
    those only. ``input_shapes``: as the search had them (inputs of symbolic size).

    Raises:
        AutodiceError: no front in ``out``, or a step failed (its message).
    """
    from ..frontend.split import plan_graph, split

    if rounds < 1 or frames < 1:
        raise AutodiceError(f"--rounds {rounds} --frames {frames}: need at least 1 of each")
    out = Path(out)
    try:
        doc = json.loads((out / "pareto.json").read_text())
    except (OSError, json.JSONDecodeError):
        raise AutodiceError(f"{out}/pareto.json: no front here; run `autodice dse` first") from None
    picked = [doc["points"][i] for i in pick_points(len(doc["points"]), k)]
    claim(out, "measure/", "measure.json")
    timing = search_timing(platform, hosts, profile, power)
    graph = load_model(model, input_shapes)
    say = progress or (lambda done, total, what: None)
    (out / "measure").mkdir(exist_ok=True)
    points = []
    wire = doc["settings"].get("wire", "fp32")  # as the search priced the points
    for step, point in enumerate(picked):
        name, precision = point["point"], point.get("precision")
        say(step, len(picked), f"{name}: split, gen, build")
        work = out / "measure" / name
        plan = split(model, out / "mappings" / f"{name}.json", platform, work, input_shapes)
        int8 = Precision.parse(precision or "auto").int8_keys(plan)
        graph_of_plan = plan_graph(work, plan, model)  # split layers' parts
        cost = plan_cost(plan, timing, graph_of_plan, int8, wire)
        points.append(_Run(name, work, plan, cost, inventory, precision, wire))
    probes = _pace_runs(out, model, platform, timing, graph, points, inventory, say,
                        input_shapes) if pace else []
    every = points + probes
    for rnd in range(rounds):
        for j, run in enumerate(every):
            say(len(every) * rnd + j, len(every) * rounds, f"{run.name}: round {rnd + 1} of "
                f"{rounds}")
            run.once(frames)
    probe = {p.name: p for p in probes}
    cpus = os.cpu_count() or 1
    results, rows = [], []
    for p in points:
        hosts_of = sorted({r.host for r in p.plan.ranks})
        runs_pace = tuple(float(np.mean([probe[h].pace[k] for h in hosts_of]))
                          for k in range(rounds)) if probes else ()
        notes = _measure_notes(p.plan, cpus, p.elsewhere, inventory, p.devices)
        notes += [f"{h}'s pace moved: the whole model alone ran at {min(probe[h].pace):.2f}-"
                  f"{max(probe[h].pace):.2f}x its profile's frames/s over the rounds"
                  for h in hosts_of if probes and max(probe[h].pace) >= 1.1 * min(probe[h].pace)]
        m = Measurement(p.name, p.cost.throughput, tuple(p.fps), p.cost.max_memory,
                        int(np.median(p.peak)), tuple(notes), runs_pace, p.energy_checks())
        results.append(m)
        rows.append({
            "point": m.point, "predicted_fps": six_digits(m.predicted_fps),
            "measured_fps": six_digits(m.measured_fps),
            "runs_fps": [six_digits(f) for f in m.runs_fps], "fps_error": six_digits(m.fps_error),
            "runs_fps_with_fill": [six_digits(f) for f in p.with_fill],
            "predicted_memory_bytes": m.predicted_memory,
            "measured_peak_rss_bytes": m.measured_memory,
            "memory_error": six_digits(m.memory_error),
            "frames": frames, "where": "here" if inventory is None else str(inventory),
            "energy": {e.host: e.row() for e in m.energy}, "notes": list(m.notes)})
        if probes:
            rows[-1].update({
                "runs_pace": [six_digits(x) for x in m.runs_pace],
                "paced_fps": six_digits(m.paced_fps),
                "paced_fps_error": six_digits(m.paced_fps_error),
                "hosts_pace": {h: {"predicted_fps": six_digits(probe[h].cost.throughput),
                                   "runs_fps": [six_digits(f) for f in probe[h].fps]}
                               for h in hosts_of}})
    (out / "measure.json").write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    return results


def _pace_runs(out: Path, model, platform, timing, graph, points: list[_Run], inventory,
               say, input_shapes=None) -> list[_Run]:
    """The whole model alone on one core of each host ``points`` use (the profile's own
    setting), built to run: ``out/measure/pace/<host>.json`` and ``<host>/``."""
    from ..frontend.split import split

    used = {r.host for p in points for r in p.plan.ranks}
    runs = []
    for host, dev in timing.platform.devices.items():
        if host in used:
            say(len(runs), len(used), f"the whole model alone on {host}: split, gen, build")
            work = out / "measure" / "pace" / file_slug(host)
            work.parent.mkdir(exist_ok=True)
            mapping = work.parent / f"{file_slug(host)}.json"
            mapping.write_text(mapping_json({cpu_key(host, dev.arch, dev.slots[:1]):
                                             graph.layer_names}))
            plan = split(model, mapping, platform, work, input_shapes)
            runs.append(_Run(host, work, plan, plan_cost(plan, timing, graph), inventory))
    return runs


@dataclass
class _Run:
    """A front point (or the whole model alone on one host, for its pace) built to run, and
    what its rounds measured: frames/s with the pipeline full (as the model predicts) and with
    its fill, and the most loaded host's summed peak RSS."""

    name: str
    work: Path
    plan: Plan
    cost: Cost  # the model's prediction
    inventory: str | Path | None
    precision: str | None = None  # gen --precision: int8 keys, calibrated on seeded frames
    wire: str = "fp32"  # gen --wire, as the search priced the point
    fps: list[float] = field(default_factory=list)
    with_fill: list[float] = field(default_factory=list)
    peak: list[int] = field(default_factory=list)
    energy: list[dict] = field(default_factory=list)  # each round's stats.json "energy"
    elsewhere: float = 0.0  # the most of the cores other work kept busy during a round (here)
    devices: set[str] = field(default_factory=set)  # what the GPU ranks said they ran on
    inputs: dict[str, Path] = field(init=False)  # model input name -> .npy in ``work``

    def __post_init__(self) -> None:
        from ..backend.build import build
        from ..backend.gen import gen

        self.inputs = _measure_inputs(self.plan, self.work)
        if self.precision:  # its speed is measured, not its accuracy: any frames calibrate
            batch = np.concatenate([np.load(p) for p in self.inputs.values()] * 4)
            np.save(self.work / "calibration.npy", batch)
            gen(self.work, precision=self.precision, calibration=self.work / "calibration.npy",
                wire=self.wire)
        else:
            gen(self.work, wire=self.wire)
        if self.inventory is None:
            build(self.work)

    @property
    def pace(self) -> list[float]:
        """Each round's frames/s over the predicted: for the whole model alone, its host's pace."""
        return [f / self.cost.throughput for f in self.fps]

    def once(self, frames: int) -> None:
        before = _cpu_clock()
        stats = _run_point(self.work, self.inputs, frames, self.inventory)
        if self.inventory is None:  # remote ranks are not our children: no gauge
            self.elsewhere = max(self.elsewhere, _busy_elsewhere(before, _cpu_clock()))
        by_host: dict[str, int] = {}
        for r, st in zip(self.plan.ranks, stats["ranks"]):
            by_host[r.host] = by_host.get(r.host, 0) + int(st["peak_rss"])
            if r.device == "gpu":
                self.devices.add(str(st.get("device", "")))
        # The model predicts a full pipeline: each run's steady_fps (its first frame left
        # out), not its fps, whose fill cost VGG-19's points 4-10 % of 40-frame runs.
        self.fps.append(float(stats.get("steady_fps") or stats["fps"]))
        self.with_fill.append(float(stats["fps"]))
        self.peak.append(max(by_host.values()))
        self.energy.append(stats.get("energy", {}))

    def energy_checks(self) -> tuple[EnergyCheck, ...]:
        """The model's energy per frame beside the rounds' measured (see the module
        docstring): by host where each ran on its own, as one sum where all ran here."""
        predicted = {d.host: d.energy_j for d in self.cost.devices}
        where = {h: (h, j) for h, j in predicted.items()} if self.inventory is not None else \
            {"here": (socket.gethostname(), sum(predicted.values()))}
        checks = []
        for name, (host, want) in where.items():
            said = [r[host] for r in self.energy if host in r]
            got = [s["joules_per_frame"] for s in said if s.get("joules_per_frame") is not None]
            sensor = next((s["sensor"] for s in said if s.get("sensor")), None)
            checks.append(EnergyCheck(name, want, float(np.median(got)) if got else None,
                                      sensor))
        return tuple(checks)


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


def _measure_notes(plan, cpus: int, elsewhere: float, inventory,
                   devices: set[str] = frozenset()) -> list[str]:
    """What made these runs unlike the boards', so a large error can be read for what it is
    (``devices``: what the GPU ranks said they ran on)."""
    notes = []
    cpu_vulkan = sorted(d for d in devices if "llvmpipe" in d or "lavapipe" in d)
    if cpu_vulkan:  # an emulated cluster's hosts, or a board without its GPU's driver
        notes.append(f"GPU ranks ran on {', '.join(cpu_vulkan)}: Vulkan on the CPU (Mesa's "
                     "lavapipe), not a GPU's speed")
    if inventory is None:
        threads = sum(r.threads for r in plan.ranks)
        if threads > cpus:
            notes.append(f"oversubscribed: {threads} threads on {cpus} cores here")
        if len(plan.hosts()) > 1:
            notes.append(f"{len(plan.hosts())} hosts ran on localhost (shared memory, not the "
                         f"network)")
        if any(r.device == "gpu" for r in plan.ranks) and not cpu_vulkan:
            notes.append("GPU ranks ran on this machine's CPU")
    if elsewhere >= 0.1:
        notes.append(f"other work kept up to {elsewhere:.0%} of the cores busy during its runs")
    return notes
