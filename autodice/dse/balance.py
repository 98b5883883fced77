"""``autodice layers --balance`` by measured time: what each layer takes on each key.

A pipeline runs at the pace of its slowest stage, so the first mapping a user asks for should
even out time, not FLOPs (a 1x1 convolution and a depthwise one of equal FLOPs differ
several-fold, and small layers do not speed up with cores). The times come from a profile --
given, or measured here now (cached by the model's bytes) -- at each key's thread count, or on
its GPU; :func:`autodice.frontend.suggest.balanced_mapping` then cuts where the slowest run is
fastest. A run also pays for receiving what crosses into it (on one board Open MPI's single
copy is the receiver's own work: ResNet-50's 2.4 MB cut takes ~0.6 ms of a 37 ms stage), at the
profile's link between the key before it and it, and a run on a GPU for copying it up to the
device. Where one key alone would be faster than the best cut (a GPU that runs the whole
model faster than any stage the CPU can take over), a note says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

from ..core.errors import AutodiceError
from ..core.mapping import Resource, parse_keys
from ..core.model import Graph
from ..core.spec import Device, Platform
from ..frontend.suggest import Cost, balanced_mapping
from .profile import GpuCopies, Link, Profile
from .timing import Timing, host_links


def key_platform(keys: list[Resource], platform: Platform | None = None,
                 profile: Profile | None = None) -> Platform:
    """The devices the keys name, as a platform: each host with the cores its keys use and a
    GPU where a key is one (what profiling and timing need to know of them), and of those
    cores the little ones: as ``platform`` names a host's, else as ``profile`` timed them."""
    hosts: dict[str, tuple[set[int], bool]] = {}
    for res in keys:
        cores, gpu = hosts.setdefault(res.host, (set(), False))
        hosts[res.host] = (cores | set(res.cores), gpu or res.kind == "gpu")

    def little(host: str, cores: set[int]) -> tuple[int, ...] | None:
        named = platform.devices[host].little if platform and host in platform.devices else (
            profile.little.cores if profile and profile.little else None)
        return tuple(sorted(cores & set(named or ()))) or None

    return Platform("--balance", {
        host: Device(host, "cpu", tuple(sorted(cores)) or (0,), gpu="GPU" if gpu else None,
                     gpu_api="VULKAN" if gpu else None, little=little(host, cores))
        for host, (cores, gpu) in hosts.items()})


def measured_cost(graph: Graph, keys: list[Resource], profile: Profile, on_gpu: frozenset[str],
                  notes: list[str] | None = None, platform: Platform | None = None) -> Cost:
    """Seconds of each mapped layer on each key: on as many threads as the key has cores (the
    profile's own count, else scaled by its per-op fit; at the little cores' pace where a key
    holds any of a board's, see :func:`key_platform`), on the GPU for a GPU key.

    A GPU key not in ``on_gpu`` (:func:`gpu_timed`: the profile has no GPU times for it) is
    timed as one CPU core, and ``notes`` says so.

    Raises:
        AutodiceError: layers the profile does not know (another model's profile).
    """
    timing = Timing(key_platform(keys, platform, profile), profile)
    if timing.little_untimed and notes is not None:
        notes.append(f"{', '.join(timing.little_untimed)}: the profile has no times on little "
                     "cores: keys on them are timed as big cores (profile with --little)")
    names = graph.layer_names
    table: dict[str, dict[str, float]] = {}
    for res in keys:
        threads = len(res.cores) if res.kind == "cpu" else None
        if threads is None and res.key not in on_gpu:
            threads = 1
            if notes is not None:
                notes.append(f"{res.key}: the profile has no GPU times; timed as one CPU core")
        little = threads is not None and timing.on_little(res.host, res.cores)
        table[res.key] = dict(zip(names, timing.seconds(res.host, names, threads,
                                                        little).tolist()))
    return lambda key, name: table[key][name]


