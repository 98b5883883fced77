"""Power as a host reports it, so a run's joules per frame are measured, never made up.

The sensors, looked for in this order in a host's files (:mod:`.host_files`: this machine's, a
deployed board's copy, or a test's tree in the same formats):

- **powercap/RAPL** (x86): ``class/powercap/intel-rapl:N/energy_uj`` under sysfs, a counter of
  microjoules per zone that wraps at ``max_energy_range_uj``. The ``psys`` zone (the whole
  platform) where there is one, else the packages summed. Reading it may need root (the
  kernel made ``energy_uj`` root-only in 2020): unreadable is no sensor.
- **hwmon**: ``class/hwmon/hwmonN/``, power in ``power*_input`` or ``power*_average``
  (microwatts), or a rail's voltage ``in*_input`` (mV) and current ``curr*_input`` (mA): the
  INA3221 of Jetson boards (``name`` ina3221, rails labelled in ``in*_label``). The board's
  input rail (``VDD_IN``) alone where labelled, else every rail summed.
- **Raspberry Pi 5's PMIC**: ``vcgencmd pmic_read_adc``, each rail's current (``NAME_A ...=
  0.12A``) and voltage (``NAME_V ...=0.85V``); the rails' V x I summed, which leaves out the
  PMIC's own conversion losses (the name says so).

A counter gives energy itself; a power reading is sampled as results come and integrated
(trapezoids). :class:`EnergyMeter` does either.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .host_files import HostFiles, here

NO_SENSOR = "no sensor (no readable RAPL, hwmon power or Pi 5 PMIC)"


@dataclass(frozen=True)
class Sensor:
    name: str  # what was read, e.g. "rapl:psys", "hwmon:ina3221 VDD_IN", "pmic:vcgencmd"
    counter: bool  # True: read() is joules so far (never falling); False: watts now
    read: Callable[[], float]


def _number(path: Path) -> float:
    return float(path.read_text().split()[0])


class _Rapl:
    """RAPL zones' counters as joules since the first read, each zone's wraps added."""

    def __init__(self, zones: list[Path]):
        self.zones = zones
        self.wrap = [_number(z / "max_energy_range_uj") if (z / "max_energy_range_uj").exists()
                     else 0.0 for z in zones]
        self.last = [_number(z / "energy_uj") for z in zones]
        self.total = 0.0  # microjoules

    def __call__(self) -> float:
        for k, z in enumerate(self.zones):
            now = _number(z / "energy_uj")
            self.total += now - self.last[k] if now >= self.last[k] else \
                now + self.wrap[k] - self.last[k]
            self.last[k] = now
        return self.total / 1e6


def rapl(files: HostFiles) -> Sensor | None:
    """The platform's or the packages' energy counters, if readable."""
    zones = sorted(p for p in (files.sys / "class/powercap").glob("intel-rapl:*")
                   if p.name.count(":") == 1)
    try:
        named = {(z / "name").read_text().strip(): z for z in zones}
        chosen = [named["psys"]] if "psys" in named else \
            [z for n, z in named.items() if n.startswith("package")]
        counter = _Rapl(chosen) if chosen else None  # reads each once: root-only is OSError
    except (OSError, ValueError):
        return None
    if counter is None:
        return None
    return Sensor("rapl:" + "+".join(n for n, z in named.items() if z in chosen), True, counter)


def hwmon(files: HostFiles) -> Sensor | None:
    """A hwmon device that reports power, or a rail's voltage and current."""
    for dev in sorted((files.sys / "class/hwmon").glob("hwmon*")):
        try:
            chip = (dev / "name").read_text().strip()
        except OSError:
            continue
        watts = sorted(dev.glob("power*_input")) or sorted(dev.glob("power*_average"))
        if watts:
            files = watts
            return Sensor(f"hwmon:{chip}", False,
                          lambda files=files: sum(_number(f) for f in files) / 1e6)
        rails = []
        for volts in sorted(dev.glob("in*_input")):
            k = volts.name[2:-len("_input")]
            amps = dev / f"curr{k}_input"
            if amps.exists():
                label = dev / f"in{k}_label"
                rails.append((label.read_text().strip() if label.exists() else f"in{k}",
                              volts, amps))
        if not rails:
            continue
        used = [r for r in rails if r[0] == "VDD_IN"] or rails

        def read(used=used) -> float:  # mV x mA: microwatts
            return sum(_number(v) * _number(a) for _, v, a in used) / 1e6

        try:
            read()  # readable now, or no sensor
        except (OSError, ValueError):
            continue
        return Sensor(f"hwmon:{chip} {'+'.join(r[0] for r in used)}", False, read)
    return None


