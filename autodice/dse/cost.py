"""Predicted throughput, memory and energy of a mapping: one model for the compiler and the search.

The AutoDiCE paper scored every candidate mapping on the real boards, which does not scale past a
few hundred candidates. Here a candidate is scored from ``profile.json`` (what each layer costs on
each resource, measured once on the real engine) and the platform's figures, so NSGA-II can afford
its 40,000 evaluations; ``dse --measure`` then runs some front points for real to prove the model.

The model, per frame (batch 1) in the steady state of the pipelined program, where rank k works
on frame i while rank k+1 works on frame i-1:

* **compute** ``c_r`` = sum over rank r's layers of the layer's latency on r's resource: the
  profile's median at that thread count (or on the GPU). For a thread count the profile did not
  measure, an Amdahl fit per op type extrapolates from the largest measured count ``m`` below it:
  ``t(n) = t(m) * a(n) / a(m)`` with ``a(n) = t1 - f * max(t1 - s, 0) * (1 - 1/n)``. ``s`` is the
  serial time a layer of that op type always pays (a layer shorter than ``s`` does not speed up
  at all: small layers do not scale on 6 cores) and ``f`` the parallel fraction of the rest;
  both are least-squares fits (relative error) over every layer and measured thread count.
* **contention**: per-layer times were taken with the rest of the machine idle, but a pipelined
  stage computes while the other ranks of its board compute too, sharing caches and memory
  bandwidth. The profile measured how much slower the whole model runs on one core with every
  core busy; a rank's compute (and span) stretches by that factor, scaled by how many of its
  board's other cores the other ranks keep busy (see :func:`contention`).
* **transfer** of a cut tensor from rank a to rank b: ``bytes / bandwidth + latency``. Ranks on
  one host use the profile's ``shm`` link; other pairs the profile's measured host pair, else the
  platform's fields (a message crosses both hosts' links: the slower ``bandwidth``, the two
  ``latency`` values added -- as the profiler writes host pairs). A tensor sent to two ranks is
  two messages, as in the plan.
* **communication** ``m_r`` = the transfers r sends plus those it receives: MPI moves a message
  only while both ends are inside MPI calls, so a transfer occupies both.
* **stage** ``s_r = c_r + m_r``. Each host's network interface is a stage too: its egress and its
  ingress are busy for the sum of its inter-host transfers (ranks on one board share one NIC).
* **round trips**: a rank runs its layers for one frame in order and cannot start the next frame
  before its last layer. When its data goes to other ranks and comes back within the frame
  (a "ping-pong" mapping: A -> B -> A), it waits for the detour. Its *span* is the longest path,
  through the frame's layer graph (layer latencies on their ranks, transfers between ranks, each
  rank's layers in order), from its first layer to its last; without round trips the span is its
  compute.
* **throughput** = 1 / period, period = the largest stage, span or NIC time.
* **memory** of rank r = parameters + peak live activations + receive and send buffers, exactly
  the plan's static memory table (``Rank.memory``), plus what the profile measured a rank
  process to hold beyond that table (``runtime_bytes``: MPI, ncnn's code, repacked weights and
  workspace, the runtime; tens of MB, more than a small model's weights, paid once per rank).
  A GPU rank holds its weights twice: ncnn loads them on the host and uploads a copy, so on a
  shared-memory board (no ``gpu_mem``; the paper measured this on Jetsons) both copies are RAM;
  with dedicated ``gpu_mem`` the GPU holds weights and activations and RAM the host copy and
  buffers. Device memory = the sum over its
  ranks; the constraint is RAM <= ``mem`` and GPU part <= ``gpu_mem``.
* **energy** per frame of device d = ``power_idle * period`` (the board is on all the time) +
  ``power_cpu * threads * c_r`` per CPU rank + ``power_gpu * c_r`` per GPU rank +
  ``power_cpu * m_r`` per rank (one core drives its transfers). A device the mapping does not use
  is not part of the system. Measured power replaces the platform's fields through ``power=``.

Ranks are ordered by their first layer (topological order), which is the key order of the mapping
files the search writes and therefore the plan's rank order.

Speed: everything that depends only on (model, platform, profile) is precomputed once into numpy
arrays (layer x resource latencies, tensor sizes and uses, weight owners); a whole population of
candidates is then scored with a handful of ``bincount``/``maximum.at`` calls and one cumulative
sum for the activation peaks; only candidates whose rank graph has a cycle pay for the longest
paths (one vectorized pass over the layers). :func:`plan_cost` computes the same numbers from a
:class:`~autodice.core.plan.Plan` (the slow, obvious way), and the tests hold the two equal.

Not modelled: contention between ranks that share a core (a GPU rank's driver thread), host-GPU
copies, a per-frame runtime overhead, other processes on the boards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import AutodiceError, Problems
from ..core.model import Graph, load_model
from ..core.plan import Plan, load_plan
from ..core.spec import Platform, parse_key, parse_platform
from .profile import Profile, load_profile

KINDS = ("one", "all", "rest", "gpu")
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
    """Fit (serial_s, fraction) to samples: a layer's 1-thread time ``t1``, its time ``tn`` on ``n``.

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