def gpu_timed(graph: Graph, keys: list[Resource], profile: Profile) -> frozenset[str]:
    """The GPU keys among ``keys`` the profile has GPU times for (the others count as a core)."""
    timing = Timing(key_platform(keys), profile)
    return frozenset(r.key for r in keys if r.kind == "gpu"
                     and timing.has_gpu_timings(r.host, graph.layer_names))


def entry_seconds(graph: Graph, keys: list[Resource], profile: Profile,
                  on_gpu: frozenset[str] = frozenset(),
                  links: Links | None = None) -> list[list[float]]:
    """``[k][a]``: seconds key k spends receiving the tensors that cross into a run of the
    mapped layers (topological order) starting at layer a, each once: produced before a, read
    at a or later. Over the link from ``keys[k - 1]``'s host (``shm`` on one host; ``links``,
    else the profile's); 0 for the first key, and where there is no such link. A tensor that
    passes a run by for a later one is counted for both: an upper bound, exact for two keys.

    A key in ``on_gpu`` (timed on its GPU) also copies what it receives up to the device (the
    model's inputs, if first): its bytes at the profile's upload bandwidth. Not the fitted
    latency: that comes from copies timed alone, each its own submission to an idle GPU (about
    1 ms each way on an H100), where a rank's copies ride in its frame's one submission
    (SqueezeNet's whole frame, copies included, took 1.36 ms there); charged, it moved 20 of
    SqueezeNet's 66 layers to 8 CPU cores, a stage slower than the GPU alone."""
    layer_nodes = [i for i in range(len(graph.nodes)) if i not in graph.followers]
    pos = {node: k for k, node in enumerate(layer_nodes)}
    n = len(layer_nodes)
    nbytes, count = [0.0] * (n + 2), [0] * (n + 2)  # difference arrays over starts
    for t, node in graph.producer.items():
        readers = [pos[c] for c in graph.consumers.get(t, []) if c in pos]
        if node not in pos or not readers or max(readers) <= pos[node]:
            continue
        size = float(graph.types[t].nbytes) if t in graph.types else 0.0
        first, last = pos[node] + 1, max(readers)  # starts a it crosses into: first..last
        nbytes[first] += size
        nbytes[last + 1] -= size
        count[first] += 1
        count[last + 1] -= 1
    crossing, acc_b, acc_c = [], 0.0, 0
    for a in range(n + 1):
        acc_b, acc_c = acc_b + nbytes[a], acc_c + count[a]
        crossing.append((acc_b, acc_c))
    hosts = [r.host for r in keys]
    rows = [[0.0] * (n + 1)]
    for prev, host in zip(hosts, hosts[1:]):
        link = (links or profile.link)(prev, host)
        rows.append([b / link.bandwidth + c * link.latency if link else 0.0
                     for b, c in crossing])
    if profile.gpu is not None:
        up = profile.gpu.upload
        inputs = float(sum(graph.types[t].nbytes for t in graph.inputs))
        for k, res in enumerate(keys):
            if res.key in on_gpu:
                rows[k] = [s + (b if k else inputs) / up.bandwidth
                           for s, (b, _) in zip(rows[k], crossing)]
    return rows


Links = Callable[[str, str], Link | None]  # (host a, host b) -> the link a cut crosses


def platform_links(platform: Platform, profile: Profile,
                   keys: list[Resource]) -> tuple[Links, str]:
    """The links between the keys' hosts as ``predict`` and ``dse`` time them
    (:func:`~autodice.dse.timing.host_links`), and its note on links it assumed.

    Raises:
        AutodiceError: a key whose host the platform file does not list.
    """
    missing = sorted({r.host for r in keys} - set(platform.devices))
    if missing:
        raise AutodiceError(f"--balance: {platform.path} lists no {', '.join(missing)}")
    links, note = host_links(platform, dict.fromkeys(platform.devices, profile))
    return (lambda a, b: Link(*links[a, b]) if (a, b) in links else None), note