_RAIL = re.compile(r"^\s*(\w+)_([AV])\b[^=\n]*=\s*([0-9.]+)\s*[AV]?\s*$", re.M)


def parse_pmic(text: str) -> float | None:
    """Watts: the rails of ``vcgencmd pmic_read_adc``'s output, V x I summed over the rails
    that have both (None if none has)."""
    amps, volts = {}, {}
    for name, unit, value in _RAIL.findall(text):
        (amps if unit == "A" else volts)[name] = float(value)
    both = sorted(set(amps) & set(volts))
    return sum(amps[r] * volts[r] for r in both) if both else None


def pmic(files: HostFiles) -> Sensor | None:
    """A Raspberry Pi 5's PMIC through vcgencmd, if it answers with rails."""

    def read() -> float:
        watts = parse_pmic(files.vcgencmd("pmic_read_adc") or "")
        if watts is None:
            raise OSError("vcgencmd pmic_read_adc gave no rails")
        return watts

    try:
        read()
    except OSError:
        return None
    return Sensor("pmic:vcgencmd (rails summed, PMIC losses left out)", False, read)


def find_sensor(files: HostFiles | None = None) -> Sensor | None:
    """A host's sensor (see the module docstring; this machine's unless ``files``), or None."""
    files = files or here()
    return rapl(files) or hwmon(files) or pmic(files)


class EnergyMeter:
    """Joules from the first :meth:`sample` to the last: a counter's difference, or power
    integrated over the samples, with the frames delivered in between. Samples closer than
    ``every_s`` to the last are skipped, so a caller may sample at each result."""

    def __init__(self, sensor: Sensor | None, every_s: float = 0.2, clock=time.monotonic):
        self.sensor, self.every_s, self._clock = sensor, every_s, clock
        self.joules = self.seconds = 0.0
        self.frames = 0  # delivered between the first sample and the last
        self.watts: float | None = None  # the latest reading's (a counter: since the one before)
        self._last: tuple[float, float, int] | None = None  # time, reading, frames

    def sample(self, frames: int) -> None:
        """A reading now, ``frames`` delivered so far (skipped if the last is too recent)."""
        if self.sensor is None:
            return
        now = self._clock()
        if self._last is not None and now - self._last[0] < self.every_s:
            return
        try:
            value = self.sensor.read()
        except (OSError, ValueError):  # vcgencmd's failures come as None, then OSError
            return  # a reading missed makes a longer step, not a made-up one
        if self._last is not None:
            t0, v0, f0 = self._last
            step = value - v0 if self.sensor.counter else (value + v0) / 2 * (now - t0)
            self.joules += step
            self.seconds += now - t0
            self.frames += frames - f0
            if self.sensor.counter and now > t0:
                self.watts = step / (now - t0)
        if not self.sensor.counter:
            self.watts = value
        self._last = (now, value, frames)

    def report(self, frames: int | None = None, busy_s: float | None = None) -> dict:
        """What stats.json says of this host's energy (``sensor`` None: there is none).

        ``frames``, ``busy_s``: where the samples did not count the frames (a job's own loop,
        metered from its start), how many frames and the seconds they took. The job's start and
        its models' loading are metered too but no frame's: a frame's energy is then the mean
        power over the whole metering times its own time (``busy_s / frames``)."""
        if self.sensor is None:
            return {"sensor": None, "note": NO_SENSOR}
        frames = self.frames if frames is None else frames
        watts = self.joules / self.seconds if self.seconds > 0 else self.watts
        per_frame = None
        if frames and self.seconds > 0:
            per_frame = self.joules / frames if busy_s is None else watts * busy_s / frames
        return {"sensor": self.sensor.name, "joules": self.joules, "seconds": self.seconds,
                "frames": frames, "watts": watts, "joules_per_frame": per_frame}