def fit_threads(profile: Profile) -> dict[str, AmdahlFit]:
    """One fit per op type from every layer measured at more than one thread count; ``"*"`` is the
    fit over all layers, used for op types with no multi-thread samples."""
    samples: dict[str, list[tuple[float, float, int]]] = {}
    for lc in profile.layers:
        t1 = lc.cpu_ms.get(1)
        if t1 is None:
            continue
        for n, ms in lc.cpu_ms.items():
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
        self._fits = {id(p): fit_threads(p) for p in self.profiles.values()}
        # (cores, slowdown) of each host's profile; (1, 1.0) where it was not measured. A
        # slowdown measured below 1 is noise: busy neighbours do not speed a core up.
        self.corun = {h: (p.corun.cores, max(p.corun.slowdown, 1.0)) if p.corun else (1, 1.0)
                      for h, p in self.profiles.items()}
        self.runtime_bytes = {h: p.runtime_bytes or 0 for h, p in self.profiles.items()}
        self._layers = {id(p): {lc.name: lc for lc in p.layers} for p in self.profiles.values()}
        self.notes: list[str] = []
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
        """(bandwidth bytes/s, latency s) for every ordered host pair, ``shm`` on the diagonal."""
        merged = {}
        for p in self.profiles.values():
            for k, v in p.links.items():
                merged.setdefault(k, v)
        hosts = list(self.platform.devices)
        links = {}
        assumed: list[str] = []
        shm = merged.get("shm")
        if shm is None:
            problems.add("profile: no \"shm\" link (ranks on one host); profile again")
        for a in hosts:
            for b in hosts:
                if a == b:
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
                da, db = self.platform.devices[a], self.platform.devices[b]
                bws = [d.bandwidth for d in (da, db) if d.bandwidth]
                if not bws:
                    assumed.append(f"{a}-{b}")
                    links[a, b] = DEFAULT_LINK
                    continue
                links[a, b] = (min(bws), (da.latency or 0.0) + (db.latency or 0.0))
        if assumed:
            self.notes.append(
                f"{self.platform.path}: no bandwidth for {', '.join(assumed)}: assumed "
                f"{DEFAULT_LINK[0] * 8 / 1e9:g} Gbit/s Ethernet with {DEFAULT_LINK[1] * 1e3:g} ms "
                "latency (the paper's boards); add bandwidth=/latency= to platform.txt or "
                "measure the links with `autodice profile --inventory`")
        return links

    def has_gpu_timings(self, host: str, names) -> bool:
        layers = self._layers[id(self.profiles[host])]
        return all(n in layers and layers[n].gpu_ms is not None for n in names)

    def missing_layers(self, host: str, names) -> list[str]:
        layers = self._layers[id(self.profiles[host])]
        return [n for n in names if n not in layers]

    def seconds(self, host: str, names, threads: int | None) -> np.ndarray:
        """Latency of each layer on ``host``: on ``threads`` cores, or on its GPU when None.

        Raises:
            AutodiceError: layers the profile does not know, or no GPU timings for a GPU rank.
        """
        p = self.profiles[host]
        layers = self._layers[id(p)]
        missing = [n for n in names if n not in layers]
        if missing:
            raise AutodiceError(f"profile of {p.model} (host {host}): {len(missing)} layers are "
                                f"not in it, e.g. \"{missing[0]}\"; profile this model")
        fits = self._fits[id(p)]
        out = np.empty(len(names))
        for k, name in enumerate(names):
            lc = layers[name]
            if threads is None:
                if lc.gpu_ms is None:
                    raise AutodiceError(f'profile of {p.model}: layer "{name}" has no GPU '
                                        f"timing; profile on a board with the GPU")
                out[k] = lc.gpu_ms / 1e3
                continue
            ms = lc.cpu_ms.get(threads)
            if ms is None:
                m = max(n for n in lc.cpu_ms if n <= threads)
                fit = fits.get(lc.op, fits.get("*", AmdahlFit(0.0, 0.0)))
                t1 = lc.cpu_ms[1]
                base = float(fit.time(t1, m))
                ms = lc.cpu_ms[m] * (float(fit.time(t1, threads)) / base if base > 0 else 1.0)
            out[k] = ms / 1e3
        return out

    def transfer(self, a: str, b: str, nbytes) -> np.ndarray:
        bw, lat = self.links[a, b]
        return np.asarray(nbytes, dtype=float) / bw + lat


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


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class RankCost:
    rank: int
    key: str
    host: str
    device: str  # "cpu" | "gpu"
    threads: int
    layers: int
    compute_s: float
    comm_s: float
    span_s: float  # first to last layer of one frame, waiting for round trips (>= compute_s)
    memory: int  # bytes: runtime + params + peak activations + buffers (+ GPU weight copy)


@dataclass(frozen=True)
class DeviceCost:
    host: str
    memory: int  # bytes, RAM + GPU memory
    ram: int
    gpu_mem: int
    energy_j: float  # per frame


@dataclass(frozen=True)
class Cost:
    """What one mapping is predicted to do."""

    throughput: float  # frames/s, pipelined
    period_s: float
    bottleneck: str
    ranks: tuple[RankCost, ...]
    devices: tuple[DeviceCost, ...]  # used devices, platform order
    over_capacity: tuple[str, ...]  # one line per device whose memory does not fit

    @property
    def max_energy_j(self) -> float:
        return max(d.energy_j for d in self.devices)

    @property
    def max_memory(self) -> int:
        return max(d.memory for d in self.devices)

    @property
    def cores(self) -> int:
        return sum(r.threads for r in self.ranks if r.device == "cpu")

    @property
    def gpus(self) -> int:
        return sum(r.device == "gpu" for r in self.ranks)


