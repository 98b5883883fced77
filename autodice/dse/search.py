"""``autodice dse``: search mappings with NSGA-II for throughput, per-device energy and memory.

The AutoDiCE paper's search, made cheap by the cost model (:mod:`autodice.dse.cost`) instead of
runs on the boards: pymoo's NSGA-II (population 100, 400 generations, crossover 0.5, mutation 0.1
by default, as in the paper) over mappings, three objectives -- throughput (max), the largest
per-device energy per frame (min), the largest per-device memory (min) -- and the devices' memory
as a constraint. A seed reproduces the front.

The pieces: the encodings (:mod:`autodice.dse.genes`), the pymoo problem and operators
(:mod:`autodice.dse.problem`, imported only when a search runs), the files written
(:mod:`autodice.dse.front`), and re-running points for real (:mod:`autodice.dse.measure`).

Every emitted front point goes through the compiler's own passes
(:func:`~autodice.frontend.split.plan_mapping`, what ``split`` runs before writing), and its
plan-based cost must equal the fast path's, so the files in ``OUT/mappings/`` are mappings
``split`` accepts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..core.errors import AutodiceError
from ..core.mapping import mapping_from
from ..core.model import Graph, load_model
from ..core.outdir import check_replaceable
from ..core.spec import Platform, parse_platform
from ..frontend.split import plan_mapping
from .cost import plan_cost
from .cost_model import CostModel
from .front import Front, Point, write_front
from .genes import Genes
from .profile import load_profile, model_sha256, six_digits
from .settings import OBJECTIVES, Floor, Settings
from .timing import Timing, make_timing


def only_hosts(platform: Platform, hosts) -> Platform:
    """The platform with only ``hosts`` (all of them when None), for a search that may use those
    boards only.

    Raises:
        AutodiceError: a host the platform does not have.
    """
    if hosts is None:
        return platform
    unknown = [h for h in hosts if h not in platform.devices]
    if unknown or not hosts:
        raise AutodiceError(f"hosts {', '.join(unknown) or '(none)'}: choose among "
                            f"{', '.join(platform.devices)} of {platform.path}")
    return Platform(platform.path, {h: d for h, d in platform.devices.items() if h in hosts})


def search_timing(platform: str | Path, hosts, profile, power=None) -> Timing:
    """The timing of a search restricted to ``hosts`` (:func:`only_hosts`): a per-host profile
    of a board left out of the search is not needed, and not an error."""
    full = parse_platform(platform)
    spec = only_hosts(full, hosts)
    if isinstance(profile, Mapping):
        profile = {h: p for h, p in profile.items()
                   if h in (None, "*") or h in spec.devices or h not in full.devices}
    return make_timing(spec, profile, power)


def note_other_files(timing: Timing, model: str | Path) -> None:
    """A note in ``timing`` for each profile taken of other bytes than ``model``: its layer
    names may all be there (another export, other weights, another input size) while its times
    are another model's. Once per search: it hashes the model."""
    digest = model_sha256(Path(model))
    for p in {id(p): p for p in timing.profiles.values()}.values():
        if p.model_sha256 != digest and len(p.model_sha256) == 64:  # (a fixture has none)
            timing.notes.append(f"the profile of {p.model} was taken of another file than "
                                f"{model}: its times are that file's; `autodice profile "
                                f"{model}` measures this one")


def dse(model: str | Path, platform: str | Path, profile, out: str | Path | None,
        settings: Settings = Settings(), progress=None, power=None, hosts=None,
        input_shapes: dict[str, tuple[int, ...]] | None = None, floor: Floor | None = None,
        floor_progress=None) -> Front:
    """Search, verify every front point with the split passes, hold it to ``floor`` where
    given, write ``out`` (None: nothing is written: ``autodice.search`` without ``out``).

    Args:
        profile: a profile.json path or Profile, or ``{host: ...}`` (key None: the default).
        hosts: the boards the search may use (default: all of the platform's).
        input_shapes: static shapes for inputs of symbolic size (``split --input-shape``).
        floor: the accuracy every point with int8 keys or a smaller wire must reach, measured
            after the search (:mod:`.accuracy`); ``floor_progress(done, total, what)`` follows it.
    Raises:
        AutodiceError: bad inputs (all listed); ``out`` is untouched then.
    """
    settings.check()
    if floor is not None:
        floor.check()
    if out is not None:
        check_replaceable(Path(out))  # before the search, not after it
    timing = search_timing(platform, hosts, profile, power)
    note_other_files(timing, model)
    graph = load_model(model, input_shapes)
    front = explore(graph, timing, settings, progress)
    for p in front.points:
        verify_point(graph, timing.platform, timing, p, settings.wire)
    if floor is not None:
        from .accuracy import hold_floor

        points, notes = hold_floor(front.points, Path(model), Path(platform), timing, settings,
                                   floor, floor_progress, input_shapes)
        if not points:
            raise AutodiceError(f"no point of the front reaches --min-agreement "
                                f"{floor.min_agreement:g}: {'; '.join(notes)}")
        front = replace(front, points=non_dominated_points(points, settings),
                        notes=tuple(n for n in front.notes if n != INT8_NOTE) + notes,
                        floor=floor)  # the floor's notes say what int8 costs
    if out is not None:
        write_front(front, Path(out), str(model), str(platform))
    return front


