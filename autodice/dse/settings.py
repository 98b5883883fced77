"""The search's settings, checked before any work starts.

Their own module because the files written (:mod:`.front`) and the pymoo problem (:mod:`.problem`)
record and read them while :mod:`.search` drives both: here, all three import them downward.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.errors import AutodiceError
from ..backend.wire import WIRE_SHARE
from .genes import ENCODINGS

OBJECTIVES = ("throughput", "energy", "memory")
# Far past the paper's 100 x 400, and short of a population that fills the memory or a search
# that outlives its user: a typo, not a setting.
MAX_POP, MAX_GENS = 100_000, 1_000_000


@dataclass(frozen=True)
class Settings:
    """Search settings; the defaults are the paper's.

    ``objectives`` chooses what the front trades off (the paper's three by default);
    ``max_memory`` (bytes on every device, beside each device's own ``mem``) and
    ``min_fps`` (frames/s) are constraints a point must meet to be on the front.
    """

    pop: int = 100
    gens: int = 400
    seed: int = 0
    crossover: float = 0.5  # probability that a pair of parents is crossed (two-point)
    mutation: float = 0.1  # probability that an offspring is mutated
    encoding: str = "layer"
    segments: int | None = None  # K for the segment encoding (default: number of resources, <=16)
    objectives: tuple[str, ...] = OBJECTIVES
    max_memory: float | None = None
    min_fps: float | None = None
    parallel: tuple[str, ...] = ()  # also propose stage copies ("data") and split layers
    wire: str = "fp32"  # how tensors that cross hosts are priced (gen --wire)

    def check(self) -> None:
        """Raises AutodiceError naming every bad setting at once, before any work starts."""
        bad = []
        if self.pop < 4:
            bad.append(f"--pop {self.pop}: needs at least 4")
        elif self.pop > MAX_POP:
            bad.append(f"--pop {self.pop}: at most {MAX_POP}")
        if self.gens < 1:
            bad.append(f"--gens {self.gens}: needs at least 1")
        elif self.gens > MAX_GENS:
            bad.append(f"--gens {self.gens}: at most {MAX_GENS}")
        if self.encoding not in ENCODINGS:
            bad.append(f'--encoding "{self.encoding}": one of {", ".join(ENCODINGS)}')
        for name, p in (("crossover", self.crossover), ("mutation", self.mutation)):
            if not 0 <= p <= 1:
                bad.append(f"--{name} {p}: a probability, 0..1")
        if self.seed < 0:
            bad.append(f"--seed {self.seed}: a seed is 0 or more")
        if self.segments is not None and self.segments < 1:
            bad.append(f"--segments {self.segments}: needs at least 1")
        unknown = [o for o in self.objectives if o not in OBJECTIVES]
        if unknown or not self.objectives or len(set(self.objectives)) < len(self.objectives):
            bad.append(f"--objectives {','.join(self.objectives)}: some of "
                       f"{', '.join(OBJECTIVES)}, each once")
        if self.wire not in WIRE_SHARE:
            bad.append(f"--wire {self.wire}: one of {', '.join(WIRE_SHARE)}")
        if set(self.parallel) - {"data", "horizontal"}:
            bad.append(f"--parallel {','.join(self.parallel)}: some of data, horizontal")
        for name, v in (("--max-memory", self.max_memory), ("--min-fps", self.min_fps)):
            if v is not None and not 0 < v < float("inf"):
                bad.append(f"{name} {v:g}: must be a finite number above 0")
        if bad:
            raise AutodiceError(*bad)


@dataclass(frozen=True)
class Floor:
    """An accuracy floor for the front (``dse --min-agreement``): each point that may lose
    accuracy is made as gen makes it and must agree with the whole model at least
    ``min_agreement`` on ``frames`` frames of ``source`` (images made frames by ``preprocess``):
    :mod:`.accuracy`."""
    min_agreement: float
    source: str | Path
    preprocess: str | None = None
    frames: int = 50

    @classmethod
    def asked(cls, min_agreement: float | None, source, preprocess: str | None = None,
              frames: int = 50) -> Floor | None:
        """The floor asked for (None: none), checked.

        Raises:
            AutodiceError: a floor without frames, or a bad value.
        """
        if min_agreement is None:
            return None
        if source is None:
            raise AutodiceError("--min-agreement needs --calibration SOURCE: frames like those "
                                "the model will see")
        floor = cls(min_agreement, source, preprocess, frames)
        floor.check()
        return floor

    def check(self) -> None:
        """Raises AutodiceError naming every bad value, before the search starts."""
        bad = []
        if not 0 < self.min_agreement <= 1:
            bad.append(f"--min-agreement {self.min_agreement:g}: a share, above 0 and at most 1")
        if self.frames < 1:
            bad.append(f"--agreement-frames {self.frames}: needs at least 1")
        if bad:
            raise AutodiceError(*bad)