@dataclass(frozen=True)
class Scores:
    """A population's numbers, arrays over candidates (P) x resources (R) or devices (D)."""

    throughput: np.ndarray  # (P,)
    period: np.ndarray  # (P,)
    compute: np.ndarray  # (P, R)
    comm: np.ndarray  # (P, R)
    span: np.ndarray  # (P, R): one frame's first-to-last layer time, round trips included
    nic: np.ndarray  # (P, 2H): egress then ingress busy seconds per host
    rank_memory: np.ndarray  # (P, R)
    device_memory: np.ndarray  # (P, D)
    device_ram: np.ndarray  # (P, D)
    device_gpu_mem: np.ndarray  # (P, D)
    device_energy: np.ndarray  # (P, D)
    device_used: np.ndarray  # (P, D) bool
    excess: np.ndarray  # (P,) max over devices of (memory - capacity) / capacity
    bad_cuts: np.ndarray  # (P,) cut tensors without a static shape

    @property
    def max_energy(self) -> np.ndarray:
        return np.where(self.device_used, self.device_energy, 0.0).max(axis=1)

    @property
    def max_memory(self) -> np.ndarray:
        return np.where(self.device_used, self.device_memory, 0.0).max(axis=1)


@dataclass(frozen=True)
class _Ranks:
    """Static description of the R columns of a score matrix."""

    dev: np.ndarray  # (R,) device index in platform order
    threads: np.ndarray  # (R,)
    gpu: np.ndarray  # (R,) bool


def contention(timing: Timing, cols: _Ranks, compute: np.ndarray,
               period: np.ndarray) -> np.ndarray:
    """(P, R) factor >= 1 by which a CPU rank's compute stretches because the other ranks of its
    board keep the board's other cores busy (shared caches and memory bandwidth).

    The profile measured the slowdown ``F`` of one core with all ``C`` cores of its machine busy;
    with ``b`` busy cores the slowdown is taken as ``g(b) = 1 + (F - 1) * (b - 1) / (C - 1)``
    (capped at ``b = C``). A rank on ``n`` threads was profiled with ``n`` cores busy, so it
    stretches by ``g(n + o) / g(n)``, where ``o`` counts the other ranks' threads on the board,
    each weighted by the share of the period that rank computes (uncontended figures: a stage
    that idles half the period loads its cores half the time). GPU ranks neither stretch nor
    count.
    """
    devices = list(timing.platform.devices.values())
    slow = np.array([timing.corun[d.name][1] for d in devices])[cols.dev]
    cores = np.array([timing.corun[d.name][0] for d in devices])[cols.dev]
    cpu = ~cols.gpu
    busy = np.where(cpu, cols.threads * np.minimum(compute / period[:, None], 1.0), 0.0)
    onehot = np.zeros((len(cols.dev), len(devices)))
    onehot[np.arange(len(cols.dev)), cols.dev] = 1.0
    others = (busy @ onehot)[:, cols.dev] - busy

    def g(b):
        return 1.0 + (slow - 1.0) * np.clip((b - 1.0) / np.maximum(cores - 1.0, 1.0), 0.0, 1.0)

    return np.where(cpu, g(cols.threads + others) / g(cols.threads), 1.0)


def _combine(timing: Timing, cols: _Ranks, compute, comm, span, nic, params, peak, recv, send,
             used) -> Scores:
    """Per-rank figures -> throughput, device memory and energy (shared by both paths)."""
    devices = list(timing.platform.devices.values())
    D = len(devices)
    onehot = np.zeros((len(cols.dev), D))
    onehot[np.arange(len(cols.dev)), cols.dev] = 1.0
    net = nic.max(axis=1) if nic.shape[1] else 0.0
    period = np.maximum(np.maximum(compute + comm, span).max(axis=1), net)
    stretch = contention(timing, cols, compute * used, np.maximum(period, 1e-12))
    compute, span = compute * stretch, span * stretch
    stage = np.maximum(compute + comm, span)
    period = np.maximum(np.maximum(stage.max(axis=1), net), 1e-12)
    dedicated = np.array([d.gpu_mem is not None for d in devices])[cols.dev]
    split_gpu = cols.gpu & dedicated
    weights_twice = np.where(cols.gpu, params, 0.0)
    runtime = np.array([timing.runtime_bytes[d.name] for d in devices])[cols.dev]
    ram_r = runtime + np.where(split_gpu, params + recv + send,
                               params + peak + recv + send + weights_twice)
    gmem_r = np.where(split_gpu, params + peak, 0.0)
    ram_r, gmem_r = ram_r * used, gmem_r * used
    ram_d, gmem_d = ram_r @ onehot, gmem_r @ onehot
    used_d = (used.astype(float) @ onehot) > 0
    power = [timing.power[d.name] for d in devices]
    idle = np.array([p.idle for p in power])
    pcpu = np.array([p.cpu for p in power])[cols.dev]
    pgpu = np.array([p.gpu for p in power])[cols.dev]
    active = np.where(cols.gpu, pgpu, pcpu * cols.threads) * compute + pcpu * comm
    energy_d = active @ onehot + idle * period[:, None] * used_d
    excess = np.full(len(period), -1.0)
    for d, dev in enumerate(devices):
        if dev.mem:
            excess = np.maximum(excess, np.where(used_d[:, d], (ram_d[:, d] - dev.mem) / dev.mem,
                                                 -1.0))
        if dev.gpu_mem:
            excess = np.maximum(excess, np.where(used_d[:, d],
                                                 (gmem_d[:, d] - dev.gpu_mem) / dev.gpu_mem, -1.0))
    return Scores(1.0 / period, period, compute, comm, span, nic, ram_r + gmem_r, ram_d + gmem_d,
                  ram_d, gmem_d, energy_d, used_d, excess, np.zeros(len(period), dtype=int))


