"""The resources a layer can be given in the search, and their mapping keys.

Per device: one core, all cores, all but the first (so a device whose first core runs one rank
can run a second on the rest), and the GPU where the profile timed it. These are the columns of
:class:`~autodice.dse.cost_model.CostModel` and the alphabet of the search's genes.

Where the profile timed layers quantized (``profile --int8``), each CPU slot has an int8 twin
(a board's little cores too, where the profile timed them quantized): the same key and cores,
its layers at their int8 times and bytes. The twins
come after every other slot; the genes choose between a slot and its twin per group of cores
(:mod:`autodice.dse.genes`), so one key is never both.

A board with big and little cores (``little=`` in platform.txt) offers those three on each kind
apart, as two groups: a key that holds both runs at the little cores' pace (OpenMP waits on its
slowest thread), so the search never proposes one. A mapping written by hand still may.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..core.mapping import cpu_key
from .timing import Timing

KINDS = ("one", "all", "rest", "gpu")


@dataclass(frozen=True)
class Slot:
    """A resource a layer can be given: one of a device's cores, all of them, all but the first
    (when another rank has the first), or its GPU."""

    key: str
    host: str
    dev: int  # the platform's device
    kind: str  # one of KINDS
    cores: tuple[int, ...]
    threads: int  # CPU threads (1 for the GPU)
    gpu: bool
    group: int = 0  # the cores one/all/rest choose among: a device's, or one kind of its cores
    #                 (a GPU: its device's first)
    little: bool = False  # on a board's little cores
    int8: bool = False  # its layers quantized (gen --precision KEY=int8)

    def resources(self) -> set[tuple[str, object]]:
        """What of its host it takes: (host, core) for each core, or (host, "gpu")."""
        return {(self.host, "gpu")} if self.gpu else {(self.host, c) for c in self.cores}


def candidate_slots(timing: Timing, names) -> tuple[Slot, ...]:
    """Every resource of every device (``rest`` only where a group has 2+ cores, ``gpu`` only
    where the platform has one and the profile timed it)."""
    slots = []
    group = 0
    for d, (host, dev) in enumerate(timing.platform.devices.items()):
        first, little = group, set(dev.little or ())
        for on_little in (False, True):
            cores = tuple(c for c in dev.slots if (c in little) == on_little)
            if not cores:
                continue
            ways = [("one", cores[:1])] + ([("all", cores), ("rest", cores[1:])]
                                            if len(cores) > 1 else [])
            slots += [Slot(cpu_key(host, dev.arch, cs), host, d, kind, cs, len(cs), False,
                           group, on_little) for kind, cs in ways]
            group += 1
        if dev.gpu is not None and timing.has_gpu_timings(host, names):
            slots.append(Slot(f"{host}_gpu", host, d, "gpu", (), 1, True, first))
    twins = [replace(s, int8=True) for s in slots
             if not s.gpu and timing.has_int8_timings(s.host, names, s.little)]
    return tuple(slots + twins)
