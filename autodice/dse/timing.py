"""What a cost is computed from: layer latencies per resource, link figures and power per host.

:class:`Timing` turns a platform and its profiles into the figures the cost model
(:mod:`autodice.dse.cost`) needs: a layer's seconds on any thread count (measured, or extrapolated
with an Amdahl fit per op type for counts the profile did not measure), the bandwidth and latency
of every host pair, the corun slowdown, each layer's bytes in ncnn (weights, workspace) and the
runtime bytes of a rank process, and each board's power.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import AutodiceError, Problems
from ..core.spec import Platform, parse_platform
from .profile import MEMORY_FIELDS, Profile, load_profile

# A host pair the platform gives no figures for and no measurement covers: switched gigabit
# Ethernet, as the paper's Jetson boards use (bytes/s, one-way seconds). Said in the front's notes.
DEFAULT_LINK = (1e9 / 8, 1e-4)


# ----------------------------------------------------------------------------- thread scaling


@dataclass(frozen=True)
class AmdahlFit:
    """``a(n) = t1 - fraction * max(t1 - serial_s, 0) * (1 - 1/n)``: a layer's time on n threads."""

    serial_s: float
    fraction: float

    def time(self, t1, n):
        t1 = np.asarray(t1, dtype=float)
        return t1 - self.fraction * np.maximum(t1 - self.serial_s, 0.0) * (1.0 - 1.0 / n)


def fit_amdahl(t1, tn, n) -> AmdahlFit:
    """Fit (serial_s, fraction) to samples: a layer's time ``t1`` on 1 thread, ``tn`` on ``n``.

    Minimises the squared *relative* error, so small layers count as much as large ones (their not
    speeding up is what the fit must see). For each candidate ``serial_s`` (0 and the quantiles of
    ``t1``) the best fraction is a closed-form least-squares slope, clipped to [0, 1].
    """
    t1, tn, n = (np.asarray(a, dtype=float) for a in (t1, tn, n))
    keep = (tn > 0) & (t1 > 0) & (n > 1)
    t1, tn, n = t1[keep], tn[keep], n[keep]
    if t1.size == 0:
        return AmdahlFit(0.0, 0.0)
    y = (t1 - tn) / tn
    best = None
    for s in np.unique(np.concatenate([[0.0], np.quantile(t1, np.linspace(0, 1, 21))])):
        x = np.maximum(t1 - s, 0.0) * (1.0 - 1.0 / n) / tn
        xx = float(x @ x)
        f = min(max(float(x @ y) / xx, 0.0), 1.0) if xx > 0 else 0.0
        sse = float(((y - f * x) ** 2).sum())
        if best is None or sse < best[0] - 1e-12:
            best = (sse, float(s), f)
    return AmdahlFit(best[1], best[2])


def fit_threads(profile: Profile, little: bool = False) -> dict[str, AmdahlFit]:
    """One fit per op type from every layer measured at more than one thread count (on the
    little cores' times with ``little``); ``"*"`` is the fit over all layers, used for op types
    with no multi-thread samples."""
    samples: dict[str, list[tuple[float, float, int]]] = {}
    for lc in profile.layers:
        times = (lc.little_ms if little else lc.cpu_ms) or {}
        t1 = times.get(1)
        if t1 is None:
            continue
        for n, ms in times.items():
            if n > 1:
                samples.setdefault(lc.op, []).append((t1, ms, n))
                samples.setdefault("*", []).append((t1, ms, n))
    return {op: fit_amdahl(*zip(*s)) for op, s in sorted(samples.items())}


# ----------------------------------------------------------------------------- platform figures


@dataclass(frozen=True)
class DevicePower:
    """Watts: the board idle, each busy core on top, a busy GPU on top."""

    idle: float = 0.0
    cpu: float = 0.0
    gpu: float = 0.0