def _cost(timing: Timing, s: Scores, i: int, order: list[int], keys: list[str],
          n_layers: list[int], cols: _Ranks) -> Cost:
    """Row ``i`` of ``s`` as a :class:`Cost`, ranks in ``order`` (columns of s)."""
    devices = list(timing.platform.devices.values())
    ranks = tuple(RankCost(k, keys[c], devices[cols.dev[c]].name,
                           "gpu" if cols.gpu[c] else "cpu", int(cols.threads[c]), n_layers[c],
                           float(s.compute[i, c]), float(s.comm[i, c]), float(s.span[i, c]),
                           int(s.rank_memory[i, c]))
                  for k, c in enumerate(order))
    devs = tuple(DeviceCost(d.name, int(s.device_memory[i, j]), int(s.device_ram[i, j]),
                            int(s.device_gpu_mem[i, j]), float(s.device_energy[i, j]))
                 for j, d in enumerate(devices) if s.device_used[i, j])
    stage = np.maximum(s.compute[i] + s.comm[i], s.span[i])
    c = int(np.argmax(np.where([c in order for c in range(len(stage))], stage, -1)))
    bottleneck = (f"rank {order.index(c)} {keys[c]} (compute {s.compute[i, c] * 1e3:.2f} ms + "
                  f"comm {s.comm[i, c] * 1e3:.2f} ms)")
    if s.span[i, c] > s.compute[i, c] + s.comm[i, c]:
        bottleneck = (f"rank {order.index(c)} {keys[c]} (round trip: {s.span[i, c] * 1e3:.2f} ms "
                      f"from its first to its last layer)")
    H = len(devices)
    if s.nic.shape[1] and s.nic[i].max() > stage[c]:
        j = int(np.argmax(s.nic[i]))
        bottleneck = (f"{devices[j % H].name} network {'out' if j < H else 'in'} "
                      f"({s.nic[i, j] * 1e3:.2f} ms)")
    over = []
    for j, d in enumerate(devices):
        if not s.device_used[i, j]:
            continue
        if d.mem and s.device_ram[i, j] > d.mem:
            over.append(f"{d.name}: {s.device_ram[i, j] / 1e6:.1f} MB of RAM > mem "
                        f"{d.mem / 1e6:.1f} MB")
        if d.gpu_mem and s.device_gpu_mem[i, j] > d.gpu_mem:
            over.append(f"{d.name}: {s.device_gpu_mem[i, j] / 1e6:.1f} MB on the GPU > gpu_mem "
                        f"{d.gpu_mem / 1e6:.1f} MB")
    return Cost(float(s.throughput[i]), float(s.period[i]), bottleneck, ranks, devs, tuple(over))


