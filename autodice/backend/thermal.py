"""A host's temperatures, clocks and throttling, read where it exposes them, for /metrics.

A board that runs hot slows down without a word: its frames/s fall and only these figures say
why. Read at each scrape, never on a frame's path, from a host's files (:mod:`.host_files`):

- temperatures: ``class/thermal/thermal_zone*/temp`` under sysfs in millidegrees, each zone by its
  ``type`` (``cpu-thermal`` on a Pi, ``CPU-therm`` on a Jetson, ``x86_pkg_temp`` on x86);
- clocks: ``devices/system/cpu/cpu*/cpufreq/scaling_cur_freq`` in kHz;
- throttling: a Raspberry Pi's ``vcgencmd get_throttled`` (``throttled=0x50005``), whose low
  bits say what holds now and bits 16-19 what has happened since boot.
"""

from __future__ import annotations

import re

from .host_files import HostFiles

# vcgencmd get_throttled's bits, as Raspberry Pi documents them: now, and (bit + 16) since boot.
THROTTLE_BITS = {0: "under_voltage", 1: "frequency_capped", 2: "throttled",
                 3: "soft_temperature_limit"}


def temperatures(files: HostFiles) -> dict[str, float]:
    """Degrees Celsius by zone type (a type twice: ``type``, ``type_1``, ...)."""
    found: dict[str, float] = {}
    zones = (files.sys / "class/thermal").glob("thermal_zone*")
    for zone in sorted(zones, key=lambda p: int(re.sub(r"\D", "", p.name) or 0)):
        try:
            kind = (zone / "type").read_text().strip() or zone.name
            value = int((zone / "temp").read_text().split()[0]) / 1000
        except (OSError, ValueError, IndexError):
            continue  # a zone that cannot be read now (some are off while the board idles)
        name, k = kind, 0
        while name in found:
            k += 1
            name = f"{kind}_{k}"
        found[name] = value
    return found


def clocks(files: HostFiles) -> dict[int, float]:
    """Each CPU's current clock in Hz."""
    found = {}
    for f in (files.sys / "devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq"):
        try:
            found[int(f.parent.parent.name[3:])] = int(f.read_text().split()[0]) * 1e3
        except (OSError, ValueError, IndexError):
            continue
    return dict(sorted(found.items()))


def parse_throttled(text: str) -> dict[str, dict[str, bool]] | None:
    """``throttled=0x50005`` -> {"now": {...}, "since_boot": {...}} by THROTTLE_BITS."""
    m = re.search(r"throttled=0x([0-9a-fA-F]+)", text)
    if not m:
        return None
    bits = int(m.group(1), 16)
    return {"now": {name: bool(bits >> b & 1) for b, name in THROTTLE_BITS.items()},
            "since_boot": {name: bool(bits >> (b + 16) & 1) for b, name in THROTTLE_BITS.items()}}


def throttled(files: HostFiles) -> dict[str, dict[str, bool]] | None:
    """What a Raspberry Pi's firmware says of throttling; None elsewhere."""
    said = files.vcgencmd("get_throttled")
    return None if said is None else parse_throttled(said)


def host_families(hosts: list[tuple[str, HostFiles]]):
    """The figures above for each ``(host, files)`` as Prometheus families labelled ``host``
    (one family per metric, every host's samples in it); none where nothing reads."""
    from prometheus_client.core import GaugeMetricFamily

    temps = GaugeMetricFamily("autodice_host_temperature_celsius", "A thermal zone's "
                              "temperature.", labels=["host", "zone"])
    freqs = GaugeMetricFamily("autodice_host_cpu_clock_hertz", "A CPU's current clock.",
                              labels=["host", "cpu"])
    flags = GaugeMetricFamily("autodice_host_throttled", "1 where the firmware says so (a "
                              "Raspberry Pi's get_throttled).", labels=["host", "reason", "when"])
    for host, files in hosts:
        for zone, value in temperatures(files).items():
            temps.add_metric([host, zone], value)
        for cpu, hz in clocks(files).items():
            freqs.add_metric([host, str(cpu)], hz)
        for when, reasons in (throttled(files) or {}).items():
            for reason, on in reasons.items():
                flags.add_metric([host, reason, when], float(on))
    yield from (family for family in (temps, freqs, flags) if family.samples)