class Timing:
    """Layer latencies, link figures and power for every host of a platform.

    Args:
        platform: the devices.
        profiles: one profile for every host, or ``{host: profile}`` where the key ``None``
            (or ``"*"``) is the profile of hosts not named (boards of another kind measured apart).
        power: measured power per host, replacing the platform's ``power_*`` fields.
    Raises:
        AutodiceError: a host without a profile, a profile without 1-thread timings, host pairs
            with no link figures (every one listed).
    """

    def __init__(self, platform: Platform, profiles: Profile | Mapping[str | None, Profile],
                 power: Mapping[str, DevicePower] | None = None):
        self.platform = platform
        if isinstance(profiles, Profile):
            profiles = {None: profiles}
        default = profiles.get(None, profiles.get("*"))
        problems = Problems()
        unknown = [h for h in profiles if h not in (None, "*") and h not in platform.devices]
        for h in unknown:
            problems.add(f'profile for host "{h}": no such host in {platform.path}')
        self.profiles: dict[str, Profile] = {}
        for host in platform.devices:
            p = profiles.get(host, default)
            if p is not None:
                self.profiles[host] = p
        bare = [h for h in platform.devices if h not in self.profiles]
        if bare:
            problems.add(f"{platform.path}: no profile for {', '.join(bare)} (give --profile "
                         f"FILE, or --profile HOST=FILE per host)")
        for dev in platform.devices.values():
            if dev.slots is None:
                problems.add(f'{platform.path}: device "{dev.name}" lists no cores; the search '
                             f'needs them: "{dev.name}, cpu, slots=0-3" (say)')
        for p in {id(p): p for p in self.profiles.values()}.values():
            if 1 not in p.threads:
                problems.add(f"profile of {p.model}: no 1-thread timings (threads "
                             f"{list(p.threads)}); profile with 1 thread too")
        problems.raise_if_any()
        self._fits = {(id(p), little): fit_threads(p, little) for p in self.profiles.values()
                      for little in (False, True)}
        # A key on any of a board's little cores runs at their pace: OpenMP waits on its
        # slowest thread. Timed as big cores where the profile did not time little ones (noted).
        self.little = {h: frozenset(d.little or ()) for h, d in platform.devices.items()}
        self.little_untimed = [h for h in platform.devices
                               if self.little[h] and not self.profiles[h].little]
        # (cores, slowdown) of each host's profile; (1, 1.0) where it was not measured. A
        # slowdown measured below 1 is noise: busy neighbours do not speed a core up.
        self.corun = {h: (p.corun.cores, max(p.corun.slowdown, 1.0)) if p.corun else (1, 1.0)
                      for h, p in self.profiles.items()}
        self.runtime_bytes = {h: p.runtime_bytes or 0 for h, p in self.profiles.items()}
        # (upload bytes/s, s, download bytes/s, s) of each host's GPU copies; free where the
        # profile measured none (then there are no GPU timings either, and no GPU ranks).
        self.gpu_copies = {h: (p.gpu.upload.bandwidth, p.gpu.upload.latency,
                               p.gpu.download.bandwidth, p.gpu.download.latency)
                           if p.gpu else (np.inf, 0.0, np.inf, 0.0)
                           for h, p in self.profiles.items()}
        self._layers = {id(p): {lc.name: lc for lc in p.layers} for p in self.profiles.values()}
        self.notes: list[str] = []
        if self.little_untimed:
            self.notes.append(f"{platform.path}: {', '.join(self.little_untimed)} name little= "
                              "cores, and their profile has no times on them: keys there are "
                              "timed as big cores (profile with --on HOST, or --little)")
        self.links = self._links(problems)
        problems.raise_if_any()
        self.power = {}
        for host, dev in platform.devices.items():
            if power and host in power:
                self.power[host] = power[host]
                continue
            self.power[host] = DevicePower(dev.power_idle or 0.0, dev.power_cpu or 0.0,
                                           dev.power_gpu or 0.0)
        missing = [h for h, d in platform.devices.items()
                   if not (power and h in power) and d.power_idle is None and d.power_cpu is None]
        if missing:
            self.notes.append(f"{platform.path}: no power fields for {', '.join(missing)}; "
                              f"their energy counts 0 W")

    def _links(self, problems: Problems) -> dict[tuple[str, str], tuple[float, float]]:
        no_shm = [h for h in self.platform.devices if "shm" not in self.profiles[h].links]
        if no_shm:
            problems.add(f"profile of {', '.join(no_shm)}: no \"shm\" link (ranks on one host); "
                         "profile again")
        links, note = host_links(self.platform, self.profiles)
        self.notes += [note] if note else []
        return links

    def has_gpu_timings(self, host: str, names) -> bool:
        layers = self._layers[id(self.profiles[host])]
        return all(n in layers and layers[n].gpu_ms is not None for n in names)

    def has_int8_timings(self, host: str, names, little: bool = False) -> bool:
        """Whether the profile of ``host`` timed ``names`` in int8 (on its little cores with
        ``little``)."""
        layers = self._layers[id(self.profiles[host])]
        field = "little_int8_ms" if little else "int8_ms"
        return all(n in layers and getattr(layers[n], field) is not None for n in names)

    def missing_layers(self, host: str, names) -> list[str]:
        layers = self._layers[id(self.profiles[host])]
        return [n for n in names if n not in layers]

    def on_little(self, host: str, cores) -> bool:
        """Whether a key on these ``cores`` of ``host`` runs at its little cores' pace."""
        return bool(self.little[host] & set(cores))

    def seconds(self, host: str, names, threads: int | None,
                little: bool = False, int8: bool = False) -> np.ndarray:
        """Latency of each layer on ``host``: on ``threads`` cores (its little ones with
        ``little``, where the profile timed them; quantized with ``int8``, where it timed that),
        or on its GPU when None.

        Raises:
            AutodiceError: layers the profile does not know, or no GPU timings for a GPU rank.
        """
        p = self.profiles[host]
        layers = self._layers[id(p)]
        missing = [n for n in names if n not in layers]
        if missing:
            raise AutodiceError(f"profile of {p.model} (host {host}): {len(missing)} layers are "
                                f"not in it, e.g. \"{missing[0]}\"; profile this model")
        little = little and p.little is not None
        fits = self._fits[id(p), little]
        out = np.empty(len(names))
        for k, name in enumerate(names):
            lc = layers[name]
            if threads is None:
                if lc.gpu_ms is None:
                    raise AutodiceError(f'profile of {p.model}: layer "{name}" has no GPU '
                                        f"timing; profile on a board with the GPU")
                out[k] = lc.gpu_ms / 1e3
                continue
            quantized = lc.little_int8_ms if little else lc.int8_ms
            times = (quantized if int8 and quantized is not None else
                     lc.little_ms if little else lc.cpu_ms)
            ms = times.get(threads)
            if ms is None:
                m = max(n for n in times if n <= threads)
                fit = fits.get(lc.op, fits.get("*", AmdahlFit(0.0, 0.0)))
                t1 = times[1]
                base = float(fit.time(t1, m))
                ms = times[m] * (float(fit.time(t1, threads)) / base if base > 0 else 1.0)
            out[k] = ms / 1e3
        return out

    def memory_bytes(self, host: str, names, onnx_bytes,
                     int8: bool = False) -> tuple[np.ndarray, ...]:
        """(loaded, resident, workspace) heap bytes of each layer in ncnn on ``host``
        (:mod:`autodice.dse.profile`; loaded and resident quantized with ``int8``, where the
        profile measured them). Where the profile did not measure them (an older autodice's: its
        ``runtime_bytes`` holds the repacking and workspace), the layer's ONNX weight bytes
        ``onnx_bytes`` stay as they are: resident, and nothing more."""
        layers = self._layers[id(self.profiles[host])]
        got = [layers[n] for n in names]
        onnx = np.asarray(onnx_bytes, dtype=float).reshape(len(got))
        measured = np.array([lc.resident_bytes is not None for lc in got], dtype=bool)
        loaded, resident, workspace = (np.array([getattr(lc, k) or 0 for lc in got], dtype=float)
                                       for k in MEMORY_FIELDS)
        if int8:
            resident = np.array([lc.resident_bytes if lc.int8_resident_bytes is None
                                 else lc.int8_resident_bytes for lc in got], dtype=float)
            loaded = np.array([(lc.loaded_bytes or 0) if lc.int8_loaded_bytes is None
                               else lc.int8_loaded_bytes for lc in got], dtype=float)
        return (np.where(measured, loaded, 0.0), np.where(measured, resident, onnx),
                np.where(measured, workspace, 0.0))

    def transfer(self, a: str, b: str, nbytes) -> np.ndarray:
        bw, lat = self.links[a, b]
        return np.asarray(nbytes, dtype=float) / bw + lat


