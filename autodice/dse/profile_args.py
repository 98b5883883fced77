"""What a profile run is asked to measure, checked before anything is measured: the model's
inputs, the thread counts, and on a big.LITTLE board which cores are of which kind."""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import AutodiceError, Problems
from ..core.model import Graph, load_model
from ..core.spec import Platform, format_cores, parse_platform
from .profile import LittleCores


def check_profile_args(model: Path, platform: str | Path | Platform, threads, input_shapes,
                       warmup: int, runs: int, gpu: bool | None, on: bool,
                       little: tuple[int, ...] | None = None) -> tuple[Platform, Graph]:
    """The platform and the model, read, and the profiler's settings checked: what the CLI
    calls first, before a cluster's links are measured or a board is given the tools.

    Raises:
        AutodiceError: an unreadable model or platform, bad counts or inputs.
    """
    spec = platform if isinstance(platform, Platform) else parse_platform(platform)
    if not on:  # a board's cores are known once it is asked
        chosen = choose_threads(spec, threads, os.cpu_count() or 1)
        if little:
            core_kinds(little, here_cores(), chosen)
    if warmup < 0 or runs < 1:
        raise AutodiceError(f"--warmup {warmup} / --runs {runs}: need warmup >= 0 and runs >= 1")
    if on and gpu:
        raise AutodiceError("--gpu with --on: timing a board's GPU from here is not supported; "
                            "run autodice profile --gpu on the board itself")
    graph = load_model(model, input_shapes)
    check_inputs(graph)
    return spec, graph


def choose_threads(spec: Platform, threads: tuple[int, ...] | None,
                   cores: int) -> tuple[int, ...]:
    """The thread counts to measure: given ones, else 1 and every device's core count.

    Counts above the measuring machine's ``cores`` would measure oversubscription, not the
    layer, so they are refused when asked for and capped when derived from the platform.
    """
    if threads:
        bad = [t for t in threads if not 1 <= t <= cores]
        if bad:
            raise AutodiceError(f"--threads {','.join(map(str, threads))}: "
                                f"{', '.join(map(str, bad))} not between 1 and the measuring "
                                f"machine's {cores} cores")
        return tuple(sorted(set(threads)))
    return tuple(sorted({1} | {min(len(d.slots), cores) for d in spec.devices.values()
                               if d.slots is not None}))


def check_inputs(graph: Graph) -> None:
    """The profiler feeds seeded float32 inputs of static shape; say which input is not one."""
    problems = Problems()
    for name in graph.inputs:
        t = graph.types.get(name)
        if t is None or not t.static:
            problems.add(f'{graph.path}: input "{name}" has no static shape '
                         f"({t.shape_str() if t else '?'}); give --input-shape {name}=1x...")
        elif t.dtype != "float32":
            problems.add(f'{graph.path}: input "{name}" is {t.dtype}; the profiler feeds float32')
    problems.raise_if_any()


def here_cores() -> tuple[int, ...]:
    """The cores this process may run on (a container's cpuset may hold some back)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def core_kinds(little: tuple[int, ...], cores: tuple[int, ...], threads: tuple[int, ...],
               given: str = "--little") -> tuple[LittleCores, tuple[int, ...]]:
    """A big.LITTLE machine's two kinds of core (``little``, and the others of its ``cores``),
    with the thread counts to time each at: ``threads`` capped at its cores, and 1 (the big
    cores' counts come second). ``given``: where ``little`` came from, for the error.

    Raises:
        AutodiceError: cores the machine does not let us use, or no big core left.
    """
    big = tuple(c for c in cores if c not in little)
    if not set(little) <= set(cores) or not big:
        raise AutodiceError(f"{given} {format_cores(little)}: the little cores must be some, "
                            f"not all, of the measuring machine's cores {format_cores(cores)}")
    def capped(n: int) -> tuple[int, ...]:
        return tuple(sorted({1} | {min(t, n) for t in threads}))

    return LittleCores(tuple(sorted(little)), big, capped(len(little))), capped(len(big))
