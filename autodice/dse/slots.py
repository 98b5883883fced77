"""The resources a layer can be given in the search, and their mapping keys.

Per device: one core, all cores, all but the first (so a device whose first core runs one rank
can run a second on the rest), and the GPU where the profile timed it. These are the columns of
:class:`~autodice.dse.cost_model.CostModel` and the alphabet of the search's genes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.mapping import cpu_key
from .timing import Timing

KINDS = ("one", "all", "rest", "gpu")


@dataclass(frozen=True)
class Slot:
    """A resource a layer can be given: one of a device's cores, all of them, all but the first
    (when another rank has the first), or its GPU."""

    key: str
    host: str
    dev: int
    kind: str  # one of KINDS
    cores: tuple[int, ...]
    threads: int  # CPU threads (1 for the GPU)
    gpu: bool

    def resources(self) -> set[tuple[str, object]]:
        """What of its host it takes: (host, core) for each core, or (host, "gpu")."""
        return {(self.host, "gpu")} if self.gpu else {(self.host, c) for c in self.cores}


def candidate_slots(timing: Timing, names) -> tuple[Slot, ...]:
    """Every resource of every device (``rest`` only where a device has 2+ cores, ``gpu`` only
    where the platform has one and the profile timed it)."""
    slots = []
    for d, (host, dev) in enumerate(timing.platform.devices.items()):
        cores = dev.slots
        slots.append(Slot(cpu_key(host, dev.arch, cores[:1]), host, d, "one", cores[:1], 1, False))
        if len(cores) > 1:
            slots.append(Slot(cpu_key(host, dev.arch, cores), host, d, "all", cores, len(cores),
                              False))
            slots.append(Slot(cpu_key(host, dev.arch, cores[1:]), host, d, "rest", cores[1:],
                              len(cores) - 1, False))
        if dev.gpu is not None and timing.has_gpu_timings(host, names):
            slots.append(Slot(f"{host}_gpu", host, d, "gpu", (), 1, True))
    return tuple(slots)
