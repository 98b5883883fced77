"""``platform.txt``: the devices, one of the two hand-written inputs (:mod:`.mapping` reads the
other), and the units and core lists its fields are written in.

platform.txt, one device per line (``#`` starts a comment)::

    edge01, arm, slots=0-5, gpu=NVIDIAVolta (CUDA), mem=8GB
    edge04, x86, slots=0-11, gpu=AMDRX6800 (VULKAN), bandwidth=1gbit

The original AutoDiCE tool's files work as they are: arch ``cpu`` (whatever the host is, found
when building there), ``gpu=none (none)`` (no GPU), and a line holding only a host name (its
cores are the ones the mapping's keys name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .errors import Problems, did_you_mean, read_text

ARCHS = ("arm", "x86", "cpu")  # cpu: the host's own, resolved where it is built
ARCH_SPELLINGS = {"aarch64": "arm", "arm64": "arm", "armv7l": "arm", "x86_64": "x86",
                   "amd64": "x86"}  # what uname -m says

# Host names: what platform.txt accepts, and all that plan.json, rankfiles and ssh may carry.
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

# A line of AutoDiCE's own platform.txt: "nx01", or "tx01:192.168.178.66" in an early version.
_BARE_HOST = re.compile(rf"({HOST_NAME.pattern})(?::[A-Za-z0-9_.:-]+)?")

_SIZE_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_RATE_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8,
               "b/s": 1, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def _number(value: str, units: dict[str, float], default_unit: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z/]*)\s*", value)
    if not m or m.group(2).lower() not in units and not (m.group(2) == "" and default_unit):
        raise ValueError(f"expected a number with a unit ({', '.join(u for u in units if u)})")
    return float(m.group(1)) * units[m.group(2).lower() or default_unit]


def parse_bytes(value: str) -> float:
    """``"1GB"``, ``"512MiB"``, ``"4000"`` -> bytes.

    Raises:
        ValueError: not a number with a size unit.
    """
    return _number(value, _SIZE_UNITS, "b")


def parse_rate(value: str) -> float:
    """``"1gbit"``, ``"100mbit"``, ``"12MB/s"`` -> bytes per second.

    Raises:
        ValueError: not a number with a rate unit.
    """
    return _number(value, _RATE_UNITS, "")


def _watts(value: str) -> float:
    return _number(value, {"w": 1.0, "mw": 1e-3}, "w")


def _machine(value: str) -> str:
    if not value:
        raise ValueError("empty: name the machine these hosts share")
    return value


def _positive(parse):
    """``parse``, refusing 0: a board with no memory or a link with no bandwidth is a typo, and
    the cost model would divide by it."""
    def checked(value: str) -> float:
        number = parse(value)
        if not number > 0:
            raise ValueError("must be more than 0")
        return number
    return checked


# Core numbers past this are a typo or an attack, not a board: a range such as 0-9999999999 would
# otherwise become a list of ten billion numbers (MemoryError) before anything could refuse it.
MAX_CORE = 4095


def parse_cores(text: str) -> tuple[int, ...]:
    """``"0-5"`` / ``"1,3,5"`` / ``"0-3;6"`` -> cores in order; duplicates are an error.

    Raises:
        ValueError: not a core list, a range that runs backwards, a core named twice, or a core
            number past :data:`MAX_CORE`.
    """
    cores: list[int] = []
    for part in re.split(r"[,;]", text):
        m = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", part)
        if not m:
            raise ValueError(f'"{text}" is not a core list such as 0-5 or 1,3,5')
        for number in m.groups():
            if number and (len(number) > 6 or int(number) > MAX_CORE):
                shown = number if len(number) <= 30 else number[:27] + "..."
                raise ValueError(f"core {shown} is past {MAX_CORE} (cores are numbered from 0; "
                                 f"autodice handles up to {MAX_CORE + 1} per host)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f'range "{part.strip()}" runs backwards')
        cores.extend(range(lo, hi + 1))
    if len(set(cores)) != len(cores):
        raise ValueError(f'"{text}" names a core twice')
    return tuple(cores)


def format_cores(cores: tuple[int, ...]) -> str:
    """``(0, 1, 2, 5)`` -> ``"0-2,5"``: :func:`parse_cores` read backwards."""
    out, start = [], None
    for i, c in enumerate(cores):
        if start is None:
            start = c
        if i + 1 == len(cores) or cores[i + 1] != c + 1:
            out.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return ",".join(out)


@dataclass(frozen=True)
class Device:
    """One line of platform.txt. Optional figures are None when the line leaves them out."""

    name: str
    arch: str
    slots: tuple[int, ...] | None  # None: a bare host-name line; the keys name the cores
    gpu: str | None = None  # model, e.g. "NVIDIAVolta"
    gpu_api: str | None = None  # "CUDA", "VULKAN", ...
    mem: float | None = None  # bytes of RAM
    gpu_mem: float | None = None  # bytes of dedicated GPU memory (None: shared with the CPU)
    power_idle: float | None = None  # watts, whole board idle
    power_cpu: float | None = None  # watts added per busy core
    power_gpu: float | None = None  # watts added while the GPU is busy
    bandwidth: float | None = None  # bytes/s of its network link
    latency: float | None = None  # seconds, one way
    machine: str | None = None  # hosts naming one machine share its caches and memory
    little: tuple[int, ...] | None = None  # the slower cores of a board with two kinds

    def mixes(self, cores) -> bool:
        """Whether ``cores`` (a key's) hold cores of both kinds: OpenMP then waits on the
        little ones."""
        little = set(self.little or ())
        return bool(little & set(cores)) and bool(set(cores) - little)


# Field name -> (parser, help). Keeping them as data makes the error message list itself.
FIELDS = {
    "slots": (parse_cores, "cores, e.g. 0-5"),
    "gpu": (str, 'model and API, e.g. "NVIDIAVolta (CUDA)"'),
    "mem": (_positive(lambda v: _number(v, _SIZE_UNITS, "b")), "RAM, e.g. 8GB"),
    "gpu_mem": (_positive(lambda v: _number(v, _SIZE_UNITS, "b")),
                "dedicated GPU memory, e.g. 16GB"),
    "power_idle": (_watts, "idle board power, e.g. 2.5W"),
    "power_cpu": (_watts, "extra power per busy core, e.g. 1.2W"),
    "power_gpu": (_watts, "extra power of a busy GPU, e.g. 10W"),
    "bandwidth": (_positive(parse_rate),
                  "link rate, e.g. 1gbit or 100MB/s"),
    "latency": (lambda v: _number(v, _TIME_UNITS, "s"), "one-way link latency, e.g. 0.2ms"),
    "machine": (_machine, "the machine hosts share, e.g. vm1 for emulated or containerised "
                          "hosts"),
    "little": (parse_cores, "the slower cores of a board with two kinds, e.g. 0-3 (an "
                            "RK3588's Cortex-A55s)"),
}


@dataclass(frozen=True)
class Platform:
    path: str
    devices: dict[str, Device]  # in file order


def parse_platform(path: str | Path) -> Platform:
    """Parse platform.txt.

    Raises:
        AutodiceError: one line per bad line or field, all at once.
    """
    return parse_platform_text(read_text(path), str(path))


def parse_platform_text(text: str, path: str = "platform.txt") -> Platform:
    problems = Problems()
    devices: dict[str, Device] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{lineno}"
        parts = _split_fields(line)
        # AutoDiCE's own platform.txt: one host name per line (an early version added
        # ":address", which is inventory.toml's business here)
        bare = _BARE_HOST.fullmatch(line) if len(parts) == 1 else None
        if bare:
            host = bare.group(1)
            if host in devices:
                problems.add(f'{where}: device "{host}" is defined twice')
            else:
                devices[host] = Device(host, "cpu", None)
            continue
        if len(parts) < 3:
            problems.add(f'{where}: expected "name, arch, slots=..." but got "{line}"')
            continue
        name, arch, fields = parts[0], parts[1].lower(), parts[2:]
        arch = ARCH_SPELLINGS.get(arch, arch)
        if not HOST_NAME.fullmatch(name):
            problems.add(f'{where}: device name "{name}" must be letters, digits, "_", "." or "-"')
            continue
        if name in devices:
            problems.add(f'{where}: device "{name}" is defined twice')
            continue
        if arch not in ARCHS:
            problems.add(f'{where}: device "{name}": arch "{parts[1]}" is not one of '
                         f'{", ".join(ARCHS)}{did_you_mean(arch, ARCHS)}')
        values: dict = {}
        given: set[str] = set()
        for entry in fields:
            key, eq, value = entry.partition("=")
            key = key.strip()
            if eq and key in given:
                problems.add(f'{where}: device "{name}": field "{key}" is given twice')
                continue
            given.add(key)
            if not eq or key not in FIELDS:
                known = ", ".join(f"{k} ({h})" for k, (_, h) in FIELDS.items())
                problems.add(f'{where}: device "{name}": unknown field "{entry}"'
                             f"{did_you_mean(key, FIELDS)}; known fields: {known}")
                continue
            try:
                values[key] = FIELDS[key][0](value.strip())
            except ValueError as e:
                problems.add(f'{where}: device "{name}": {key}={value.strip()}: {e}')
        if "slots" not in values and not any(f.strip().startswith("slots") for f in fields):
            problems.add(f'{where}: device "{name}": slots=... is required')
            continue
        gpu = values.pop("gpu", None)
        gpu_api = None
        if gpu:
            m = re.fullmatch(r"(.*?)\s*\(\s*([^)]*)\s*\)", gpu)
            gpu, gpu_api = (m.group(1), m.group(2).upper()) if m else (gpu, None)
            if gpu.lower() == "none":  # AutoDiCE writes gpu=none (none) for "no GPU"
                gpu, gpu_api = None, None
        outside = sorted(set(values.get("little") or ()) - set(values.get("slots") or ()))
        if outside and "slots" in values:
            problems.add(f'{where}: device "{name}": little={format_cores(tuple(outside))}: '
                         f"not in its slots ({format_cores(values['slots'])})")
        if "slots" in values:
            devices[name] = Device(name, arch, gpu=gpu, gpu_api=gpu_api, **values)
    if not devices and not problems:
        problems.add(f"{path}: no devices defined")
    problems.raise_if_any()
    return Platform(path, devices)


def _split_fields(line: str) -> list[str]:
    """A platform line's comma-separated parts, where a value may hold commas itself.

    ``slots=1,3,5`` is a core list: a part of digits (``3``, ``6-7``) right after a ``slots``
    (or ``little``) field continues it. Anything else stays a field of its own, and an unknown
    one is reported.
    """
    parts: list[str] = []
    for part in (p.strip() for p in line.split(",")):
        if (len(parts) > 2 and re.fullmatch(r"[0-9][0-9\s-]*", part)
                and parts[-1].partition("=")[0].strip() in ("slots", "little")):
            parts[-1] += "," + part
        else:
            parts.append(part)
    return parts