def explore(graph: Graph, timing: Timing, settings: Settings = Settings(),
            progress: Callable[[int, int], None] | None = None) -> Front:
    """Run NSGA-II and return the non-dominated feasible mappings of the last population.

    Raises:
        AutodiceError: bad settings, a profile that does not fit the model, or no mapping that
            fits the devices' memory.
    """
    settings.check()
    from .problem import non_dominated, nsga2  # pymoo: loaded only when a search runs

    cm = CostModel(graph, timing, settings.wire)
    genes = Genes(cm, settings.encoding, settings.segments)
    start = time.perf_counter()
    X, F, G, evaluations = nsga2(genes, settings, progress)
    seconds = time.perf_counter() - start
    feasible = (G <= 0).all(axis=1)
    if not feasible.any():
        best = int(np.argmin(G.max(axis=1)))
        c = cm.cost(genes.decode(X[best])[0])
        wanted = [*(["each device's mem"] if G[best, 0] > 0 else []),
                  *([f"max memory {settings.max_memory / 1e6:g} MB"] if G[best, 2] > 0 else []),
                  *([f"{settings.min_fps:g} frames/s"] if G[best, 3] > 0 else [])]
        raise AutodiceError(f"{timing.platform.path}: no mapping found that meets "
                            f"{' and '.join(wanted) or 'the constraints'} (closest: "
                            f"{c.throughput:.3g} frames/s, {c.max_memory / 1e6:.1f} MB"
                            f"{'; ' + '; '.join(c.over_capacity) if c.over_capacity else ''})")
    X, F = X[feasible], F[feasible]
    keep = non_dominated(F)
    slots = np.unique(genes.decode(X[keep]), axis=0)
    points = [(cm.cost(g), g) for g in slots]
    points.sort(key=lambda p: (-p[0].throughput, p[0].max_energy_j, p[0].max_memory,
                               len(p[0].ranks), tuple(p[1])))
    # Mappings that differ only off the critical path tie on all three objectives: keep the
    # one with the fewest ranks of each tie (the front is about trade-offs, not variants).
    seen: set[tuple[float, float, int]] = set()
    distinct = []
    for c, g in points:
        key = (six_digits(c.throughput), six_digits(c.max_energy_j), c.max_memory)
        if key not in seen:
            seen.add(key)
            distinct.append((c, g))
    points = distinct
    width = max(2, len(str(len(points) - 1)))  # p00 even in a small front, as dse/README says
    front = tuple(Point(f"p{k:0{width}d}", cm.mapping(g), c, precision=cm.precision(g))
                  for k, (c, g) in enumerate(points))
    if settings.parallel:
        front = with_parallelism(front, graph, timing, settings)
    notes = (cm.notes + ((INT8_NOTE,) if any(p.precision for p in front) else ())
             + ((WIRE_NOTE.format(wire=settings.wire),) if settings.wire != "fp32" else ()))
    return Front(front, references(cm), settings, evaluations, seconds, notes)


INT8_NOTE = ("int8 keys are chosen for their time and memory alone: without --min-agreement "
             "the search does not hold their accuracy; gen measures each int8 key's error "
             "against fp32 and keeps its most sensitive layers fp32, which the profile timed in "
             "int8 (a key's gain is somewhat high): read gen's lines, or check --frames, before "
             "you deploy")


WIRE_NOTE = ("priced with tensors that cross hosts in {wire} (fewer bytes on the links): make "
             "every point with gen OUT --wire {wire}")


