"""``autodice profile``: measure what every mappable layer costs on the real engine.

The cost model needs per-layer latencies as the generated program would see them, so nothing
here is simulated: the whole model is converted once with pnnx exactly as a one-rank split would
convert it (folded shapes, legalized Softmax), and ``runtime_cpp/profile_layers.cpp`` — built
against the same full ncnn and with the generated program's net options — times it at each
thread count (warm-up runs, then medians over runs, batch 1).

Per layer, not per sub-model: the profiler extracts the output blob of every ncnn layer in
order, so each extract runs exactly one ncnn layer. Those are not the ONNX layers a mapping
names — pnnx fuses Conv+BatchNorm+ReLU into one Convolution, drops Dropout, inserts Split — and
it renames everything, so names cannot be matched. Values can: the profiler fingerprints every
ncnn blob (element count, sum, sum |x|, sum x^2) on a seeded input and onnxruntime does the same
for every ONNX layer output. An ncnn layer whose output matches ONNX tensor T computed T and every
ONNX layer before T that no earlier ncnn layer matched (its fused partners); its time (plus that
of unmatched ncnn layers before it, e.g. Split) is shared among them in proportion to their FLOPs,
so a fused ReLU costs next to nothing and the Convolution carries the time. Exposing every layer
output as a graph output instead would stop pnnx from fusing and make ncnn clone blobs for
in-place layers, so what it measured would not be what a rank runs.

The sum of the per-layer medians is checked against the whole-model median measured in the same
process (``ProfileRun.whole_ms``). Links: ``shm`` is measured between two local MPI ranks by
``profile_layers --link`` (a ping-pong through ``autodice::Transfer``); host pairs come from the
platform's ``bandwidth`` and ``latency`` fields (a message crosses both hosts' links: the slower
rate, the latencies added), or are measured on the cluster by ``autodice.links`` (``--inventory``).
Contention: ``profile_layers --corun`` (one rank per core) times the whole model on one thread
alone and with every core running it (``Profile.corun``), and the peak resident memory of such a
rank less the model's memory table gives ``Profile.runtime_bytes``.
GPU latency is not measured (this profiler uses ncnn's CPU build): ``gpu_ms`` stays null.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform as host_platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import numpy as np

from ..backend.convert import PNNX_VERSION, convert
from ..backend.engine import NCNN_PIN, cache_root, cmake_args, ensure_ncnn, mpi_prefix
from ..core.errors import AutodiceError, Problems
from ..core.model import Graph, load_model
from ..core.onnxio import write_model
from ..core.plan import Memory, Rank, TensorSpec
from ..core.spec import Platform, parse_platform
from ..frontend.extract import submodel_proto
from ..frontend.layers import layer_flops
from ..frontend.partition import static_memory
from .profile import (
    Corun,
    LayerCost,
    Link,
    Profile,
    link_from_rows,
    profile_from_json,
    profile_to_json,
)

CACHE_VERSION = 3  # 2: adds the co-run slowdown and runtime_bytes; 3: robust link fit
SOURCES = ("profile_layers.cpp", "autodice_runtime.cpp", "autodice_runtime.h")
# Fingerprints of one tensor from ncnn and onnxruntime agree to ~1e-5 relative; different tensors
# of one count differ by far more.
MATCH_RTOL = 1e-3


@dataclass(frozen=True)
class ProfileRun:
    """A measured profile plus what the CLI reports about the measurement itself."""

    profile: Profile
    whole_ms: dict[int, float]  # threads -> median latency of the whole model in one extract
    ncnn_layers: int  # layers of the converted net that were timed
    unmatched: tuple[str, ...]  # ONNX layers no ncnn blob matched (timed with their successor)
    cached: bool
    notes: tuple[str, ...]


def profile_model(model: str | Path, platform: str | Path, threads=None, **kwargs) -> Profile:
    """The profile of ``model`` for ``platform`` (what ``dse`` calls when given no profile);
    see :func:`run_profile` for the arguments."""
    return run_profile(model, platform, threads, **kwargs).profile


def run_profile(model: str | Path, platform: str | Path, threads: tuple[int, ...] | None = None,
                input_shapes: dict[str, tuple[int, ...]] | None = None, warmup: int = 3,
                runs: int = 15, console=None, use_cache: bool = True,
                links: dict[str, Link] | None = None) -> ProfileRun:
    """Measure every mappable layer of ``model`` at each thread count, and the links.

    Args:
        model: the ONNX model (the one ``split`` reads).
        platform: platform.txt; chooses the thread counts (1 and each device's core count, up
            to this machine's) and gives the host-to-host links.
        threads: thread counts to measure instead (each at most this machine's cores).
        input_shapes: static shapes for inputs with symbolic dimensions.
        warmup, runs: untimed and timed runs per thread count; the profile holds medians.
        console: a ``rich.console.Console`` for progress (stderr by default).
        use_cache: reuse a measurement of the same model bytes, engine and thread counts.
        links: host pair -> link measured on the cluster (``autodice.dse.links.probe_links``); they
            replace the platform's figures for those pairs. Not cached: they describe the
            network, not the model.

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
    spec = parse_platform(platform)
    threads = choose_threads(spec, threads)
    if warmup < 0 or runs < 1:
        raise AutodiceError(f"--warmup {warmup} / --runs {runs}: need warmup >= 0 and runs >= 1")
    graph = load_model(model, input_shapes)
    check_inputs(graph)
    digest = model_sha256(model)
    ncnn = ensure_ncnn(console=console)
    key = cache_key(digest, ncnn, threads, input_shapes, warmup, runs)
    entry = cache_root() / "profile" / f"{key}.json"
    measured = read_cache(entry) if use_cache else None
    cached = measured is not None
    if measured is None:
        measured = measure_model(graph, digest, ncnn, threads, warmup, runs, console)
        write_cache(entry, measured)
    profile = replace(profile_from_json(measured["profile"], str(entry)), model=model.name,
                      links={**platform_links(spec), **(links or {}),
                             "shm": Link(measured["shm"]["bandwidth"],
                                         measured["shm"]["latency"])})
    notes = [f"shm: {measured['shm']['warning']}"] if measured["shm"].get("warning") else []
    gpus = [f"{d.name} ({d.gpu})" for d in spec.devices.values() if d.gpu]
    if gpus:
        notes.append(f"gpu_ms is null: the platform lists GPUs ({', '.join(gpus)}) but this "
                     "profiler measures ncnn's CPU build; no Vulkan GPU was measured")
    return ProfileRun(profile, {int(t): v for t, v in measured["whole_ms"].items()},
                      measured["ncnn_layers"], tuple(measured["unmatched"]), cached, tuple(notes))


def op_summary(profile: Profile) -> list[tuple[str, int, dict[int, float]]]:
    """(op type, layers, threads -> total ms) per op type, slowest first: thread efficiency
    per op type at a glance (small layers do not speed up with more cores)."""
    totals: dict[str, dict[int, float]] = {}
    counts: dict[str, int] = {}
    for lc in profile.layers:
        counts[lc.op] = counts.get(lc.op, 0) + 1
        per = totals.setdefault(lc.op, {})
        for t, ms in lc.cpu_ms.items():
            per[t] = per.get(t, 0.0) + ms
    return sorted(((op, counts[op], totals[op]) for op in totals),
                  key=lambda row: -row[2][min(row[2])])


def engine_info() -> dict:
    """What the times depend on besides the model: ncnn build, precision, OpenMP waiting
    (OpenMP's default, as ``autodice run`` starts ranks that have their cores to themselves,
    unless the environment says otherwise)."""
    return {"ncnn": NCNN_PIN, "build": "full", "fp16": False,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default")}


# --- inputs and cache -----------------------------------------------------------------------


def choose_threads(spec: Platform, threads: tuple[int, ...] | None) -> tuple[int, ...]:
    """The thread counts to measure: given ones, else 1 and every device's core count.

    Counts above this machine's cores would measure oversubscription, not the layer, so they
    are refused when asked for and capped when derived from the platform.
    """
    cores = os.cpu_count() or 1
    if threads:
        bad = [t for t in threads if not 1 <= t <= cores]
        if bad:
            raise AutodiceError(f"--threads {','.join(map(str, threads))}: "
                                f"{', '.join(map(str, bad))} not between 1 and this machine's "
                                f"{cores} cores")
        return tuple(sorted(set(threads)))
    return tuple(sorted({1} | {min(len(d.slots), cores) for d in spec.devices.values()
                               if d.slots is not None}))


def check_inputs(graph: Graph) -> None:
    """The profiler feeds seeded float32 inputs of static shape; say which input is not one."""
    problems = Problems()
    for name in graph.inputs:
        t = graph.types.get(name)
        if t is None or not t.static:
            problems.add(f'{graph.path}: input "{name}" has no static shape '
                         f"({t.shape_str() if t else '?'}); give --input-shape {name}=1x...")
        elif t.dtype != "float32":
            problems.add(f'{graph.path}: input "{name}" is {t.dtype}; the profiler feeds float32')
    problems.raise_if_any()


def model_sha256(path: Path) -> str:
    """sha256 of the model file, and of its external ``.data`` file when there is one."""
    h = hashlib.sha256()
    for p in (path, Path(f"{path}.data")):
        if p.exists():
            with open(p, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
    return h.hexdigest()


def source_digest() -> str:
    """Hash of the C++ sources the profiler builds from (a change rebuilds and re-measures)."""
    root = resources.files("autodice.runtime_cpp")
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + root.joinpath(name).read_bytes())
    return h.hexdigest()


def cache_key(digest: str, ncnn: Path, threads, input_shapes, warmup: int, runs: int) -> str:
    blob = json.dumps({"v": CACHE_VERSION, "model": digest, "engine": engine_info(),
                       "ncnn": str(ncnn),
                       "pnnx": PNNX_VERSION, "src": source_digest(), "threads": list(threads),
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


def platform_links(spec: Platform) -> dict[str, Link]:
    """One link per host pair where either host states a bandwidth."""
    links = {}
    devices = sorted(spec.devices.values(), key=lambda d: d.name)
    for i, a in enumerate(devices):
        for b in devices[i + 1:]:
            rates = [d.bandwidth for d in (a, b) if d.bandwidth]
            if rates:
                links[f"{a.name}-{b.name}"] = Link(min(rates), (a.latency or 0) + (b.latency or 0))
    return links


def machine_info() -> dict:
    cpu = host_platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"arch": host_platform.machine(), "cpu": cpu, "cores": os.cpu_count() or 1}


# --- measuring ------------------------------------------------------------------------------


def measure_model(graph: Graph, digest: str, ncnn: Path, threads: tuple[int, ...], warmup: int,
                  runs: int, console) -> dict:
    """Convert, fingerprint, time and attribute; the cacheable part of a profile."""
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
        reference = fingerprint_onnx(graph, work / "model.onnx", feeds, mappable)
        progress.update(step, advance=1, description="building the profiler")
        tools = build_tools(ncnn, console)
        progress.update(step, advance=1, description="timing layers at "
                        f"{','.join(map(str, threads))} threads")
        timing = progress.add_task("  runs", total=None)
        raw = run_profiler(tools / "profile_layers", param, feeds, threads, warmup, runs,
                           work / "raw.json", lambda d, n: progress.update(timing, completed=d,
                                                                           total=n),
                           str(graph.path))
        progress.update(step, advance=1, description="measuring shared-memory transfers")
        shm = measure_shm(tools / "profile_layers", work)
        progress.update(step, advance=1, description="timing the model with every core busy")
        corun, peak_rss = measure_corun(
            tools / "profile_layers", param, feeds, warmup, runs, work,
            lambda d, n: progress.update(timing, completed=d, total=n))
        progress.update(step, advance=1)
    # What the rank held beyond the plan's memory table for the whole model: MPI, ncnn's code,
    # its repacked weights and workspace, the runtime. Counted whole for every rank, it
    # overstates a rank with part of the weights a little: the safe side of a capacity check.
    table = static_memory(graph, list(range(len(graph.nodes))), tuple(graph.inputs),
                          set(graph.outputs), [], [])
    runtime_bytes = max(peak_rss - table.params - table.peak_activations, 0)
    groups, unmatched = match_layers(graph, raw["layers"], reference, mappable)
    cpu_ms = attribute_times(graph, raw, groups, threads)
    profile = Profile(
        model=graph.path.name, model_sha256=digest, engine=engine_info(),
        machine=machine_info(), threads=threads, corun=corun, runtime_bytes=runtime_bytes,
        layers=tuple(LayerCost(graph.names[i], graph.nodes[i].op_type,
                               {t: _sig(cpu_ms[t][i]) for t in threads}, None)
                     for i in mappable))
    whole = {str(t): _sig(np.median(raw["runs"][str(t)]["whole_ms"])) for t in threads}
    return {"profile": profile_to_json(profile), "whole_ms": whole, "shm": shm,
            "ncnn_layers": len(raw["layers"]), "unmatched": [graph.names[i] for i in unmatched]}


def _sig(ms: float) -> float:
    """Six significant digits: byte-stable JSON that keeps a fused ReLU's sliver above zero."""
    return float(f"{float(ms):.6g}")


def convert_whole_model(graph: Graph, work: Path) -> Path:
    """The model as a one-rank split writes and converts it; returns the ncnn ``.param``."""
    specs = [TensorSpec(t, tuple(graph.types[t].shape), graph.types[t].dtype,
                        graph.types[t].nbytes) for t in graph.inputs]
    outs = [TensorSpec(t, tuple(graph.types[t].shape), graph.types[t].dtype,
                       graph.types[t].nbytes) for t in graph.outputs]
    rank = Rank(rank=0, key="profile", host="localhost", device="cpu", gpu_index=0, slots=(0,),
                threads=1, submodel="model.onnx",
                layers=tuple(n for i, n in enumerate(graph.names) if i not in graph.followers),
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


def fingerprint(array: np.ndarray) -> tuple[int, float, float, float]:
    """(count, sum, sum |x|, sum x^2): what profile_layers prints for an ncnn blob."""
    a = np.asarray(array, dtype=np.float64).ravel()
    return (a.size, float(a.sum()), float(np.abs(a).sum()), float(np.dot(a, a)))


def fingerprint_onnx(graph: Graph, path: Path, feeds: list[Path],
                     mappable: list[int]) -> dict[str, tuple]:
    """Fingerprints of every mappable layer's outputs, computed by onnxruntime."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path), load_external_data=False)
    have = {o.name for o in model.graph.output}
    wanted = [t for i in mappable for t in graph.nodes[i].output if t and t not in have]
    model.graph.output.extend(onnx.ValueInfoProto(name=t) for t in wanted)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        # Weights past protobuf's 2 GB stay in model.onnx.data beside it: save next to them.
        onnx.save(model, str(path.with_name("fingerprints.onnx")))
        source = str(path.with_name("fingerprints.onnx"))
    else:
        source = model.SerializeToString()
    session = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    values = session.run(names, {n: np.load(p) for n, p in zip(graph.inputs, feeds)})
    return {n: fingerprint(v) for n, v in zip(names, values)
            if np.asarray(v).dtype.kind == "f"}


def write_sources(folder: Path) -> str:
    """Write the profiler's sources and its CMakeLists.txt into ``folder`` (here, or as the tools
    package the link probe builds on cluster hosts); returns a hash of what was written."""
    folder.mkdir(parents=True, exist_ok=True)
    root = resources.files("autodice.runtime_cpp")
    files = {name: root.joinpath(name).read_bytes() for name in SOURCES}
    files["CMakeLists.txt"] = _CMAKE.encode()
    digest = hashlib.sha256()
    for name, data in sorted(files.items()):
        (folder / name).write_bytes(data)
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()[:16]


def build_tools(ncnn: Path, console) -> Path:
    """``profile_layers``, built once per source hash + ncnn + MPI (it links the runtime)."""
    key = hashlib.sha256(f"{source_digest()}\n{ncnn}\n{mpi_prefix()}".encode()).hexdigest()[:16]
    entry = cache_root() / "profiler" / key
    if (entry / "profile_layers").exists():
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=entry.parent))
    try:
        src = tmp / "src"
        write_sources(src)
        log = tmp / "build.log"
        for what, cmd in (("configuring", ["cmake", "-S", str(src), "-B", str(tmp / "build"),
                                           "-DCMAKE_BUILD_TYPE=Release", *cmake_args(ncnn)]),
                          ("compiling", ["cmake", "--build", str(tmp / "build"), "-j",
                                         str(os.cpu_count() or 2)])):
            with open(log, "a") as f:
                proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False)
            if proc.returncode != 0:
                tail = "\n".join(log.read_text().splitlines()[-15:])
                raise AutodiceError(f"{what} the profiler failed:\n{tail}")
        out = tmp / "bin"
        out.mkdir()
        shutil.copy2(tmp / "build" / "profile_layers", out / "profile_layers")
        try:
            os.rename(out, entry)  # atomic: complete or absent
        except OSError:  # another process built it first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


_CMAKE = """\
# Written by autodice.profiler: the per-layer and link profiler.
cmake_minimum_required(VERSION 3.16)
project(autodice_profiler LANGUAGES C CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(ncnn REQUIRED)
add_library(autodice_runtime STATIC autodice_runtime.cpp)
target_include_directories(autodice_runtime PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(autodice_runtime PUBLIC ncnn MPI::MPI_CXX OpenMP::OpenMP_CXX)
add_executable(profile_layers profile_layers.cpp)
target_link_libraries(profile_layers PRIVATE autodice_runtime)
target_compile_options(profile_layers PRIVATE -Wall -Wextra -Werror)
"""


def _env() -> dict:
    # As `autodice run` runs the program: passive OpenMP waits unless the user chose otherwise.
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def _with_progress(cmd: list[str], on_progress) -> tuple[int, list[str]]:
    """Run ``cmd``, passing its ``progress DONE TOTAL`` stderr lines to ``on_progress``;
    returns the exit code and everything else it said (stdout and stderr)."""
    proc = subprocess.Popen(cmd, stderr=subprocess.STDOUT, stdout=subprocess.PIPE, text=True,
                            env=_env())
    said = []
    assert proc.stdout is not None
    for line in proc.stdout:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "progress":
            on_progress(int(parts[1]), int(parts[2]))
        else:
            said.append(line.rstrip())
    return proc.wait(), said


def run_profiler(binary: Path, param: Path, feeds: list[Path], threads: tuple[int, ...],
                 warmup: int, runs: int, out: Path, on_progress, model: str = "model") -> dict:
    """Run profile_layers; returns its JSON (fingerprints and raw times of every run)."""
    cmd = [str(binary), str(param), str(param.with_suffix(".bin")), str(out),
           "--threads", ",".join(map(str, threads)), "--warmup", str(warmup),
           "--runs", str(runs)]
    for p in feeds:
        cmd += ["--input", str(p)]
    code, said = _with_progress(cmd, on_progress)
    if code != 0 or not out.exists():
        missing = [ln.split("layer ", 1)[1].split()[0] for ln in said
                   if "not exists or registered" in ln]
        if missing:
            raise AutodiceError(f"{model}: ncnn cannot load the net pnnx made of it: it has no "
                                f"{', '.join(missing)} layer (pnnx did not lower that ONNX op)")
        raise AutodiceError(f"profile_layers failed (exit {code}):", *said[-6:])
    return json.loads(out.read_text())


def measure_shm(binary: Path, work: Path) -> dict:
    """Bandwidth and latency between two ranks on this host (and the fit's warning, if any),
    fitted to the fastest one-way times of ``profile_layers --link`` (autodice::Transfer, the
    generated program's path)."""
    out = work / "link.json"
    cmd = [str(mpi_prefix() / "bin" / "mpirun"), "-np", "2", "--oversubscribe", "--bind-to",
           "none", str(binary), "--link", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300,
                          check=False)
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr + proc.stdout).strip().splitlines()[-6:]
        raise AutodiceError(f"profile_layers --link failed (exit {proc.returncode}):", *tail)
    link, warning = link_from_rows(json.loads(out.read_text())["rows"])
    return {"bandwidth": link.bandwidth, "latency": link.latency, "warning": warning}


def measure_corun(binary: Path, param: Path, feeds: list[Path], warmup: int, runs: int,
                  work: Path, on_progress) -> tuple[Corun | None, int]:
    """How much longer the whole model takes on one core while every core of this machine runs
    it (None on a one-core machine), and the peak resident bytes of a rank that ran it: one
    rank per core, ``profile_layers --corun``.

    Per-layer times are taken with the rest of the machine idle, but a pipelined stage runs while
    its neighbours on the same board work too, and they share caches and memory bandwidth
    (ResNet-50's halves ran ~15 % slower than alone on this project's 2-core VM). The cost model
    stretches a rank's compute by this factor, scaled by how busy its board's other cores are.
    """
    cores = os.cpu_count() or 1
    out = work / "corun.json"
    cmd = [str(mpi_prefix() / "bin" / "mpirun"), "-np", str(cores), "--bind-to", "core",
           "--map-by", "core", str(binary), str(param), str(param.with_suffix(".bin")), str(out),
           "--corun", "--warmup", str(warmup), "--runs", str(runs)]
    for f in feeds:
        cmd += ["--input", str(f)]
    code, said = _with_progress(cmd, on_progress)
    if code != 0 or not out.exists():
        raise AutodiceError(f"profile_layers --corun failed (exit {code}):", *said[-6:])
    raw = json.loads(out.read_text())
    slowdown = np.median(raw["together_ms"]) / np.median(raw["alone_ms"])
    return (Corun(cores, _sig(slowdown)) if cores > 1 else None), int(raw["peak_rss"])


# --- from ncnn layers to ONNX layers --------------------------------------------------------


def match_layers(graph: Graph, ncnn_layers: list[dict], reference: dict[str, tuple],
                 mappable: list[int]) -> tuple[list[list[int]], list[int]]:
    """For each timed ncnn layer, the ONNX layers (node positions) its time belongs to.

    An ncnn output that matches ONNX tensor T (the earliest such tensor not yet claimed, so an
    alias such as Dropout's output goes to the alias) claims T's producer and every unclaimed
    mappable ancestor. An ncnn layer that matches nothing new (Split, pnnx's own reshapes) gets
    an empty group: its time goes to the next group. ONNX layers never claimed (no blob matched
    them or a descendant) join the last group; they are returned too.
    """
    allowed = set(mappable)
    by_count: dict[int, list[str]] = {}
    order = {t: k for k, i in enumerate(mappable) for t in graph.nodes[i].output if t}
    for t in sorted(reference, key=lambda t: order.get(t, len(order))):
        if t in order:
            by_count.setdefault(reference[t][0], []).append(t)
    claimed: set[int] = set()
    groups: list[list[int]] = []
    for layer in ncnn_layers:
        group: list[int] = []
        for top in layer["tops"]:
            t = next((t for t in by_count.get(int(top[0]), [])
                      if graph.producer[t] not in claimed and _same(top, reference[t])), None)
            if t is not None:
                group += _claim(graph, graph.producer[t], claimed, allowed)
        groups.append(sorted(group))
    unmatched = [i for i in mappable if i not in claimed]
    if unmatched:
        last = max((k for k, g in enumerate(groups) if g), default=len(groups) - 1)
        groups[last] = sorted(groups[last] + unmatched)
    return groups, unmatched


def _same(a, b) -> bool:
    if any(v is None or not np.isfinite(v) for v in (*a, *b)):
        return False  # an overflowed blob is nobody's fingerprint
    _, s, asum, sq = (float(v) for v in a)
    _, s2, asum2, sq2 = b
    scale = max(asum2, 1e-30)
    return (abs(s - s2) <= MATCH_RTOL * scale + 1e-6 and abs(asum - asum2) <= MATCH_RTOL * scale
            + 1e-6 and abs(sq - sq2) <= MATCH_RTOL * max(sq2, 1e-30) + 1e-9)


def _claim(graph: Graph, start: int, claimed: set[int], allowed: set[int]) -> list[int]:
    """``start`` and its unclaimed ancestors among ``allowed``, now claimed."""
    got, stack = [], [start]
    while stack:
        i = stack.pop()
        if i in claimed or i not in allowed:
            continue
        claimed.add(i)
        got.append(i)
        stack.extend(graph.producer[t] for t in graph.nodes[i].input if t in graph.producer)
    return got


def attribute_times(graph: Graph, raw: dict, groups: list[list[int]],
                    threads: tuple[int, ...]) -> dict[int, dict[int, float]]:
    """threads -> node position -> median ms: each run's group time split by FLOPs, then the
    median over runs (a group's own time is a sum of ncnn layers, unmatched ones carried in)."""
    weights = {i: max(layer_flops(graph, i), 1) for g in groups for i in g}
    out: dict[int, dict[int, float]] = {}
    for t in threads:
        runs = np.asarray(raw["runs"][str(t)]["layer_ms"], dtype=float)  # runs x ncnn layers
        per_node = np.zeros((runs.shape[0], len(graph.nodes)))
        carry = np.zeros(runs.shape[0])
        for k, group in enumerate(groups):
            carry += runs[:, k]
            if not group:
                continue
            total = sum(weights[i] for i in group)
            for i in group:
                per_node[:, i] += carry * (weights[i] / total)
            carry = np.zeros(runs.shape[0])
        if carry.any():  # unmatched ncnn layers at the end: the last group ran them
            last = next(g for g in reversed(groups) if g)
            total = sum(weights[i] for i in last)
            for i in last:
                per_node[:, i] += carry * (weights[i] / total)
        med = np.median(per_node, axis=0)
        out[t] = {i: float(med[i]) for i in range(len(graph.nodes))}
    return out