@dataclass(frozen=True)
class Balanced:
    mapping: dict[str, list[str]]
    seconds: dict[str, float]  # each key's predicted compute and receiving per frame
    notes: tuple[str, ...]
    alone: dict[str, float]  # each key's predicted frame with every layer on it


def balance(graph: Graph, model: str | Path, keys: list[str], profile: Profile | None = None,
            console=None, input_shapes: dict[str, tuple[int, ...]] | None = None,
            platform: Platform | None = None) -> Balanced:
    """The mapping of ``graph``'s layers onto ``keys`` whose slowest stage is fastest by
    measured time; ``profile`` None: measure the model's layers on this machine's CPU first
    (cached by the model's bytes; a GPU key then counts as one core: profile on the board and
    pass the profile for its GPU). ``input_shapes``: those ``graph`` was loaded with (inputs of
    symbolic size), for the measuring. ``platform``: the links between hosts a cut crosses
    (without it, and without the profile's own, a note says they are not counted: SqueezeNet
    over two boards looked like 1,300 frames/s by compute alone, and ran at 330 over 1 Gbit/s).

    Raises:
        AutodiceError: bad keys, or a profile that cannot be made or does not fit the model.
    """
    from .profiler import run_profile

    balanced_mapping(graph, keys, "--balance")  # bad keys before anything is measured
    resources = parse_keys(keys, "--balance")
    if profile is None:
        cores = os.cpu_count() or 1
        threads = {1} | {min(len(r.cores), cores) for r in resources if r.kind == "cpu"}
        profile = run_profile(model, key_platform(resources), tuple(sorted(threads)),
                              input_shapes, console=console, gpu=False).profile
    notes: list[str] = []
    try:
        on_gpu = gpu_timed(graph, resources, profile)
        cost = measured_cost(graph, resources, profile, on_gpu, notes, platform)
        links, note = (platform_links(platform, profile, resources) if platform
                       else (None, ""))
    except AutodiceError as e:
        raise AutodiceError(*(f"--balance: {line}" if not line.startswith("--balance") else line
                              for line in e.problems)) from None
    notes += [note] if note else []
    hosts = [r.host for r in resources]
    unknown = sorted({"-".join(sorted(p)) for p in zip(hosts, hosts[1:])
                      if p[0] != p[1] and (links or profile.link)(*p) is None})
    if unknown:
        notes.append(f"no link known between {', '.join(unknown)}: the time to send the cut "
                     "tensors there is not counted (compute only); give -p platform.txt")
    entry = entry_seconds(graph, resources, profile, on_gpu, links)
    mapping = balanced_mapping(graph, keys, "--balance", cost, entry)
    starts = accumulate((len(run) for run in mapping.values()), initial=0)  # runs are contiguous
    seconds = {k: entry[j][a] + sum(cost(k, n) for n in run)
               for j, ((k, run), a) in enumerate(zip(mapping.items(), starts))}
    alone = {k: alone_seconds(graph, k, cost, profile.gpu if k in on_gpu else None)
             for k in keys}
    best = min(alone, key=alone.get)
    if len(keys) > 1 and alone[best] < max(seconds.values()):
        notes.append(f"{best} alone is faster by the profile's layer times: "
                     f"{1e3 * alone[best]:.2f} ms a frame against {1e3 * max(seconds.values()):.2f}"
                     f" ms for this cut's slowest stage; map every layer to {best} for the speed")
    return Balanced(mapping, seconds, tuple(notes), alone)


def alone_seconds(graph: Graph, key: str, cost: Cost, copies: GpuCopies | None) -> float:
    """A frame's seconds with every layer on ``key``; with ``copies``, a GPU key's copies of the
    model's inputs and outputs too, by their bytes (as :func:`entry_seconds` charges them)."""
    seconds = sum(cost(key, name) for name in graph.layer_names)
    if copies is not None:
        seconds += (sum(graph.types[t].nbytes for t in graph.inputs) / copies.upload.bandwidth
                    + sum(graph.types[t].nbytes for t in graph.outputs)
                    / copies.download.bandwidth)
    return seconds
