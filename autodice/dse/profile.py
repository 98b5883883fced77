"""``profile.json``: what each layer costs on each resource, measured on the real engine.

The cost model (``cost.py``) and the search (``dse.py``) read only this, so a profile measured once
(on this machine, or on a board of the cluster) makes 40,000 candidate mappings cheap to score.

Format (version 1), byte-stable (sorted keys, no timestamps)::

    {
      "version": 1,
      "model": "densenet121.onnx", "model_sha256": "...",
      "engine": {"ncnn": "1.0.20261020", "build": "full", "fp16": false},
      "machine": {"arch": "x86_64", "cpu": "AMD EPYC ...", "cores": 2},
      "threads": [1, 2],                      # thread counts measured on the CPU
      "layers": [                             # every mappable layer, in execution order
        {"name": "conv1", "op": "Conv", "cpu_ms": {"1": 3.21, "2": 1.70}, "gpu_ms": null,
         "loaded_bytes": 37632, "resident_bytes": 147456, "workspace_bytes": 3211264},
        ...
      ],
      "corun": {"cores": 2, "slowdown": 1.12},  # see below; null when not measured
      "runtime_bytes": 36700160,              # a rank's resident bytes beyond its layers
      "links": {                              # bytes/s and seconds per message
        "shm": {"bandwidth": 5.1e9, "latency": 2e-6},
        "edge01-edge02": {"bandwidth": 1.18e8, "latency": 1e-4}
      },
      "gpu": {"device": "llvmpipe (LLVM 15.0.6, 256 bits)",   # null: no GPU measured
              "precision": "fp16",
              "upload": {"bandwidth": 4.3e8, "latency": 1e-4},
              "download": {"bandwidth": 5.8e8, "latency": 6e-5}},
      "little": {"cores": [4, 5, 6, 7], "big_cores": [0, 1, 2, 3],   # absent: one kind of core
                 "threads": [1, 4]}
    }

``cpu_ms`` maps a thread count to the median latency of the layer alone (batch 1, warm); ``gpu_ms``
is its latency on the Vulkan device ``gpu.device`` in ``gpu.precision`` (ncnn's default fp16
there, or fp32 where the model's values pass fp16's range, as gen would run it), the copy of its
output back to the host taken out, scaled so that the layers sum to the whole model's time on the
device, run back to back, less its input and output copies; null where no GPU was measured;
``gpu.upload`` and ``gpu.download`` cost the copies a GPU rank makes of the tensors it receives and
sends.
``little``: a board with big and little cores (an RK3588's 4 Cortex-A76 + 4 Cortex-A55) is timed
on each kind, the profiler pinned to its cores: ``cpu_ms`` on the big ones, and each layer's
``little_ms`` (thread count -> ms, at ``little.threads``) on the little ones.
``int8_ms``, ``int8_resident_bytes`` and ``int8_loaded_bytes`` (``profile --int8``; the
last absent from earlier profiles: the fp32 figure stands in), and on a board with little cores
``little_int8_ms``: the same layer quantized as
``gen --precision int8`` quantizes it (every convolution and fully connected layer int8, on the
big cores): what the search's int8 keys cost. Absent: no key is offered in int8.
``links`` always has ``shm`` (ranks on one host); other entries are host pairs (sorted names
joined by ``-``), measured on a cluster or taken from the platform's ``bandwidth``/``latency``
fields. ``corun`` is how much longer the whole model
takes on one core while all ``cores`` cores of the profiled machine run it at once (shared caches
and memory bandwidth): the cost model's contention between ranks on one board.
``resident_bytes`` is the memory a layer's weights take in ncnn once repacked (light mode drops
the file's copy): a 3x3 convolution's Winograd weights take several times its ONNX bytes, an
InnerProduct's the same. Of its large blocks only the pages written count: ncnn's x86 int8
Winograd kernel leaves about half of its block untouched, and so never resident.
``loaded_bytes`` is the most it holds beyond that while it loads: the file's copy, and the
scratch of repacking (a Winograd kernel before packing: as large again).
``workspace_bytes`` is what the layer's forward allocates beyond its output and frees again
(im2col and Winograd tiles, padded copies). Absent (profiles of older autodice, hand-written
ones): the layer's ONNX weight bytes resident, nothing more.
``runtime_bytes`` is what a rank process holds beyond its layers' weights and the plan's
activations and buffers (MPI, ncnn's code, the runtime, what malloc keeps): the peak resident memory
of a one-thread rank that ran the whole model, minus what the cost model counts for that rank
(see :mod:`autodice.dse.cost`).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.errors import AutodiceError, Problems, parse_nested, read_text

PROFILE_VERSION = 1
MEMORY_FIELDS = ("loaded_bytes", "resident_bytes", "workspace_bytes")  # of a layer, optional


@dataclass(frozen=True)
class LayerCost:
    name: str
    op: str
    cpu_ms: dict[int, float]  # threads -> median ms
    gpu_ms: float | None = None
    loaded_bytes: int | None = None  # held beyond resident while loading; None: not measured
    resident_bytes: int | None = None  # ... and once repacked
    workspace_bytes: int | None = None  # what its forward holds only while it runs
    little_ms: dict[int, float] | None = None  # threads -> median ms on the little cores
    int8_ms: dict[int, float] | None = None  # threads -> median ms, quantized (profile --int8)
    int8_resident_bytes: int | None = None  # resident_bytes, quantized
    int8_loaded_bytes: int | None = None  # loaded_bytes, quantized (None: loaded_bytes's)
    little_int8_ms: dict[int, float] | None = None  # little_ms, quantized


@dataclass(frozen=True)
class Link:
    bandwidth: float  # bytes/s
    latency: float  # s per message


def six_digits(x: float) -> float:
    """Six significant digits: stable text across runs and machines (and a fused ReLU's sliver
    of a Convolution's time stays above zero)."""
    return float(f"{float(x):.6g}")


def fit_link(nbytes: list[float], seconds: list[float]) -> tuple[Link, str | None]:
    """``seconds = latency + bytes / bandwidth`` from one-way times of several message sizes, for
    shared memory and networks alike; never fails on a busy machine, it warns.

    Give each size its fastest repetition: interference only ever adds time. Then:

    1. A message never takes longer than a larger one: each time is capped by the times of the
       larger sizes (a stall on a small message is noise, not physics).
    2. The rate is the least-squares slope over the largest messages (a quarter of the largest
       size up, at least the two largest), where neither the per-message cost nor a burst (tc
       tbf, a cloud's allowance: on an emulated 200 Mbit/s link 4 KB arrive in 15 us) nor a
       cache that holds a small message counts for much. A slope that is not positive (flat
       times: noise swamps the bytes) falls back to the largest message's own rate.
    3. The latency is what the smallest message's time leaves after its bytes at that rate, or
       all of its time when it went faster than the rate allows.

    Returns:
        The link, and a one-line warning (else None) when the line misses a measured size (the
        smallest aside: it defines the latency) by more than half: the figures are usable, but a
        quieter machine would give better ones.
    """
    x, y = np.asarray(nbytes, float), np.asarray(seconds, float)
    order = np.argsort(x)
    x, y = x[order], y[order]
    y = np.minimum.accumulate(y[::-1])[::-1]
    big = x >= x[-1] / 4
    if big.sum() < 2:
        big[-2:] = True
    slope = float(np.polyfit(x[big], y[big], 1)[0]) if len(set(x[big])) > 1 else 0.0
    if not slope * x[-1] > 1e-6 * y[-1]:  # not positive, or zero up to rounding
        slope = float(y[-1] / x[-1])
    latency = float(y[0] - x[0] * slope)
    link = Link(1.0 / slope, latency if latency > 0 else float(y[0]))
    raw = np.asarray(seconds, float)[order]
    miss = np.abs(link.latency + x * slope - raw) / raw
    worst = int(np.argmax(miss[1:])) + 1 if len(x) > 1 else 0
    if worst and miss[worst] > 0.5:
        return link, (f"link fit is poor: the line misses the {x[worst]:.0f}-byte time by "
                      f"{miss[worst]:.0%} (times {[float(f'{t:.3g}') for t in raw]} s for "
                      f"{[int(b) for b in x]} bytes); the machine was busy while measuring: "
                      "measure again on a quieter one for better figures")
    return link, None


def link_from_rows(rows: list[dict]) -> tuple[Link, str | None]:
    """:func:`fit_link` over ``profile_layers --link`` rows (``bytes``, ``seconds`` = median,
    ``min_seconds`` = fastest repetition; older rows have only the median)."""
    return fit_link([r["bytes"] for r in rows],
                    [r.get("min_seconds", r["seconds"]) for r in rows])


@dataclass(frozen=True)
class Corun:
    cores: int  # cores that ran the model at once
    slowdown: float  # 1-thread time of the whole model with all of them busy / alone


@dataclass(frozen=True)
class GpuCopies:
    """A Vulkan device's copies between host memory and the device: a GPU rank uploads what it
    receives and downloads what it sends, every frame."""

    device: str  # as ncnn names it, e.g. "NVIDIA H100 80GB HBM3" or "llvmpipe (LLVM 15.0.6...)"
    upload: Link
    download: Link
    # What gpu_ms was timed in: "fp16" (ncnn's default on a GPU) or "fp32", which gen gives a rank
    # whose values pass fp16's range (on an H100, ResNet-50 ran 3.8 ms in fp32, 2.65 in fp16).
    precision: str = "fp16"


@dataclass(frozen=True)
class LittleCores:
    """The two kinds of core of the profiled board: each layer's ``cpu_ms`` was timed pinned to
    ``big_cores``, its ``little_ms`` pinned to ``cores`` at ``threads``."""

    cores: tuple[int, ...]
    big_cores: tuple[int, ...]
    threads: tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    model: str
    model_sha256: str
    engine: dict
    machine: dict
    threads: tuple[int, ...]
    layers: tuple[LayerCost, ...]
    links: dict[str, Link] = field(default_factory=dict)
    corun: Corun | None = None
    runtime_bytes: int | None = None
    gpu: GpuCopies | None = None  # the device gpu_ms was measured on, and its copy costs
    little: LittleCores | None = None  # a big.LITTLE board's little cores, timed apart

    def layer(self, name: str) -> LayerCost:
        return {lc.name: lc for lc in self.layers}[name]

    def link(self, a: str, b: str) -> Link | None:
        """The link between hosts ``a`` and ``b`` (``shm`` when they are the same host)."""
        if a == b:
            return self.links.get("shm")
        return self.links.get("-".join(sorted((a, b))))


def profile_to_json(p: Profile) -> dict:
    return {
        "version": PROFILE_VERSION,
        "model": p.model,
        "model_sha256": p.model_sha256,
        "engine": p.engine,
        "machine": p.machine,
        "threads": list(p.threads),
        "layers": [{"name": lc.name, "op": lc.op,
                    "cpu_ms": {str(t): ms for t, ms in sorted(lc.cpu_ms.items())},
                    "gpu_ms": lc.gpu_ms,
                    **({} if lc.resident_bytes is None else
                       {"loaded_bytes": lc.loaded_bytes, "resident_bytes": lc.resident_bytes,
                        "workspace_bytes": lc.workspace_bytes}),
                    **({} if lc.little_ms is None else
                       {"little_ms": {str(t): ms for t, ms in sorted(lc.little_ms.items())}}),
                    **({} if lc.int8_ms is None else
                       {"int8_ms": {str(t): ms for t, ms in sorted(lc.int8_ms.items())},
                        "int8_resident_bytes": lc.int8_resident_bytes,
                        **({} if lc.int8_loaded_bytes is None else
                           {"int8_loaded_bytes": lc.int8_loaded_bytes}),
                        **({} if lc.little_int8_ms is None else
                           {"little_int8_ms": {str(t): ms for t, ms in
                                               sorted(lc.little_int8_ms.items())}})})}
                   for lc in p.layers],
        "links": {k: {"bandwidth": v.bandwidth, "latency": v.latency}
                  for k, v in sorted(p.links.items())},
        "corun": None if p.corun is None else {"cores": p.corun.cores,
                                               "slowdown": p.corun.slowdown},
        "runtime_bytes": p.runtime_bytes,
        "gpu": None if p.gpu is None else {
            "device": p.gpu.device, "precision": p.gpu.precision,
            "upload": {"bandwidth": p.gpu.upload.bandwidth, "latency": p.gpu.upload.latency},
            "download": {"bandwidth": p.gpu.download.bandwidth,
                         "latency": p.gpu.download.latency}},
        **({} if p.little is None else {"little": {
            "cores": list(p.little.cores), "big_cores": list(p.little.big_cores),
            "threads": list(p.little.threads)}}),
    }


def profile_from_json(d: dict, where: str = "profile.json") -> Profile:
    """The profile in the document ``d`` (read from ``where``), every figure checked: a negative
    or NaN time, a zero bandwidth or thread count would make the search divide by it or prefer
    an impossible mapping.

    Raises:
        AutodiceError: another version, missing fields, or figures out of range (all listed).
    """
    if not isinstance(d, dict):
        raise AutodiceError(f"{where}: not a profile (expected an object)")
    if d.get("version") != PROFILE_VERSION:
        raise AutodiceError(f"{where}: profile version {d.get('version')!r}, this autodice reads "
                            f"{PROFILE_VERSION}; profile the model again")
    try:
        profile = Profile(
            model=d["model"], model_sha256=d["model_sha256"], engine=d["engine"],
            machine=d["machine"], threads=tuple(int(t) for t in d["threads"]),
            layers=tuple(LayerCost(x["name"], x["op"],
                                   {int(t): float(ms) for t, ms in x["cpu_ms"].items()},
                                   None if x.get("gpu_ms") is None else float(x["gpu_ms"]),
                                   *(None if x.get(k) is None else int(x[k])
                                     for k in MEMORY_FIELDS),
                                   None if x.get("little_ms") is None else
                                   {int(t): float(ms) for t, ms in x["little_ms"].items()},
                                   None if x.get("int8_ms") is None else
                                   {int(t): float(ms) for t, ms in x["int8_ms"].items()},
                                   None if x.get("int8_resident_bytes") is None else
                                   int(x["int8_resident_bytes"]),
                                   None if x.get("int8_loaded_bytes") is None else
                                   int(x["int8_loaded_bytes"]),
                                   None if x.get("little_int8_ms") is None else
                                   {int(t): float(ms) for t, ms in
                                    x["little_int8_ms"].items()})
                         for x in d["layers"]),
            links={k: Link(float(v["bandwidth"]), float(v["latency"]))
                   for k, v in d.get("links", {}).items()},
            corun=None if d.get("corun") is None else Corun(int(d["corun"]["cores"]),
                                                              float(d["corun"]["slowdown"])),
            runtime_bytes=None if d.get("runtime_bytes") is None else int(d["runtime_bytes"]),
            gpu=None if d.get("gpu") is None else GpuCopies(
                str(d["gpu"]["device"]), Link(float(d["gpu"]["upload"]["bandwidth"]),
                                              float(d["gpu"]["upload"]["latency"])),
                Link(float(d["gpu"]["download"]["bandwidth"]),
                     float(d["gpu"]["download"]["latency"])),
                str(d["gpu"].get("precision", "fp16"))),
            little=None if d.get("little") is None else LittleCores(
                *(tuple(int(c) for c in d["little"][k])
                  for k in ("cores", "big_cores", "threads"))))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise AutodiceError(f"{where}: not a profile ({type(e).__name__}: {e})") from None
    problems = check_profile(profile, where)
    if problems:
        raise AutodiceError(*problems)
    return profile


def check_profile(p: Profile, where: str) -> list[str]:
    """Figures of ``p`` out of range, one line each (the first 20 of a kind, then a count)."""
    problems = Problems()

    def time(value) -> bool:
        return math.isfinite(value) and value >= 0

    threads_ok = bool(p.threads) and all(1 <= t <= 4096 for t in p.threads)
    if not threads_ok:
        problems.add(f"{where}: threads {list(p.threads)}: thread counts are 1 to 4096")
    for lc in p.layers:
        for t, ms in sorted(lc.cpu_ms.items()):
            if not time(ms):
                problems.add(f'{where}: layer "{lc.name}": cpu_ms "{t}" is {ms}; times are '
                             "numbers of 0 or more",
                             f"{where}: and {{n}} more layers with impossible times")
            elif threads_ok and t not in p.threads:
                problems.add(f'{where}: layer "{lc.name}": cpu_ms "{t}": {t} threads is not one '
                             f"of the profile's threads {list(p.threads)}",
                             f"{where}: and {{n}} more layers timed at other thread counts")
        got = [getattr(lc, k) for k in MEMORY_FIELDS]
        if len({b is None for b in got}) > 1 or any(b is not None and b < 0 for b in got):
            problems.add(f'{where}: layer "{lc.name}": ' + ", ".join(
                f"{k} {b}" for k, b in zip(MEMORY_FIELDS, got)) + ": all or none, 0 or more",
                f"{where}: and {{n}} more layers with impossible bytes")
        little = p.little.threads if p.little else ()
        if (lc.little_ms is None) != (p.little is None) or set(lc.little_ms or ()) != set(
                little) or not all(time(ms) for ms in (lc.little_ms or {}).values()):
            problems.add(f'{where}: layer "{lc.name}": little_ms {lc.little_ms}: times of 0 or '
                         f"more at the little cores' threads {list(little)}, on every layer "
                         "when the profile has little cores, else none",
                         f"{where}: and {{n}} more layers with impossible little-core times")
        int8 = p.layers[0].int8_ms is not None
        if (lc.int8_ms is None) == int8 or (int8 and (
                set(lc.int8_ms) != set(p.threads) or not all(map(time, lc.int8_ms.values()))
                or not (lc.int8_resident_bytes or 0) >= 0
                or not (lc.int8_loaded_bytes or 0) >= 0)):
            problems.add(f'{where}: layer "{lc.name}": int8_ms {lc.int8_ms}: times of 0 or more '
                         f"at the profile's threads {list(p.threads)} (and int8_resident_bytes), "
                         "on every layer or none",
                         f"{where}: and {{n}} more layers with impossible int8 times")
        if lc.little_int8_ms is not None and (not int8 or set(lc.little_int8_ms) != set(
                little) or not all(map(time, lc.little_int8_ms.values()))):
            problems.add(f'{where}: layer "{lc.name}": little_int8_ms {lc.little_int8_ms}: '
                         f"times of 0 or more at the little cores' threads {list(little)}, "
                         "with int8_ms",
                         f"{where}: and {{n}} more layers with impossible little int8 times")
        if lc.gpu_ms is not None and not time(lc.gpu_ms):
            problems.add(f'{where}: layer "{lc.name}": gpu_ms is {lc.gpu_ms}; times are numbers '
                         "of 0 or more", f"{where}: and {{n}} more layers with impossible times")
    for name, link in sorted(p.links.items()):
        if not (math.isfinite(link.bandwidth) and link.bandwidth > 0):
            problems.add(f'{where}: link "{name}": bandwidth {link.bandwidth} must be more than 0')
        if not time(link.latency):
            problems.add(f'{where}: link "{name}": latency {link.latency} must be 0 or more')
    if p.corun is not None and not (p.corun.cores >= 1 and math.isfinite(p.corun.slowdown)
                                    and p.corun.slowdown > 0):
        problems.add(f"{where}: corun {p.corun}: needs cores >= 1 and a slowdown above 0")
    if p.runtime_bytes is not None and p.runtime_bytes < 0:
        problems.add(f"{where}: runtime_bytes {p.runtime_bytes} must be 0 or more")
    if p.little is not None and (not p.little.cores or not p.little.threads
                                 or set(p.little.cores) & set(p.little.big_cores)
                                 or 1 not in p.little.threads):
        problems.add(f"{where}: little {p.little}: needs cores apart from big_cores, and "
                     "1-thread times")
    if p.gpu is not None and p.gpu.precision not in ("fp16", "fp32"):
        problems.add(f'{where}: gpu precision "{p.gpu.precision}": fp16 or fp32')
    return problems.lines()


def save_profile(p: Profile, path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile_to_json(p), indent=1, sort_keys=True) + "\n")


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    try:
        d = parse_nested(json.loads, read_text(path), path)
    except json.JSONDecodeError as e:
        raise AutodiceError(f"{path}: not JSON (line {e.lineno}: {e.msg})") from None
    return profile_from_json(d, str(path))


def model_sha256(path: Path) -> str:
    """sha256 of the model file, and of its external ``.data`` file when there is one."""
    h = hashlib.sha256()
    for p in (path, Path(f"{path}.data")):
        if p.exists():
            with open(p, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
    return h.hexdigest()