def host_links(platform: Platform, profiles: Mapping[str, Profile]
               ) -> tuple[dict[tuple[str, str], tuple[float, float]], str]:
    """(bandwidth bytes/s, latency s) for every ordered pair of ``platform``'s hosts, and a
    note naming the pairs assumed (or ""). A link a profile measured; else the platform file's
    bandwidth= and latency= of the two devices (the slower bandwidth, both latencies); else
    :data:`DEFAULT_LINK`. On the diagonal the host's own profile's ``shm`` (a board's memory
    is its own: another board's would be wrong), where it has one."""
    merged = {}
    for p in profiles.values():
        for k, v in p.links.items():
            merged.setdefault(k, v)
    hosts = list(platform.devices)
    links = {}
    assumed: list[str] = []
    for a in hosts:
        for b in hosts:
            if a == b:
                shm = profiles[a].links.get("shm")
                if shm is not None:
                    links[a, b] = (shm.bandwidth, shm.latency)
                continue
            if hosts.index(b) < hosts.index(a):
                if (b, a) in links:
                    links[a, b] = links[b, a]
                continue
            got = merged.get("-".join(sorted((a, b))))
            if got is not None:
                links[a, b] = (got.bandwidth, got.latency)
                continue
            da, db = platform.devices[a], platform.devices[b]
            bws = [d.bandwidth for d in (da, db) if d.bandwidth]
            if not bws:
                assumed.append(f"{a}-{b}")
                links[a, b] = DEFAULT_LINK
                continue
            links[a, b] = (min(bws), (da.latency or 0.0) + (db.latency or 0.0))
    note = (f"{platform.path}: no bandwidth for {', '.join(assumed)}: assumed "
            f"{DEFAULT_LINK[0] * 8 / 1e9:g} Gbit/s Ethernet with {DEFAULT_LINK[1] * 1e3:g} ms "
            "latency (the paper's boards); add bandwidth=/latency= to platform.txt or "
            "measure the links with `autodice profile --inventory`") if assumed else ""
    return links, note


def make_timing(platform: str | Path | Platform, profile: str | Path | Profile |
                Mapping[str | None, str | Path | Profile],
                power: Mapping[str, DevicePower] | None = None) -> Timing:
    """A :class:`Timing` from paths or objects (profile paths may be a ``{host: path}`` dict)."""
    if not isinstance(platform, Platform):
        platform = parse_platform(platform)
    if isinstance(profile, (str, Path)):
        profile = load_profile(profile)
    elif isinstance(profile, Mapping):
        profile = {h: load_profile(p) if isinstance(p, (str, Path)) else p
                   for h, p in profile.items()}
    return Timing(platform, profile, power)