def layer_edges(graph: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(producer position, consumer position, bytes) of every layer-to-layer tensor, positions
    among the mapped layers in topological order."""
    layer_nodes = [i for i in range(len(graph.nodes)) if i not in graph.followers]
    pos = {n: k for k, n in enumerate(layer_nodes)}
    src, dst, nbytes = [], [], []
    for k, i in enumerate(layer_nodes):
        for t in dict.fromkeys(graph.nodes[i].input):
            p = graph.producer.get(t)
            if p is not None and p in pos:
                src.append(pos[p])
                dst.append(k)
                nbytes.append(float(graph.types[t].nbytes) if t in graph.types else 0.0)
    return np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), np.array(nbytes)


def frame_spans(lg: np.ndarray, d: np.ndarray, src: np.ndarray, dst: np.ndarray,
                w: np.ndarray, K: int) -> np.ndarray:
    """Longest path of one frame from each rank's first layer to its last, (P, K) seconds.

    Args:
        lg: (P, N) rank of each layer; d: (P, N) its latency there.
        src, dst: the layer graph's edges (positions, ``src < dst``); w: (P, E) their transfer
            times (0 within a rank).
        K: ranks per candidate.

    A rank's layers form a chain (it runs them in order), so paths leave a rank only through
    edges to other ranks; a path that comes back is a round trip the rank has to wait for.
    Dynamic programming in topological order, vectorized over candidates and source ranks.
    """
    P, N = lg.shape
    rows = np.arange(P)
    # Previous layer on the same rank, from a stable sort of the layers by rank; N (a row of
    # -inf in ``dist``) where there is none, so the chain edge is one gather for all candidates.
    flat = (rows[:, None] * K + lg).ravel()
    order = np.argsort(flat, kind="stable")
    prev_flat = np.full(P * N, N, dtype=np.int64)
    same = flat[order[1:]] == flat[order[:-1]]
    prev_flat[order[1:][same]] = order[:-1][same] % N
    prev = prev_flat.reshape(P, N).T.copy()  # (N, P)
    first = prev == N
    lgT, dT, wT = lg.T.copy(), d.T[:, :, None].copy(), w.T[:, :, None].copy()
    incoming: list[list[int]] = [[] for _ in range(N)]
    for e, t in enumerate(dst):
        incoming[t].append(e)
    dist = np.full((N + 1, P, K), -np.inf)  # dist[n, i, k]: from rank k's first layer to n's end
    for n in range(N):
        best = dist[prev[n], rows]
        f = first[n]
        if f.any():
            best[rows[f], lgT[n, f]] = 0.0  # the rank starts its frame here
        for e in incoming[n]:
            np.maximum(best, dist[src[e]] + wT[e], out=best)
        np.add(best, dT[n], out=dist[n])
    last = np.full(P * K, -1, dtype=np.int64)
    np.maximum.at(last, flat, np.broadcast_to(np.arange(N), (P, N)).ravel())
    last = last.reshape(P, K)
    span = np.where(last >= 0, dist[np.maximum(last, 0), rows[:, None], np.arange(K)[None, :]],
                    0.0)
    return np.maximum(span, 0.0)


def has_round_trip(adjacency: np.ndarray) -> np.ndarray:
    """(P, K, K) rank-to-rank sends -> (P,) whether some rank's data comes back to it."""
    reach = adjacency.astype(np.float64)
    for _ in range(max(1, int(np.ceil(np.log2(max(adjacency.shape[1], 2)))))):
        reach = np.minimum(reach + reach @ reach, 1.0)
    return np.trace(reach, axis1=1, axis2=2) > 0


# ----------------------------------------------------------------------------- the slow path


def plan_cost(plan: Plan, timing: Timing, graph: Graph) -> Cost:
    """The predicted numbers of a split output, straight from its plan (``split``/``run`` can
    print them). Compute from the profile, transfers from the plan's edges, memory from the plan's
    static memory table; ``graph`` (the whole model) gives the layer order for round trips.

    Raises:
        AutodiceError: a host of the plan not in the timing's platform, layers not profiled.
    """
    hosts = list(timing.platform.devices)
    missing = sorted({r.host for r in plan.ranks} - set(hosts))
    if missing:
        raise AutodiceError(f"plan: hosts {', '.join(missing)} are not in "
                            f"{timing.platform.path}")
    R = len(plan.ranks)
    cols = _Ranks(np.array([hosts.index(r.host) for r in plan.ranks]),
                  np.array([r.threads for r in plan.ranks]),
                  np.array([r.device == "gpu" for r in plan.ranks]))
    names = [graph.names[i] for i in range(len(graph.nodes)) if i not in graph.followers]
    at = {n: k for k, n in enumerate(names)}
    lg = np.zeros((1, len(names)), dtype=np.int64)
    d = np.zeros((1, len(names)))
    compute = np.zeros((1, R))
    for r in plan.ranks:
        t = timing.seconds(r.host, r.layers, None if r.device == "gpu" else r.threads)
        compute[0, r.rank] = t.sum()
        idx = [at[n] for n in r.layers]
        lg[0, idx] = r.rank
        d[0, idx] = t
    comm = np.zeros((1, R))
    H = len(hosts)
    nic = np.zeros((1, 2 * H))
    adjacency = np.zeros((1, R, R))
    for e in plan.edges:
        a = plan.ranks[e.src].host
        for dst in e.dst:
            b = plan.ranks[dst].host
            t = float(timing.transfer(a, b, e.nbytes))
            comm[0, e.src] += t
            comm[0, dst] += t
            adjacency[0, e.src, dst] = 1
            if a != b:
                nic[0, hosts.index(a)] += t
                nic[0, H + hosts.index(b)] += t
    span = compute.copy()
    if has_round_trip(adjacency)[0]:
        src, dst, nbytes = layer_edges(graph)
        ra, rb = lg[0, src], lg[0, dst]
        w = np.array([0.0 if x == y else float(timing.transfer(plan.ranks[x].host,
                                                               plan.ranks[y].host, n))
                      for x, y, n in zip(ra, rb, nbytes)])[None, :]
        span = frame_spans(lg, d, src, dst, w, R)
    mem = [r.memory for r in plan.ranks]
    arr = lambda f: np.array([[float(getattr(m, f)) for m in mem]])
    s = _combine(timing, cols, compute, comm, span, nic, arr("params"), arr("peak_activations"),
                 arr("recv_bytes"), arr("send_bytes"), np.ones((1, R), dtype=bool))
    return _cost(timing, s, 0, list(range(R)), [r.key for r in plan.ranks],
                 [len(r.layers) for r in plan.ranks], cols)


def predict(out_dir: str | Path, profile, power=None) -> Cost:
    """:func:`plan_cost` of the split in ``out_dir`` (its plan.json and platform.txt)."""
    out_dir = Path(out_dir)
    plan = load_plan(out_dir)
    graph = load_model(out_dir / plan.model)
    return plan_cost(plan, make_timing(out_dir / "platform.txt", profile, power), graph)


# ----------------------------------------------------------------------------- the fast path


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


def cpu_key(host: str, family: str, cores: tuple[int, ...]) -> str:
    """A mapping key for ``cores``: the paper's one digit per core when possible, else ranges."""
    if all(c < 10 for c in cores):
        key = f"{host}_{family}{''.join(map(str, cores))}"
    else:
        parts, start = [], None
        for k, c in enumerate(cores):
            start = c if start is None else start
            if k + 1 == len(cores) or cores[k + 1] != c + 1:
                parts.append(f"{start}-{c}")
                start = None
        key = f"{host}_{family}{','.join(parts)}"
    assert parse_key(key).cores == tuple(cores), key
    return key


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


class CostModel:
    """Scores many mappings of one model on one platform fast.

    A candidate is an array of slot indices, one per mapped layer (``self.names`` order, which is
    topological). :meth:`evaluate` takes a (P, N) array of them.

    Raises:
        AutodiceError: the profile misses layers of the model.
    """

    def __init__(self, graph: Graph, timing: Timing):
        self.graph, self.timing = graph, timing
        followers = graph.followers
        layer_nodes = [i for i in range(len(graph.nodes)) if i not in followers]
        self.names = tuple(graph.names[i] for i in layer_nodes)
        N = self.n_layers = len(layer_nodes)
        problems = Problems()
        hosts_of: dict[int, list[str]] = {}
        for host, p in timing.profiles.items():
            hosts_of.setdefault(id(p), []).append(host)
        for hosts in hosts_of.values():
            missing = timing.missing_layers(hosts[0], self.names)
            if missing:
                problems.add(f"profile of {timing.profiles[hosts[0]].model} (hosts "
                             f"{', '.join(hosts)}): {len(missing)} of {N} layers of {graph.path} "
                             f'are not in it, e.g. "{missing[0]}"; profile this model')
        problems.raise_if_any()
        pos = np.full(len(graph.nodes), -1)
        pos[layer_nodes] = np.arange(N)
        self.pos = pos
        self.slots = candidate_slots(timing, self.names)
        with_gpu = {s.host for s in self.slots if s.gpu}
        untimed = [h for h, d in timing.platform.devices.items() if d.gpu and h not in with_gpu]
        self.notes = tuple(timing.notes) + ((
            f"GPUs of {', '.join(untimed)} left out: the profile has no GPU timings for them",)
            if untimed else ())
        S = self.n_slots = len(self.slots)
        self.cols = _Ranks(np.array([s.dev for s in self.slots]),
                           np.array([s.threads for s in self.slots]),
                           np.array([s.gpu for s in self.slots]))
        self.time = np.column_stack([timing.seconds(s.host, self.names,
                                                    None if s.gpu else s.threads)
                                     for s in self.slots])  # (N, S)
        hosts = list(timing.platform.devices)
        self.inv_bw = np.zeros((S, S))
        self.lat = np.zeros((S, S))
        for a, sa in enumerate(self.slots):
            for b, sb in enumerate(self.slots):
                bw, lat = timing.links[sa.host, sb.host]
                self.inv_bw[a, b], self.lat[a, b] = 1.0 / bw, lat
        self.n_hosts = len(hosts)

        # Where followers run: on the ranks of the layers they feed (through follower chains),
        # rank 0 (the rank of layer 0) when they feed nothing -- as place.assign_ranks does.
        reach: dict[int, frozenset[int]] = {}
        for i in range(len(graph.nodes) - 1, -1, -1):
            if i not in followers:
                continue
            users: set[int] = set()
            for t in graph.nodes[i].output:
                for c in graph.consumers.get(t, ()):
                    users |= {int(pos[c])} if c not in followers else reach[c]
            reach[i] = frozenset(users or {0})

        # Activation tensors: model inputs read by layers, then every layer output.
        tensors: list[tuple[str, int]] = [(t, -1) for t in graph.inputs
                                          if any(c not in followers
                                                 for c in graph.consumers.get(t, ()))]
        for p, i in enumerate(layer_nodes):
            tensors += [(t, p) for t in graph.nodes[i].output if t]
        self.n_tensors = len(tensors)
        types = graph.types
        self.tensor_names = [t for t, _ in tensors]
        self.prod = np.array([p for _, p in tensors])
        self.size = np.array([float(types[t].nbytes) if t in types else 0.0 for t, _ in tensors])
        self.static = np.array([t in types and types[t].static for t, _ in tensors])
        outputs = set(graph.outputs)
        self.is_output = np.array([t in outputs for t, _ in tensors])
        self.inputs = np.flatnonzero(self.prod < 0)
        # Uses of each tensor by layers, in node order. A use is the *last* one on its rank
        # unless a later use of the same tensor is on the same rank: precompute those pairs, so
        # scoring needs no (tensor x rank) table. A follower reading a tensor (Shape of a static
        # activation) frees nothing: if it comes after the last real use on that rank, the
        # tensor is never freed there (the plan's memory walk does the same).
        use_t, use_node, later, phantom = [], [], [], []
        for k, (t, _) in enumerate(tensors):
            mine: list[int] = []
            readers = graph.consumers.get(t, ())
            for c in readers:
                if c not in followers and c not in {use_node[u] for u in mine}:
                    mine.append(len(use_t))
                    use_t.append(k)
                    use_node.append(c)
            later += [(u, v) for a, u in enumerate(mine) for v in mine[a + 1:]]
            phantom += [(u, x) for c in readers if c in followers for x in sorted(reach[c])
                        for u in mine if use_node[u] < c]
        self.use_t, self.use_node = np.array(use_t, dtype=np.int64), np.array(use_node)
        self.use_pos = pos[self.use_node]
        self.later = np.array(later, dtype=np.int64).reshape(-1, 2)
        self.phantom = np.array(phantom, dtype=np.int64).reshape(-1, 2)  # (use, position)

        # Weights: a weight counts once on every rank that runs a node reading it.
        users: dict[str, set[int]] = {}
        for i, node in enumerate(graph.nodes):
            for t in node.input:
                if t and graph.is_weight(t):
                    users.setdefault(t, set()).update({int(pos[i])} if i not in followers
                                                      else reach[i])
        self.layer_params = np.zeros(N)
        shared_w, shared_pos = [], []
        self.shared_size = []
        for w, us in users.items():
            nbytes = float(graph.tensors[w].nbytes)
            if len(us) == 1:
                self.layer_params[next(iter(us))] += nbytes
            else:
                for u in sorted(us):
                    shared_w.append(len(self.shared_size))
                    shared_pos.append(u)
                self.shared_size.append(nbytes)
        self.shared_w, self.shared_pos = np.array(shared_w, dtype=np.int64), np.array(shared_pos,
                                                                                        dtype=np.int64)
        self.shared_size = np.array(self.shared_size)
        host_of = self.cols.dev
        self.cross = host_of[:, None] != host_of[None, :]
        self.edge_src, self.edge_dst, self.edge_bytes = layer_edges(graph)

    # -- scoring

    def evaluate(self, slots: np.ndarray) -> Scores:
        """Score a (P, N) array of slot indices (one row per candidate mapping)."""
        g = np.asarray(slots, dtype=np.int64)
        if g.ndim == 1:
            g = g[None, :]
        P, N = g.shape
        S, T, H, U = self.n_slots, self.n_tensors, self.n_hosts, len(self.use_t)
        rows = np.arange(P)[:, None]
        steps = np.arange(N)
        # Each candidate's own ranks 0..K-1 (K = most ranks in the population), in slot order.
        used = np.zeros((P, S), dtype=bool)
        used[rows, g] = True
        local = np.cumsum(used, axis=1) - 1
        K = int(local[:, -1].max()) + 1
        lg = local[rows, g]  # (P, N) rank of each layer
        ui, us = np.nonzero(used)
        slot_of = np.zeros((P, K), dtype=np.int64)
        slot_of[ui, local[ui, us]] = us
        flat = (rows * K + lg).ravel()

        def per_rank(weights):
            return np.bincount(flat, weights=np.broadcast_to(weights, (P, N)).ravel(),
                               minlength=P * K).reshape(P, K)

        compute = per_rank(self.time[steps, g])
        params = per_rank(self.layer_params)
        if self.shared_w.size:
            W = len(self.shared_size)
            present = np.zeros(P * W * K, dtype=bool)
            present[((rows * W + self.shared_w) * K + lg[:, self.shared_pos]).ravel()] = True
            params += np.einsum("pwk,w->pk", present.reshape(P, W, K), self.shared_size)

        # Entries: (candidate, use) where the use is the last one of its tensor on its rank.
        ru = lg[:, self.use_pos]  # (P, U)
        not_last = np.zeros(P * U, dtype=bool)
        if self.later.size:
            same = ru[:, self.later[:, 0]] == ru[:, self.later[:, 1]]
            not_last = np.bincount((rows * U + self.later[:, 0]).ravel(), weights=same.ravel(),
                                   minlength=P * U) > 0
        ei, eu = np.nonzero(~not_last.reshape(P, U))
        et, ek = self.use_t[eu], ru[ei, eu]
        end = self.pos[self.use_node[eu]]  # layer position of the last local use
        if self.phantom.size:
            late = ru[:, self.phantom[:, 0]] == lg[:, self.phantom[:, 1]]
            never = np.bincount((rows * U + self.phantom[:, 0]).ravel(), weights=late.ravel(),
                                minlength=P * U) > 0
            end = np.where(never[ei * U + eu], N, end)

        # The rank that holds each tensor first: its producer's, or for a model input the
        # consumer rank that comes first in rank order (ranks are ordered by first layer).
        src = np.zeros((P, T), dtype=np.int64)
        act = self.prod >= 0
        src[:, act] = lg[:, self.prod[act]]
        if self.inputs.size:
            first = np.full(P * K, N, dtype=np.int64)
            np.minimum.at(first, flat, np.broadcast_to(steps, (P, N)).ravel())
            inp = ~act[et]
            best = np.full(P * T, (N + 1) * K, dtype=np.int64)
            np.minimum.at(best, ei[inp] * T + et[inp],
                          first[ei[inp] * K + ek[inp]] * K + ek[inp])
            best = best.reshape(P, T)[:, self.inputs]
            src[:, self.inputs] = np.where(best < (N + 1) * K, best % K, 0)
        is_recv = ek != src[ei, et]
        ri, rt, rk = ei[is_recv], et[is_recv], ek[is_recv]
        rsrc = src[ri, rt]
        a, b = slot_of[ri, rsrc], slot_of[ri, rk]
        nbytes = self.size[rt]
        xfer = nbytes * self.inv_bw[a, b] + self.lat[a, b]
        at_dst, at_src = ri * K + rk, ri * K + rsrc
        comm = (np.bincount(at_dst, weights=xfer, minlength=P * K)
                + np.bincount(at_src, weights=xfer, minlength=P * K)).reshape(P, K)
        recv = np.bincount(at_dst, weights=nbytes, minlength=P * K).reshape(P, K)
        send = np.bincount(at_src, weights=nbytes, minlength=P * K).reshape(P, K)
        cross = self.cross[a, b]
        host = self.cols.dev
        nic = (np.bincount(ri[cross] * 2 * H + host[a[cross]], weights=xfer[cross],
                           minlength=P * 2 * H)
               + np.bincount(ri[cross] * 2 * H + H + host[b[cross]], weights=xfer[cross],
                             minlength=P * 2 * H)).reshape(P, 2 * H)
        bad_cuts = np.bincount(ri, weights=~self.static[rt], minlength=P).astype(int)

        # Peak live activations. Lay every candidate's steps out rank by rank (a stable sort by
        # rank keeps each rank's layers in order); a tensor held by a rank is live over a run of
        # that rank's steps, so one cumulative sum over P x N gives every rank's live bytes.
        counts = np.bincount(flat, minlength=P * K)
        offset = np.cumsum(counts) - counts
        order = np.argsort(flat.astype(np.int16 if P * K < 2**15 else np.int64), kind="stable")
        at = np.empty(P * N, dtype=np.int64)
        at[order] = np.arange(P * N)
        last_step = offset + counts - 1

        def step_or_last(i, k, p):
            return np.where(p < N, at[i * N + np.minimum(p, N - 1)], last_step[i * K + k])

        # receivers and the owner of a model input: from the rank's first step to the last use
        hold = is_recv | ~act[et]
        hi_, hk, ht = ei[hold], ek[hold], et[hold]
        h_lo = offset[hi_ * K + hk]
        h_hi = step_or_last(hi_, hk, end[hold])
        # producers: from the producing step; held to the end when sent or a model output
        kept = np.zeros((P, T), dtype=bool)
        kept[ri, rt] = True
        kept |= self.is_output[None, :]
        local_end = np.full((P, T), N, dtype=np.int64)
        here = ~hold
        local_end[ei[here], et[here]] = end[here]
        ta = np.flatnonzero(act)
        p_end = np.where(kept[:, ta], N, local_end[:, ta]).ravel()
        pi = np.repeat(np.arange(P), ta.size)
        pk = src[:, ta].ravel()
        p_lo = at[pi * N + np.tile(self.prod[ta], P)]
        p_hi = step_or_last(pi, pk, p_end)
        lo = np.concatenate([h_lo, p_lo])
        hi = np.concatenate([h_hi, p_hi])
        w = np.concatenate([self.size[ht], np.tile(self.size[ta], P)])
        live = np.cumsum(np.bincount(lo, weights=w, minlength=P * N + 1)
                         - np.bincount(hi + 1, weights=w, minlength=P * N + 1))[:P * N]
        peak = np.zeros(P * K)
        full = counts > 0
        peak[full] = np.maximum.reduceat(live, offset[full])

        def to_slots(x):
            out = np.zeros((P, S))
            out[ui, us] = x.reshape(P, K)[ui, local[ui, us]]
            return out

        # Round trips: only candidates whose rank graph has a cycle need the longest paths.
        span = compute.copy()
        adjacency = np.zeros((P, K, K))
        adjacency[ri, rsrc, rk] = 1.0
        cyc = np.flatnonzero(has_round_trip(adjacency))
        if cyc.size:
            gc, lc = g[cyc], lg[cyc]
            sa, sb = gc[:, self.edge_src], gc[:, self.edge_dst]
            w = np.where(lc[:, self.edge_src] == lc[:, self.edge_dst], 0.0,
                         self.edge_bytes * self.inv_bw[sa, sb] + self.lat[sa, sb])
            span[cyc] = frame_spans(lc, self.time[steps, gc], self.edge_src, self.edge_dst, w, K)

        scores = _combine(self.timing, self.cols, to_slots(compute), to_slots(comm),
                          to_slots(span), nic, to_slots(params), to_slots(peak), to_slots(recv),
                          to_slots(send), used)
        return Scores(**{**scores.__dict__, "bad_cuts": bad_cuts})

    # -- one candidate, for reports

    def order(self, slots: np.ndarray) -> list[int]:
        """Slots used by a candidate, in rank order (by first layer)."""
        g = np.asarray(slots)
        _, first = np.unique(g, return_index=True)
        return [int(g[k]) for k in sorted(first)]

    def mapping(self, slots: np.ndarray) -> dict[str, list[str]]:
        """The candidate as mapping.json content (keys in rank order)."""
        g = np.asarray(slots)
        out: dict[str, list[str]] = {self.slots[s].key: [] for s in self.order(g)}
        for name, s in zip(self.names, g):
            out[self.slots[s].key].append(name)
        return out

    def cost(self, slots: np.ndarray) -> Cost:
        """The full report of one candidate."""
        g = np.asarray(slots)
        s = self.evaluate(g[None, :])
        counts = np.bincount(g, minlength=self.n_slots)
        return _cost(self.timing, s, 0, self.order(g), [x.key for x in self.slots],
                     [int(c) for c in counts], self.cols)

    def slots_of(self, mapping: Mapping[str, list[str]]) -> np.ndarray:
        """A mapping (keys among ``self.slots``) as a slot array.

        Raises:
            AutodiceError: a key that is not one of the candidate slots, a layer not mapped.
        """
        by_key = {s.key: k for k, s in enumerate(self.slots)}
        index = {n: k for k, n in enumerate(self.names)}
        g = np.full(self.n_layers, -1)
        problems = Problems()
        for key, layers in mapping.items():
            if key not in by_key:
                problems.add(f'mapping key "{key}" is not a resource the search uses '
                             f'({", ".join(by_key)})')
                continue
            for layer in layers:
                if layer in index:
                    g[index[layer]] = by_key[key]
        if (g < 0).any() and not problems:
            problems.add(f"{int((g < 0).sum())} layers are not mapped")
        problems.raise_if_any()
        return g
