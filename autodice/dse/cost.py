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
  A GPU rank also copies every tensor it receives up to the device and every tensor it sends
  back down: ``bytes / rate + latency`` each way, as the profile measured the device's copies.
* **contention**: per-layer times were taken with the rest of the machine idle, but a pipelined
  stage computes while the other ranks of its board compute too, sharing caches and memory
  bandwidth (hosts whose platform lines name one ``machine=`` count as one board). The profile
  measured how much slower the whole model runs on one core with every core busy; a rank's
  compute (and span) stretches by that factor, scaled by how many of its board's other cores
  the other ranks keep busy (see :func:`contention`).
* **transfer** of a cut tensor from rank a to rank b: ``bytes / bandwidth + latency``. Ranks on
  one host use the profile's ``shm`` link; other pairs the profile's measured host pair, else the
  platform's fields (a message crosses both hosts' links: the slower ``bandwidth``, the two
  ``latency`` values added -- as the profiler writes host pairs). A tensor sent to two ranks is
  two messages, as in the plan. Between hosts, ``gen --wire fp16`` (int8) sends half (a quarter)
  of the bytes; converting them is not counted (every rank on one machine, SqueezeNet ran at
  0.96x and 0.98x fp32's frames/s: bench/wire_bench.py).
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
* **memory** of a CPU rank r = its weights as ncnn holds them + the larger of (peak live
  activations + the largest workspace of its layers) and (what loading adds) + receive and send
  buffers + ``runtime_bytes``.
  Weights are the profile's ``resident_bytes`` of r's layers: what each keeps once ncnn has
  repacked it -- a 3x3 convolution's Winograd weights are several times its ONNX bytes, an
  InnerProduct's the same, so a share of the ONNX parameters would misplace them. Loading
  reads a layer's weights, repacks them (with scratch, for Winograd as large as the result),
  then drops the file's copy and the scratch: while it loads layer i a rank holds the layers
  before it, i repacked and ``loaded_bytes`` beyond (:func:`weights_peak`), before any
  activation exists (:func:`held_bytes`). The program loads into mappings of their own, so
  what loading frees goes back to the system and leaves no holes. On VGG-19 the
  rank that loads the 411 MB FC6 peaks there. Activations and buffers are the plan's static
  memory table (``Rank.memory``); a layer's workspace (``workspace_bytes``: im2col and Winograd
  tiles, padded copies -- 62 MB for VGG-19's second convolution, more than its activations)
  exists only while it runs, so only the largest counts. ``runtime_bytes`` is what the profile
  measured a rank process to hold beyond all that (MPI, ncnn's code, the runtime, what malloc
  keeps; tens of MB, paid once per rank). A GPU rank counts its ONNX parameters twice: ncnn
  loads them on the host and uploads a copy, so on a shared-memory board (no ``gpu_mem``; the
  paper measured this on Jetsons) both copies are RAM; with dedicated ``gpu_mem`` the GPU holds
  weights and activations and RAM the host copy and buffers. Device memory = the sum over its
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
paths (one vectorized pass over the layers). That fast path is
:class:`~autodice.dse.cost_model.CostModel`; :func:`plan_cost` here computes the same numbers from
a :class:`~autodice.core.plan.Plan` (the slow, obvious way), and the tests hold the two equal.
Both end in :func:`combine` and :func:`report`. The figures they start from (latencies, links,
power) are :mod:`autodice.dse.timing`'s; the longest paths are :mod:`autodice.dse.spans`'.

Not modelled: contention between ranks that share a core (a GPU rank's driver thread), a
per-frame runtime overhead, other processes on the boards.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..backend.wire import WIRE_SHARE
from ..core.errors import AutodiceError
from ..core.model import Graph
from ..core.plan import Plan, load_plan
from ..frontend.split import plan_graph
from .spans import frame_spans, has_round_trip, layer_edges
from .timing import Timing, make_timing

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
    memory: int  # bytes: runtime + weights + peak activations (or loading) + buffers


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
class RankColumns:
    """Static description of the R columns of a score matrix: the fast path's columns are the
    candidate slots, the plan's its ranks; :func:`combine` needs only these three facts of each."""

    dev: np.ndarray  # (R,) device index in platform order
    threads: np.ndarray  # (R,)
    gpu: np.ndarray  # (R,) bool


def contention(timing: Timing, cols: RankColumns, compute: np.ndarray,
               period: np.ndarray) -> np.ndarray:
    """(P, R) factor >= 1 by which a CPU rank's compute stretches because the other ranks of its
    board keep the board's other cores busy (shared caches and memory bandwidth). Hosts whose
    platform lines name one ``machine`` (emulated or containerised hosts on one server) are one
    board here: their ranks contend as one board's do.

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
    keys = [("machine", d.machine) if d.machine else ("host", d.name) for d in devices]
    board = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    on = np.array([board[k] for k in keys])[cols.dev]
    onehot = np.zeros((len(cols.dev), len(board)))
    onehot[np.arange(len(cols.dev)), on] = 1.0
    others = (busy @ onehot)[:, on] - busy

    def g(b):
        return 1.0 + (slow - 1.0) * np.clip((b - 1.0) / np.maximum(cores - 1.0, 1.0), 0.0, 1.0)

    return np.where(cpu, g(cols.threads + others) / g(cols.threads), 1.0)


def weights_peak(resident: np.ndarray, loaded: np.ndarray) -> float:
    """Most heap a rank's weights take while it loads its layers in order: layer i repacked,
    with what it holds beyond that while loading (``loaded``: the file's copy, the repacking's
    scratch), every earlier layer repacked."""
    return float((np.cumsum(resident) + loaded).max()) if len(resident) else 0.0


def held_bytes(runtime, resident, load_peak, activations, buffers):
    """A CPU rank's peak memory: loading comes before the first frame, so its peak and the
    activations' never add up (scalars or arrays alike)."""
    return runtime + buffers + np.maximum(resident + activations, load_peak)


def combine(timing: Timing, cols: RankColumns, compute, comm, span, nic, params, resident,
            load_peak, workspace, peak, recv, send, used) -> Scores:
    """Per-rank figures -> throughput, device memory and energy.

    Both paths end here, so the fast path and :func:`plan_cost` cannot disagree on what the
    per-rank figures mean: only on the figures themselves, which the tests compare.
    """
    devices = list(timing.platform.devices.values())
    D = len(devices)
    onehot = np.zeros((len(cols.dev), D))
    onehot[np.arange(len(cols.dev)), cols.dev] = 1.0
    # A GPU rank copies what it receives up to the device and what it sends back down.
    up_bw, up_lat, down_bw, down_lat = np.array(
        [timing.gpu_copies[d.name] for d in devices]).T[:, cols.dev]
    copies = np.where(cols.gpu & used, recv / up_bw + up_lat + send / down_bw + down_lat, 0.0)
    compute, span = compute + copies, span + copies
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
    ram_r = np.where(cols.gpu, runtime + np.where(split_gpu, params + recv + send,
                                                  params + peak + recv + send + weights_twice),
                     held_bytes(runtime, resident, load_peak, peak + workspace, recv + send))
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


def report(timing: Timing, s: Scores, i: int, order: list[int], keys: list[str],
           n_layers: list[int], cols: RankColumns) -> Cost:
    """Row ``i`` of ``s`` as a :class:`Cost`, ranks in ``order`` (columns of s).

    The search scores arrays; people read a bottleneck and per-rank lines. One function makes the
    report for both paths, so a front point and ``split``'s prediction print alike.
    """
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


# ----------------------------------------------------------------------------- the slow path


def plan_cost(plan: Plan, timing: Timing, graph: Graph,
              int8: frozenset[str] = frozenset(), wire: str = "fp32") -> Cost:
    """The predicted numbers of a split output, straight from its plan (``split``/``run`` can
    print them), the CPU keys in ``int8`` quantized, tensors that cross hosts in ``wire``'s
    share of their bytes (``gen --wire``: :data:`~autodice.backend.wire.WIRE_SHARE`). Compute
    from the profile, transfers from the plan's edges, memory from the plan's static memory
    table; ``graph`` (the model the plan was made of: rewritten where layers are split across
    keys) gives the layer order for round trips.

    A part of a split layer costs its share of the layer's profiled time (its channels or rows);
    the Slices and Concats that move data cost only their transfers. A stage with R copies takes
    every R-th frame on each: per frame, each copy computes 1/R of the time, and each of the
    stage's messages goes to (comes from) one copy, 1/R of them each.

    Raises:
        AutodiceError: a host of the plan not in the timing's platform, layers not profiled.
    """
    hosts = list(timing.platform.devices)
    missing = sorted({r.host for r in plan.ranks} - set(hosts))
    if missing:
        raise AutodiceError(f"plan: hosts {', '.join(missing)} are not in "
                            f"{timing.platform.path}")
    R = len(plan.ranks)
    cols = RankColumns(np.array([hosts.index(r.host) for r in plan.ranks]),
                  np.array([r.threads for r in plan.ranks]),
                  np.array([r.device == "gpu" for r in plan.ranks]))
    names = graph.layer_names
    at = {n: k for k, n in enumerate(names)}
    lg = np.zeros((1, len(names)), dtype=np.int64)
    d = np.zeros((1, len(names)))
    compute, resident, load_peak, workspace = (np.zeros((1, R)) for _ in range(4))
    share = np.array([[1.0 / len(r.turns()) for r in plan.ranks]])
    for r in plan.ranks:
        origins = [plan.derived.get(n, (n, 1.0)) for n in r.layers]
        timed = [k for k, (_, f) in enumerate(origins) if f > 0]  # Slices, Concats: transfers
        full = np.zeros(len(origins))
        loaded, kept, work = (np.zeros(len(origins)) for _ in range(3))
        if timed:
            part = np.array([origins[k][1] for k in timed])
            profiled = [origins[k][0] for k in timed]
            cpu = r.device != "gpu"
            q = cpu and r.key in int8
            full[timed] = timing.seconds(r.host, profiled, r.threads if cpu else None,
                                         cpu and timing.on_little(r.host, r.slots), q) * part
            # a part of a split layer holds its share; its weights in `graph` are that share
            onnx = np.array([graph.weight_bytes(graph.index[r.layers[k]]) for k in timed])
            whole = timing.memory_bytes(r.host, profiled, onnx / part, q)
            loaded[timed], kept[timed], work[timed] = (x * part for x in whole)
        compute[0, r.rank] = full.sum() * share[0, r.rank]
        resident[0, r.rank], load_peak[0, r.rank] = kept.sum(), weights_peak(kept, loaded)
        workspace[0, r.rank] = work.max(initial=0.0)
        if r.turns()[0] == r.rank:  # the layer graph knows a stage once
            idx = [at[n] for n in r.layers]
            lg[0, idx] = r.rank
            d[0, idx] = full
    on_wire = WIRE_SHARE[wire]

    def transfer(a: str, b: str, nbytes: float) -> float:
        return float(timing.transfer(a, b, nbytes * on_wire if a != b else nbytes))

    comm = np.zeros((1, R))
    H = len(hosts)
    nic = np.zeros((1, 2 * H))
    adjacency = np.zeros((1, R, R))
    for e in plan.edges:
        for dst in e.dst:
            senders, receivers = plan.ranks[e.src].turns(), plan.ranks[dst].turns()
            often = 1.0 / (len(senders) * len(receivers))  # this pair's share of the frames
            for s_ in senders:
                for q in receivers:
                    a, b = plan.ranks[s_].host, plan.ranks[q].host
                    t = transfer(a, b, e.nbytes) * often
                    comm[0, s_] += t
                    comm[0, q] += t
                    adjacency[0, s_, q] = 1
                    if a != b:
                        nic[0, hosts.index(a)] += t
                        nic[0, H + hosts.index(b)] += t
    span = compute.copy()
    if has_round_trip(adjacency)[0]:
        src, dst, nbytes = layer_edges(graph)
        ra, rb = lg[0, src], lg[0, dst]
        w = np.array([0.0 if x == y else transfer(plan.ranks[x].host, plan.ranks[y].host, n)
                      for x, y, n in zip(ra, rb, nbytes)])[None, :]
        span = frame_spans(lg, d, src, dst, w, R)
        for r in plan.ranks:  # a copy waits as its stage's first rank does, every R-th frame
            span[0, r.rank] = span[0, r.turns()[0]] * share[0, r.rank]
    mem = [r.memory for r in plan.ranks]

    def arr(field: str) -> np.ndarray:
        return np.array([[float(getattr(m, field)) for m in mem]])

    s = combine(timing, cols, compute, comm, span, nic, arr("params"), resident, load_peak,
                workspace, arr("peak_activations"), arr("recv_bytes"), arr("send_bytes"),
                np.ones((1, R), dtype=bool))
    return report(timing, s, 0, list(range(R)), [r.key for r in plan.ranks],
                 [len(r.layers) for r in plan.ranks], cols)


def predict(out_dir: str | Path, profile, power=None) -> Cost:
    """:func:`plan_cost` of the split in ``out_dir`` (its plan.json and platform.txt), its int8
    keys and its wire format as gen made them."""
    from ..backend.precision import Precision
    from ..backend.wire import Wire

    out_dir = Path(out_dir)
    plan = load_plan(out_dir)
    graph = plan_graph(out_dir, plan)  # rewritten where layers are split across keys
    return plan_cost(plan, make_timing(out_dir / "platform.txt", profile, power), graph,
                     Precision.of_output(out_dir).int8_keys(plan), Wire.of_output(out_dir).kind)
