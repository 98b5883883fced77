"""``autodice profile``: measure what every mappable layer costs on the real engine.

The cost model needs per-layer latencies as the generated program would see them, so nothing
here is simulated: the whole model is converted once with pnnx exactly as a one-rank split would
convert it (folded shapes, legalized Softmax), and ``runtime_cpp/profile_layers.cpp`` — built
against the same full ncnn and with the generated program's net options — times it at each
thread count (warm-up runs, then medians over runs, batch 1).

Per layer, not per sub-model: the profiler extracts the output blob of every ncnn layer in
order, so each extract runs exactly one ncnn layer; :mod:`autodice.dse.attribution` gives each
ONNX layer its share.

The sum of the per-layer medians is checked against the whole-model median measured in the same
process (``ProfileRun.whole_ms``). Links: ``shm`` is measured between two local MPI ranks by
``profile_layers --link`` (a ping-pong through ``autodice::Transfer``); host pairs come from the
platform's ``bandwidth`` and ``latency`` fields (a message crosses both hosts' links: the slower
rate, the latencies added), or are measured on the cluster by ``autodice.links`` (``--inventory``).
Contention: ``profile_layers --corun`` (one rank per core) times the whole model on one thread
alone and with every core running it (``Profile.corun``), and the peak resident memory of such a
rank less what the cost model counts for it gives ``Profile.runtime_bytes``. Each layer's bytes
in ncnn (its weights as read and once repacked, its workspace) come from ``profile_layers`` too,
shared out by the same groups as the times.
GPU: with a Vulkan device (``--gpu``), every layer is timed there too (``gpu_ms``, less the download
of its output that timing it takes), then scaled so the layers sum to the whole model's GPU time
less its input and output copies (:func:`summed_to_whole`); the copies are fitted separately
(``Profile.gpu``). Without a device ``gpu_ms`` stays null.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..backend.convert import PNNX_VERSION, convert
from ..backend.engine import NCNN_PIN, cache_root, ensure_ncnn
from ..backend.fp16_range import past_range
from ..backend.tools import build_tools, tools_digest, vulkan_devices
from ..core.errors import AutodiceError
from ..core.model import Graph
from ..core.onnxwrite import write_model
from ..core.plan import Memory, Rank, TensorSpec
from ..core.spec import Platform, format_cores
from ..frontend.extract import submodel_proto
from ..frontend.partition import static_memory
from .attribution import attribute_bytes, attribute_times, fingerprint_onnx, match_layers
from .cost import held_bytes, weights_peak
from .probe import Here, Machine, measure_corun, measure_shm, run_profiler
from .profile import (
    GpuCopies,
    LayerCost,
    Link,
    LittleCores,
    Profile,
    fit_link,
    model_sha256,
    profile_from_json,
    profile_to_json,
    six_digits,
)
from .profile_args import check_profile_args, choose_threads, core_kinds, here_cores

if TYPE_CHECKING:
    from .remote_tools import OnHost

# 2: co-run slowdown, runtime_bytes; 3: robust link fit; 4: GPU timings; 5: layer bytes;
# 6: GPU layer times summed to the whole model's; 7: int8 loaded bytes, little cores in int8
CACHE_VERSION = 7


@dataclass(frozen=True)
class ProfileRun:
    """A measured profile plus what the CLI reports about the measurement itself."""

    profile: Profile
    whole_ms: dict[int | str, float]  # threads (or "gpu") -> median ms of the whole model
    ncnn_layers: int  # layers of the converted net that were timed
    unmatched: tuple[str, ...]  # ONNX layers no ncnn blob matched (timed with their successor)
    cached: bool
    notes: tuple[str, ...]


def profile_model(model: str | Path, platform: str | Path, threads=None, **kwargs) -> Profile:
    """The profile of ``model`` for ``platform`` (what ``dse`` calls when given no profile);
    see :func:`run_profile` for the arguments."""
    return run_profile(model, platform, threads, **kwargs).profile


def run_profile(model: str | Path, platform: str | Path | Platform,
                threads: tuple[int, ...] | None = None,
                input_shapes: dict[str, tuple[int, ...]] | None = None, warmup: int = 3,
                runs: int = 15, console=None, use_cache: bool = True,
                links: dict[str, Link] | None = None, gpu: bool | None = None,
                on: OnHost | None = None, little: tuple[int, ...] | None = None,
                little_from: str = "--little", int8: bool = False) -> ProfileRun:
    """Measure every mappable layer of ``model`` at each thread count, and the links.

    Args:
        model: the ONNX model (the one ``split`` reads).
        platform: platform.txt; chooses the thread counts (1 and each device's core count, up
            to this machine's). Its link fields stay in the platform: the profile holds only
            links measured (``shm`` here, host pairs with ``links``), so a platform edited
            later (another switch, a sweep of rates) still counts.
        threads: thread counts to measure instead (each at most this machine's cores).
        input_shapes: static shapes for inputs with symbolic dimensions.
        warmup, runs: untimed and timed runs per thread count; the profile holds medians.
        console: a ``rich.console.Console`` for progress (stderr by default).
        use_cache: reuse a measurement of the same model bytes, engine and thread counts.
        links: host pair -> link measured on the cluster (``autodice.dse.links.probe_links``); they
            replace the platform's figures for those pairs. Not cached: they describe the
            network, not the model.
        gpu: also time every layer on this machine's first Vulkan device (``gpu_ms``) and its
            host<->device copies; None: when the platform lists a GPU and there is a device.
        on: measure there instead of here (a host of an inventory,
            :func:`~autodice.dse.remote_tools.on_host`): the same tool, built for that host.
        little: the machine's little cores (a big.LITTLE board): every layer is timed pinned
            to them (``little_ms``) and, apart, pinned to its other cores (``cpu_ms``);
            ``little_from`` says where they came from, for an error.
        int8: also time every layer quantized (``int8_ms``), as ``gen --precision int8``
            makes it: the search then offers keys in int8.

    Returns:
        The profile (layers in execution order, names as ``autodice layers`` prints them), with
        the whole-model medians it was checked against and whether it came from the cache.

    Raises:
        AutodiceError: bad thread counts or inputs, a model pnnx cannot convert, a failed build
            or measurement.
    """
    from rich.console import Console

    console = console or Console(stderr=True)
    model = Path(model)
    spec, graph = check_profile_args(model, platform, threads, input_shapes, warmup, runs, gpu,
                                     on is not None)
    cores = on.cores if on else os.cpu_count() or 1
    threads = choose_threads(spec, threads, cores)
    kinds = None
    if little:  # a board's cores 0..n-1 (nproc), this machine's as its cpuset allows
        kinds, threads = core_kinds(little, tuple(range(cores)) if on else here_cores(),
                                    threads, little_from)
    digest = model_sha256(model)
    ncnn = None if on else ensure_ncnn(console=console)
    wants_gpu = not on and (any(d.gpu for d in spec.devices.values()) if gpu is None else gpu)
    devices = vulkan_devices(build_tools(ncnn)) if wants_gpu else []
    if gpu and not devices:
        raise AutodiceError("--gpu: ncnn finds no Vulkan device on this machine (install the "
                            "GPU's Vulkan driver, or Mesa's lavapipe to try it on the CPU)")
    device = devices[0] if devices else None
    key = cache_key(digest, on.key if on else str(ncnn), threads, input_shapes, warmup, runs,
                    device, kinds, int8)
    entry = cache_root() / "profile" / f"{key}.json"
    measured = read_cache(entry) if use_cache else None
    cached = measured is not None
    if measured is None:
        measured = measure_model(graph, digest, ncnn, threads, warmup, runs, console,
                                 0 if device else None, on, kinds, int8)
        write_cache(entry, measured)
    profile = replace(profile_from_json(measured["profile"], str(entry)), model=model.name,
                      links={**(links or {}),
                             "shm": Link(measured["shm"]["bandwidth"],
                                         measured["shm"]["latency"])})
    notes = [f"shm: {measured['shm']['warning']}"] if measured["shm"].get("warning") else []
    gpus = [f"{d.name} ({d.gpu})" for d in spec.devices.values() if d.gpu]
    if gpus and profile.gpu is None and not on:
        notes.append(f"gpu_ms is null: the platform lists GPUs ({', '.join(gpus)}) but ncnn "
                     "finds no Vulkan device on this machine; profile on a board with its GPU")
    elif profile.gpu is not None:
        notes.append(f"gpu_ms measured on {profile.gpu.device}, this machine's Vulkan device, "
                     f"in {profile.gpu.precision}"
                     + (" (the model's values pass fp16's range: gen runs its GPU ranks in fp32)"
                        if profile.gpu.precision == "fp32" else "")
                     + ": profile on the boards for their GPUs"
                     + (" (lavapipe is Vulkan on the CPU: not a GPU's speed)"
                        if "llvmpipe" in profile.gpu.device else ""))
    return ProfileRun(profile, {(int(t) if t.isdigit() else t): v
                                for t, v in measured["whole_ms"].items()},
                      measured["ncnn_layers"], tuple(measured["unmatched"]), cached, tuple(notes))


def op_summary(profile: Profile) -> list[tuple[str, int, dict[int | str, float]]]:
    """(op type, layers, threads (and "gpu") -> total ms) per op type, slowest first: thread
    efficiency per op type at a glance (small layers do not speed up with more cores), and the
    GPU's time beside it."""
    totals: dict[str, dict[int | str, float]] = {}
    counts: dict[str, int] = {}
    for lc in profile.layers:
        counts[lc.op] = counts.get(lc.op, 0) + 1
        per = totals.setdefault(lc.op, {})
        for t, ms in [*lc.cpu_ms.items(), *([("gpu", lc.gpu_ms)] if lc.gpu_ms is not None
                                             else [])]:
            per[t] = per.get(t, 0.0) + ms
    return sorted(((op, counts[op], totals[op]) for op in totals),
                  key=lambda row: -row[2][min(profile.threads)])


def engine_info() -> dict:
    """What the times depend on besides the model: ncnn build, precision, OpenMP waiting
    (OpenMP's default, as ``autodice run`` starts ranks that have their cores to themselves,
    unless the environment says otherwise)."""
    return {"ncnn": NCNN_PIN, "build": "full", "fp16": False,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default")}


# --- inputs and cache -----------------------------------------------------------------------


def cache_key(digest: str, tool: str, threads, input_shapes, warmup: int, runs: int,
              gpu: str | None = None, kinds: LittleCores | None = None,
              int8: bool = False) -> str:
    """``tool``: what measures — this machine's ncnn build, or a host and its tool's checksum."""
    blob = json.dumps({"v": CACHE_VERSION, "model": digest, "engine": engine_info(), "gpu": gpu,
                       **({"int8": True} if int8 else {}),
                       "little": kinds and [kinds.cores, kinds.big_cores, kinds.threads],
                       "ncnn": tool,
                       "pnnx": PNNX_VERSION, "src": tools_digest(), "threads": list(threads),
                       "shapes": sorted((k, list(v)) for k, v in (input_shapes or {}).items()),
                       "warmup": warmup, "runs": runs}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def read_cache(entry: Path) -> dict | None:
    try:
        return json.loads(entry.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_cache(entry: Path, measured: dict) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=entry.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(measured, f, indent=1, sort_keys=True)
    os.replace(tmp, entry)


# --- measuring ------------------------------------------------------------------------------


def measure_model(graph: Graph, digest: str, ncnn: Path | None, threads: tuple[int, ...],
                  warmup: int, runs: int, console, gpu: int | None = None,
                  on: Machine | None = None, kinds: LittleCores | None = None,
                  int8: bool = False) -> dict:
    """Convert, fingerprint, time and attribute; the cacheable part of a profile (``gpu``: the
    Vulkan device to time as well; ``on``: the machine to time on, else this one with the tools
    built against ``ncnn``; ``kinds``: time on the big cores, then on the little ones; ``int8``:
    time the net quantized too).

    The quantized net has the same layers in the same order as the fp32 one (gen adds scales
    and rewrites weights, nothing else), so the fp32 net's match of ncnn layers to ONNX ones
    attributes its times: its own outputs are int8's, and would match nothing exactly."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    mappable = [i for i in range(len(graph.nodes)) if i not in graph.followers]
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with tempfile.TemporaryDirectory(prefix="autodice-profile-") as tmp, \
            Progress(*columns, console=console, transient=True) as progress:
        work = Path(tmp)
        step = progress.add_task("converting the model with pnnx", total=6)
        param = convert_whole_model(graph, work)
        progress.update(step, advance=1, description="onnxruntime fingerprints")
        feeds = write_inputs(graph, work)
        reference, largest = fingerprint_onnx(graph, work / "model.onnx", feeds, mappable)
        # Timed in the precision gen gives a GPU rank of the whole model (fp16_range.py).
        gpu_fp32 = past_range(largest)
        progress.update(step, advance=1, description="building the profiler")
        m = on or Here(build_tools(ncnn), work)
        progress.update(step, advance=1, description="timing layers at "
                        f"{','.join(map(str, threads))} threads"
                        + (" and on the GPU" if gpu is not None else ""))
        timing = progress.add_task("  runs", total=None)
        raw = run_profiler(m, param, feeds, threads, warmup, runs,
                           lambda d, n: progress.update(timing, completed=d, total=n),
                           str(graph.path), gpu, gpu_fp32, kinds and kinds.big_cores)
        if int8:
            progress.update(step, description="timing layers in int8")
            param_int8 = quantized(param, feeds)
            raw_int8 = run_profiler(m, param_int8, feeds, threads, warmup, runs,
                                    lambda d, n: progress.update(timing, completed=d, total=n),
                                    str(graph.path), cores=kinds and kinds.big_cores)
            if [x["name"] for x in raw_int8["layers"]] != [x["name"] for x in raw["layers"]]:
                raise AutodiceError("internal error: the int8 net's layers are not the fp32 "
                                    "net's")
        if kinds:
            progress.update(step, description="timing layers on the little cores "
                            f"{format_cores(kinds.cores)}")
            raw_little = run_profiler(m, param, feeds, kinds.threads, warmup, runs,
                                      lambda d, n: progress.update(timing, completed=d, total=n),
                                      str(graph.path), cores=kinds.cores)
            if int8:  # where int8 pays most: the little cores
                raw_little_int8 = run_profiler(
                    m, param_int8, feeds, kinds.threads, warmup, runs,
                    lambda d, n: progress.update(timing, completed=d, total=n),
                    str(graph.path), cores=kinds.cores)
        progress.update(step, advance=1, description="measuring shared-memory transfers")
        shm = measure_shm(m)
        progress.update(step, advance=1, description="timing the model with every core busy")
        corun, peak_rss = measure_corun(
            m, param, feeds, warmup, runs,
            lambda d, n: progress.update(timing, completed=d, total=n))
        progress.update(step, advance=1)
    groups, unmatched = match_layers(graph, raw["layers"], reference, mappable)
    cpu_ms = attribute_times(graph, raw, groups, threads)
    little_ms = attribute_times(graph, raw_little, groups, kinds.threads) if kinds else None
    int8_ms = attribute_times(graph, raw_int8, groups, threads) if int8 else None
    int8_held = attribute_bytes(graph, raw_int8, groups) if int8 else None
    little_int8_ms = (attribute_times(graph, raw_little_int8, groups, kinds.threads)
                      if int8 and kinds else None)
    held = attribute_bytes(graph, raw, groups)
    # What the rank held beyond what the cost model counts for a rank with the whole model (its
    # layers' weights and workspace, activations): MPI, ncnn's code, the runtime.
    table = static_memory(graph, list(range(len(graph.nodes))), tuple(graph.inputs),
                          set(graph.outputs), [], [])
    resident, loaded = held["resident"][mappable], held["loaded"][mappable]
    runtime_bytes = max(peak_rss - int(held_bytes(0, resident.sum(), weights_peak(
        resident, loaded), table.peak_activations + held["workspace"].max(), 0)), 0)
    copies = gpu_copies(raw, "fp32" if gpu_fp32 else "fp16") if "gpu" in raw["runs"] else None
    gpu_ms = (summed_to_whole(
        attribute_times(graph, without_downloads(raw, copies.download), groups, ("gpu",))["gpu"],
        float(np.median(raw["runs"]["gpu"]["whole_ms"])), copies, graph, mappable)
              if copies else None)
    profile = Profile(
        model=graph.path.name, model_sha256=digest, engine=engine_info(),
        machine=m.info(), threads=threads, corun=corun, runtime_bytes=runtime_bytes,
        layers=tuple(LayerCost(graph.names[i], graph.nodes[i].op_type,
                               {t: six_digits(cpu_ms[t][i]) for t in threads},
                               six_digits(gpu_ms[i]) if gpu_ms else None,
                               *(round(held[k][i]) for k in ("loaded", "resident",
                                                               "workspace")),
                               {t: six_digits(little_ms[t][i]) for t in kinds.threads}
                               if kinds else None,
                               {t: six_digits(int8_ms[t][i]) for t in threads} if int8 else None,
                               round(int8_held["resident"][i]) if int8 else None,
                               round(int8_held["loaded"][i]) if int8 else None,
                               {t: six_digits(little_int8_ms[t][i]) for t in kinds.threads}
                               if little_int8_ms else None)
                     for i in mappable), gpu=copies, little=kinds)
    whole = {str(t): six_digits(np.median(raw["runs"][str(t)]["whole_ms"]))
             for t in (*threads, *(["gpu"] if copies else []))}
    whole |= {f"little {t}": six_digits(np.median(raw_little["runs"][str(t)]["whole_ms"]))
              for t in (kinds.threads if kinds else ())}
    whole |= {f"int8 {t}": six_digits(np.median(raw_int8["runs"][str(t)]["whole_ms"]))
              for t in (threads if int8 else ())}
    whole |= {f"little int8 {t}": six_digits(np.median(
        raw_little_int8["runs"][str(t)]["whole_ms"])) for t in (kinds.threads if little_int8_ms
                                                                  else ())}
    return {"profile": profile_to_json(profile), "whole_ms": whole, "shm": shm,
            "ncnn_layers": len(raw["layers"]), "unmatched": [graph.names[i] for i in unmatched]}


def quantized(param: Path, feeds: list[Path]) -> Path:
    """The converted model ``param`` quantized as gen quantizes an int8 key's layers, its first
    kept fp32 as gen keeps it (the layers gen finds sensitive are not known here: they are timed
    in int8, so a key's gain is somewhat high); calibrated on the profile's frame: its times,
    not its accuracy, are measured. The copy's .param path. Quantized here, with this machine's
    tools, for any machine to time."""
    from ..backend.int8 import Calibrated

    tools = build_tools(ensure_ncnn())
    cal = Calibrated.measure(tools / "ncnn_int8", param.with_suffix(""),
                             [[np.load(f) for f in feeds]])
    base = param.parent / "model_int8.ncnn"
    cal.write(base, {next(iter(cal.int8)): "first"} if cal.int8 else {})
    return base.with_suffix(".ncnn.param")


def gpu_copies(raw: dict, precision: str) -> GpuCopies:
    """The device's upload and download costs, fitted to profile_layers' fastest copies; its
    layers timed in ``precision``."""
    rows = raw["gpu_transfer"]
    up, _ = fit_link([r["bytes"] for r in rows], [r["upload_s"] for r in rows])
    down, _ = fit_link([r["bytes"] for r in rows], [r["download_s"] for r in rows])
    return GpuCopies(raw.get("gpu_device", "vulkan"),
                     Link(six_digits(up.bandwidth), six_digits(up.latency)),
                     Link(six_digits(down.bandwidth), six_digits(down.latency)), precision)


def without_downloads(raw: dict, download: Link) -> dict:
    """The GPU runs with each layer's time less the copy of its output to the host: timing one
    layer means extracting its output, which on Vulkan downloads it, and a GPU rank downloads
    only what it sends."""
    nbytes = np.array([4.0 * layer["tops"][0][0] for layer in raw["layers"]])
    copy_ms = (download.latency + nbytes / download.bandwidth) * 1e3
    runs = np.asarray(raw["runs"]["gpu"]["layer_ms"], dtype=float)
    return {**raw, "runs": {"gpu": {**raw["runs"]["gpu"],
                                    "layer_ms": np.maximum(runs - copy_ms, 0.0).tolist()}}}


def summed_to_whole(gpu_ms: dict[int, float], whole_ms: float, copies: GpuCopies, graph: Graph,
                    mappable: list[int]) -> dict[int, float]:
    """The GPU layer times scaled to sum to the whole model's GPU time less the copies of its
    inputs and outputs, so that the cost of a GPU rank holding every layer is what was measured.

    Each layer timed alone is one submission to the GPU and one wait for it; the whole model is
    one of each. On an H100 each such round trip cost about as much as a layer's work: SqueezeNet's
    layers summed to 27.5 ms against 2.9 ms for the whole model, ResNet-50's to 21.7 ms against
    6.0 ms, and ``layers --balance`` gave 8 CPU cores 43 of ResNet-50's 176 layers: 76 frames/s,
    where the GPU alone ran 270. The layers' own times still say which of them cost more.
    """
    up = sum(graph.types[t].nbytes for t in graph.inputs)
    down = sum(graph.types[t].nbytes for t in graph.outputs)
    copies_ms = 1e3 * (copies.upload.latency + up / copies.upload.bandwidth
                       + copies.download.latency + down / copies.download.bandwidth)
    total = sum(gpu_ms[i] for i in mappable)
    scale = max(whole_ms - copies_ms, 0.0) / total if total > 0 else 0.0
    return {i: ms * scale for i, ms in gpu_ms.items()}


def convert_whole_model(graph: Graph, work: Path) -> Path:
    """The model as a one-rank split writes and converts it; returns the ncnn ``.param``."""
    specs = [TensorSpec(t, tuple(graph.types[t].shape), graph.types[t].dtype,
                        graph.types[t].nbytes) for t in graph.inputs]
    outs = [TensorSpec(t, tuple(graph.types[t].shape), graph.types[t].dtype,
                       graph.types[t].nbytes) for t in graph.outputs]
    rank = Rank(rank=0, key="profile", host="localhost", device="cpu", gpu_index=0, slots=(0,),
                threads=1, submodel="model.onnx",
                layers=tuple(graph.layer_names),
                followers=tuple(n for i, n in enumerate(graph.names) if i in graph.followers),
                inputs=tuple(graph.inputs), outputs=tuple(graph.outputs), recv=(), send=(),
                submodel_inputs=tuple(specs), submodel_outputs=tuple(outs), steps=(),
                memory=Memory(0, 0, 0, 0))
    proto, weights = submodel_proto(graph, rank, list(range(len(graph.nodes))))
    write_model(work / "model.onnx", proto, weights)
    convert(work / "model.onnx", work / "model.ncnn", rank)
    return work / "model.ncnn.param"


def write_inputs(graph: Graph, work: Path) -> list[Path]:
    """Seeded standard-normal inputs, one .npy per model input in graph order (in0, in1...)."""
    rng = np.random.default_rng(0)
    paths = []
    for k, name in enumerate(graph.inputs):
        path = work / f"in{k}.npy"
        np.save(path, rng.standard_normal(graph.types[name].shape).astype(np.float32))
        paths.append(path)
    return paths