def with_parallelism(front: tuple[Point, ...], graph: Graph, timing: Timing,
                     settings: Settings) -> tuple[Point, ...]:
    """The front with stage copies and split layers proposed on top (:mod:`.expand`): the
    non-dominated points of both, under the same objectives and constraints."""
    from .expand import expand

    grown = expand(front, graph, timing.platform, timing, settings.parallel,
                   wire=settings.wire)
    return non_dominated_points([*front, *(p for p in grown if _meets(p.cost, settings))],
                                settings)


def non_dominated_points(points, settings: Settings) -> tuple[Point, ...]:
    """The points no other beats on every objective of ``settings``, fastest first."""
    F = np.array([[(-p.cost.throughput, p.cost.max_energy_j, p.cost.max_memory)[
        OBJECTIVES.index(o)] for o in settings.objectives] for p in points])
    dominated = [any((F[j] <= F[i]).all() and (F[j] < F[i]).any() for j in range(len(F)))
                 for i in range(len(F))]
    kept = [p for p, d in zip(points, dominated) if not d]
    return tuple(sorted(kept, key=lambda p: (-p.cost.throughput, p.cost.max_memory, p.name)))


def _meets(cost, settings: Settings) -> bool:
    return (not cost.over_capacity
            and (settings.max_memory is None or cost.max_memory <= settings.max_memory)
            and (settings.min_fps is None or cost.throughput >= settings.min_fps))


def references(cm: CostModel) -> tuple[Point, ...]:
    """The paper's baselines: the whole model on the best single device's CPU (all its cores),
    and on the best single GPU."""
    out = []
    for label, kinds in (("1-device CPU", ("all", "one")), ("1-device GPU", ("gpu",))):
        best = None
        for group in sorted({s.group for s in cm.slots}):  # a device, or one kind of its cores
            k = next((k for kind in kinds for k, s in enumerate(cm.slots)
                      if s.group == group and s.kind == kind), None)
            if k is None:
                continue
            g = np.full(cm.n_layers, k)
            c = cm.cost(g)
            if best is None or c.throughput > best[0].throughput:
                best = (c, g)
        if best:
            out.append(Point(label, cm.mapping(best[1]), best[0]))
    return tuple(out)


def verify_point(graph: Graph, platform: Platform, timing: Timing, point: Point,
                 wire: str = "fp32") -> None:
    """Run the split passes on ``point.mapping`` and hold its plan cost to the fast path's.

    Raises:
        AutodiceError: the mapping is not one ``split`` accepts, or the two costs differ (an
            internal error: the fast path and the compiler disagree).
    """
    if point.proposed:  # planned and priced from its plan already; the fast path never saw it
        return
    mapping = mapping_from(point.mapping, f"mappings/{point.name}.json")
    plan = plan_mapping(graph, mapping, platform)
    slow, fast = plan_cost(plan, timing, graph, frozenset(point.precision), wire), point.cost
    same = (abs(slow.throughput - fast.throughput) <= 1e-6 * fast.throughput
            and slow.max_memory == fast.max_memory
            and abs(slow.max_energy_j - fast.max_energy_j) <= 1e-6 * max(fast.max_energy_j, 1e-12))
    if not same:
        raise AutodiceError(f"internal error: point {point.name}: the cost model's fast path "
                            f"({fast.throughput:.6g} fps, {fast.max_memory} B) and the plan "
                            f"({slow.throughput:.6g} fps, {slow.max_memory} B) disagree")


def profile_arg(specs, model, platform, input_shapes=None, int8: bool = False):
    """``--profile`` values -> what :func:`autodice.dse.timing.make_timing` takes.

    ``FILE`` is the profile of every host, ``HOST=FILE`` of one host (a path that exists is
    taken as a file even if it holds ``=``). With none, the model is profiled now when this
    autodice has a profiler (``int8``: its int8 times too).

    Raises:
        AutodiceError: unreadable profiles, or none given and no profiler to make one.
    """
    if not specs:
        return measure_profile(model, platform, input_shapes, int8)
    out: dict = {}
    for spec in specs:
        host, eq, path = spec.partition("=")
        if not eq or Path(spec).exists():
            host, path = None, spec
        if host in out:
            raise AutodiceError(f"--profile {spec}: a second profile for "
                                f"{'host ' + host if host else 'all hosts'}")
        out[host] = load_profile(path)
    return out


def measure_profile(model, platform, input_shapes=None, int8: bool = False):
    """Profile ``model`` on this machine for ``platform`` (what ``dse`` does when given no
    profile)."""
    from .profiler import profile_model

    return profile_model(model, platform, input_shapes=input_shapes, int8=int8)
