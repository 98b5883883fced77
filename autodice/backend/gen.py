"""``autodice gen``: the plan -> one SPMD C++ program and a package per host.

The program is the plan as data: one table per rank (``templates/program.cpp.j2``), run by the
engine every program shares (``runtime_cpp/autodice_program.cpp``, compiled and tested once).
This module only turns the plan into the numbers and escaped names the template prints; a name
from the model reaches the C++ only through :mod:`autodice.core.names`. Output is byte-stable:
no timestamps, fixed order; ``tests/golden/`` holds Figure 2's program.

``OUT/packages/<host>/`` holds everything a board needs: the program, its CMakeLists.txt, the
runtime library's sources, the rankfile and hostfile, that host's ncnn models and ``run.sh``.
"""

from __future__ import annotations

import json
import operator
import shutil
from collections.abc import Collection
from importlib import resources
from pathlib import Path

import jinja2
import numpy as np

from ..core.errors import AutodiceError, Problems
from ..core.names import Escaped, cpp_comment, cpp_string, finalize
from ..core.onnxio import read_model
from ..core.outdir import claim, staged, tensor_files
from ..core.plan import Plan, Rank, human_bytes, load_plan
from ..frontend.check import chain_values, random_inputs
from ..frontend.tables import hostfile, rankfile
from .convert import convert_all
from .calibrate import calibration_frames, quantize_ranks
from .engine import ensure_ncnn
from .fp16_range import Largest, past_fp16, past_range
from .precision import DEFAULT_KEEP_FP32, Precision, rank_fp16
from .tools import build_tools
from .verify import verify_conversions
from .wire import WIRE_FILE, Wire

DTYPE_ENUM = {"float32": "Float32", "int64": "Int64"}
WIRE_ENUM = {"fp16": "Fp16", "int8": "Int8"}  # fp32, the default, is not written


def _shape(shape) -> str:
    return "x".join(map(str, shape))


def _ints(values) -> Escaped:
    """Comma-joined integers (a C++ brace list's inside); anything else is a bug."""
    return Escaped(", ".join(str(operator.index(v)) for v in values))


def _wire(kind: str) -> Escaped | None:
    return Escaped(f"Wire::{WIRE_ENUM[kind]}") if kind in WIRE_ENUM else None


def rank_context(plan: Plan, r: Rank, files: dict[str, str], precision: Precision = Precision(),
                 kept_fp32: Collection[int] = (), int8: Collection[int] = (),
                 wire: Wire = Wire()) -> dict:
    """One rank's table for the template: every index resolved, every name escaped.

    Tensors are numbered per rank (the sub-model's inputs, then its outputs); ncnn blobs by their
    position (pnnx names a sub-model's inputs in0.. and outputs out0..). A tensor sent to several
    ranks is one send per destination; a destination (or source) with copies lists them all, and
    frame f goes to (comes from) the one whose turn it is (data parallelism).
    """
    turns = [plan.ranks[k].turns() for k in range(len(plan.ranks))]
    in_pos = {t.name: k for k, t in enumerate(r.submodel_inputs)}
    out_pos = {t.name: k for k, t in enumerate(r.submodel_outputs)}
    specs = {t.name: t for t in (*r.submodel_inputs, *r.submodel_outputs)}
    index = {name: k for k, name in enumerate(specs)}
    recv_index = {e.tensor: k for k, e in enumerate(r.recv)}
    layers = list(r.layers)
    summary = ", ".join(layers) if len(layers) <= 4 else f"{layers[0]} ... {layers[-1]}"
    device = (f"cpu, {r.threads} thread{'s' if r.threads > 1 else ''}" if r.device == "cpu"
              else f"gpu {r.gpu_index}")
    stage = r.turns()[0]
    sent, received = wire.rank_bytes(plan, r.rank)
    return {
        "rank": r.rank, "key": cpp_string(r.key), "host": cpp_string(r.host),
        "key_note": cpp_comment(r.key), "host_note": cpp_comment(r.host),
        "device_note": Escaped(device), "slots": _ints(r.slots),
        "device_enum": Escaped("Gpu" if r.device == "gpu" else "Cpu"),
        "gpu_index": r.gpu_index, "threads": r.threads,
        "fp16": Escaped("true" if rank_fp16(r, precision, kept_fp32) else "false"),
        "cpu_fp16": Escaped("true" if precision.of(r) == "fp16" else "false"),
        "int8": Escaped("true" if r.rank in int8 else "false"),
        "replica": r.turns().index(r.rank), "replicas": len(r.turns()),
        "n_layers": len(layers),
        "layers_note": cpp_comment(summary),
        "recv_notes": [{"tensor": cpp_comment(e.tensor), "shape": Escaped(_shape(e.shape)),
                        "dtype": Escaped(e.dtype), "nbytes": e.nbytes, "srcs": _ints(turns[e.src]),
                        "turns": len(turns[e.src]) > 1, "position": in_pos[e.tensor]}
                       for e in r.recv],
        "send_notes": [{"tensor": cpp_comment(e.tensor), "shape": Escaped(_shape(e.shape)),
                        "dtype": Escaped(e.dtype), "nbytes": e.nbytes,
                        "dsts": _ints(q for d in e.dst for q in turns[d]),
                        "many": sum(len(turns[d]) for d in e.dst) > 1} for e in r.send],
        "tensors": [{"name": cpp_string(t.name), "shape": _ints(t.shape),
                     "dtype_enum": Escaped(DTYPE_ENUM.get(t.dtype, "Float32"))}
                    for t in specs.values()],
        "inputs": [{"tensor": index[t], "blob": in_pos[t], "file": cpp_string(files[t])}
                   for t in r.inputs],
        "receives": [{"tensor": index[e.tensor], "blob": in_pos[e.tensor],
                      "srcs": _ints(turns[e.src]), "edge": e.tag,
                      "wire": _wire(wire.of(plan, e, stage))} for e in r.recv],
        "produces": [{"tensor": index[t.name], "blob": k}
                     for k, t in enumerate(r.submodel_outputs)],
        "steps": [{"wait": _ints(recv_index[t] for t in s.wait),
                   "extract": _ints(out_pos[t] for t in s.extract),
                   "note": cpp_comment(", ".join(s.wait)) if s.wait else None} for s in r.steps],
        "sends": [{"tensor": index[e.tensor], "dsts": _ints(turns[d]), "edge": e.tag,
                   "wire": _wire(wire.of(plan, e, d))} for e in r.send for d in e.dst],
        "outputs": [{"produce": out_pos[t], "file": cpp_string(files[t])} for t in r.outputs],
        "bytes_sent": sent, "bytes_received": received,
    }


def _env() -> jinja2.Environment:
    """Templates print only numbers and :class:`~autodice.core.names.Escaped` text: a raw name
    is an error at ``gen`` time, never text in the program (names.finalize)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.files("autodice.templates"))),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=False,
        lstrip_blocks=False, finalize=finalize, autoescape=False)


def render_program(plan: Plan, precision: Precision = Precision(),
                   kept_fp32: Collection[int] = (), int8: Collection[int] = (),
                   wire: Wire = Wire()) -> str:
    """The generated C++ source for ``plan``: the plan as one table per rank (``int8``: those
    with quantized layers; ``wire``: how cut tensors cross hosts)."""
    files = tensor_files(plan)
    ranks = [rank_context(plan, r, files, precision, kept_fp32, int8, wire) for r in plan.ranks]
    ctx = {"model": cpp_string(Path(plan.model).name), "model_note": cpp_comment(
        Path(plan.model).name), "ranks": ranks, "edges": len(plan.edges)}
    return _env().get_template("program.cpp.j2").render(ctx)


def render_cmake() -> str:
    return _env().get_template("CMakeLists.txt.j2").render({})


def render_run_script(plan: Plan) -> str:
    return _env().get_template("run.sh.j2").render({"ranks": len(plan.ranks)})


RUNTIME_SOURCES = ("autodice_types.h", "autodice_runtime.h", "autodice_runtime.cpp",
                   "autodice_tensors.cpp", "autodice_program.h", "autodice_program.cpp",
                   "autodice_stats.h", "autodice_stats.cpp", "autodice_stream.h",
                   "autodice_stream.cpp")


def check_submodels(plan: Plan, out_dir: Path) -> None:
    """Every rank's sub-model is where the plan says and an ONNX model, before pnnx is asked to
    read one (its complaint would not name the file).

    Raises:
        AutodiceError: one line per missing or unreadable sub-model.
    """
    problems = Problems()
    for r in plan.ranks:
        path = out_dir / r.submodel
        if not path.is_file():
            problems.add(f'{path}: no such file (rank {r.rank}, key "{r.key}"); the split is '
                         "incomplete: run `autodice split` again")
            continue
        try:
            read_model(path)
        except AutodiceError as e:
            for line in e.problems:
                problems.add(f'{line} (rank {r.rank}, key "{r.key}")')
    problems.raise_if_any()


def fp16_notes(plan: Plan, precision: Precision, past: dict[int, Largest], console) -> set[int]:
    """Say which ranks' values pass fp16's range; returns those that compute in fp32 instead
    (all of them under ``auto``; none under ``fp16``, which was asked for: a warning then)."""
    kept = set()
    for k, largest in past.items():
        r = plan.ranks[k]
        if precision.of(r) != "fp16":
            kept.add(k)
            console.print(f'rank {k} (key "{r.key}"): {largest.note()}: it computes in fp32 on '
                          "its GPU (fp16 would give inf and NaN)", soft_wrap=True, markup=False)
        else:
            console.print(f'warning: rank {k} (key "{r.key}"): {largest.note()}: in fp16 it may '
                          "compute inf and NaN (gen --precision auto keeps such ranks in fp32)",
                          soft_wrap=True, markup=False)
    return kept


def verify_feeds(plan: Plan, source: str | Path | None = None, preprocess: str | None = None
                 ) -> dict[str, np.ndarray]:
    """What conversions are checked on: the first frame of ``source`` (anything ``run --input``
    streams: an image, a folder of them made frames by ``preprocess``, a batch .npy) as the
    model's inputs, or, ``source`` None, seeded random inputs.

    Raises:
        AutodiceError: one line naming ``source``: no frame in it, or one that cannot be made.
    """
    if source is None:
        return random_inputs(plan, seed=0)
    from .session.results import source_frames

    try:
        _, pairs = source_frames(plan, source, 1, preprocess)
        frame = next(iter(pairs))[1]
    except StopIteration:
        raise AutodiceError(f"--verify-with {source}: no frame in it") from None
    except AutodiceError as e:  # most name the source already
        said = str(e)
        raise AutodiceError(f"--verify-with {said}" if said.startswith(str(source)) else
                            f"--verify-with {source}: {said}") from None
    if isinstance(frame, Exception):
        raise AutodiceError(f"--verify-with {source}: {frame}")
    t = plan.model_inputs[0]
    return {t.name: np.asarray(frame, t.dtype).reshape(t.shape)}


def wire_notes(plan: Plan, wire: Wire, values: dict[str, np.ndarray], console) -> Wire:
    """``wire`` less the fp16 edges whose values pass fp16's range (they travel as fp32: gen
    says which); one line per edge that travels in fewer bytes."""
    def edge(e, d) -> str:
        return (f'edge "{e.tensor}" ({plan.ranks[e.src].host} rank {e.src} -> '
                f"{plan.ranks[d].host} rank {d})")

    kept = set()
    for e, d, kind in wire.smaller(plan):
        value = np.asarray(values.get(e.tensor, 0.0), np.float32)
        finite = np.abs(value[np.isfinite(value)])
        largest = float(finite.max()) if finite.size else 0.0
        if kind == "fp16" and e.tag not in kept and past_range(largest):
            kept.add(e.tag)
            console.print(f"{edge(e, d)}: values up to {largest:.3g}, past fp16's range: it "
                          "travels as fp32", soft_wrap=True, markup=False)
    wire = Wire(wire.kind, frozenset(kept))
    if wire.kind != "fp32" and not kept and not wire.smaller(plan):
        console.print(f"--wire {wire.kind}: no float tensor crosses hosts in this plan: every "
                      "tensor travels as fp32", soft_wrap=True, markup=False)
    for e, d, kind in wire.smaller(plan):
        console.print(f"{edge(e, d)}: {human_bytes(e.nbytes)} -> "
                      f"{human_bytes(wire.nbytes(plan, e, d))} a frame as {kind}",
                      soft_wrap=True, markup=False)
    return wire


def int8_frames(plan: Plan, precision: Precision, calibration: str | Path | None,
                preprocess: str | None, console) -> list[dict[str, np.ndarray]]:
    """The calibration frames the int8 ranks need (none without int8 ranks), read before
    anything is written; a GPU key asked for int8 is told what it computes in instead.

    Raises:
        AutodiceError: int8 ranks and no ``calibration``, or frames that cannot be made.
    """
    for r in plan.ranks:
        if precision.of(r) != precision.computes(r):
            console.print(f'rank {r.rank} (key "{r.key}"): ncnn has no int8 layers on Vulkan: '
                          "it computes as auto (fp16 where its values fit fp16)",
                          soft_wrap=True, markup=False)
    if not precision.int8_ranks(plan):
        return []
    if calibration is None:
        raise AutodiceError("--precision int8 needs --calibration DIR|batch.npy: frames like "
                            "those the model will see (images are made frames by --preprocess)")
    return calibration_frames(plan, calibration, preprocess)


def gen(out_dir: str | Path, precision: str | Precision = "auto", progress=None,
        verify: bool = True, console=None, verify_with: str | Path | None = None,
        preprocess: str | None = None, calibration: str | Path | None = None,
        keep_fp32: tuple[str, ...] | None = None, wire: str | Wire = "fp32") -> Plan:
    """Convert the sub-models, check each conversion, write ``out_dir/packages/<host>/``.

    Args:
        precision: for every key or key by key (:class:`~.precision.Precision`): ``auto``
            (fp16 on GPU ranks whose values fit fp16's range, fp32 on the rest), ``fp32`` (equal
            to onnxruntime to ~1e-6), ``fp16`` (fp16 weights too: smaller) or ``int8`` (CPU
            ranks: convolutions and fully connected layers in int8, calibrated on
            ``calibration``).
        progress: called with each rank as its conversion finishes.
        verify: load and run every converted model with ncnn and compare it with onnxruntime
            (:mod:`.verify`); off only where no C++ toolchain is at hand.
        verify_with: compare on this source's first frame (:func:`verify_feeds`, images made
            frames by ``preprocess``) instead of random ones: a detector finds nothing in noise.
        calibration: the int8 ranks' calibration frames (anything ``run --input`` reads, made
            frames by ``preprocess``).
        keep_fp32: layers int8 ranks keep in fp32 (:func:`~.calibrate.keep_lists`; None:
            ``first,sensitive``).
        wire: how float32 tensors that cross hosts travel (:mod:`.wire`): ``fp32``, ``fp16``
            or ``int8``.

    Raises:
        AutodiceError: no plan, a sub-model pnnx cannot convert, or a conversion ncnn cannot
            load or that computes something else (each names rank, key and what is wrong); int8
            without calibration frames, or frames that cannot be read.
    """
    if console is None:
        from rich.console import Console
        console = Console(stderr=True)
    out_dir = Path(out_dir)
    plan = load_plan(out_dir)
    keep_fp32 = DEFAULT_KEEP_FP32 if keep_fp32 is None else tuple(keep_fp32)
    if not isinstance(precision, Precision):
        precision = Precision.parse(precision, plan)
    if not isinstance(wire, Wire):
        wire = Wire.parse(wire)
    int8_ranks = precision.int8_ranks(plan)
    frames = int8_frames(plan, precision, calibration, preprocess, console)
    check_submodels(plan, out_dir)
    claim(out_dir)  # an autodice output, or nothing is written into it
    fp16_weights = [r.rank for r in plan.ranks if precision.fp16_weights(r)]
    fp16_ranks = [r for r in plan.ranks if rank_fp16(r, precision)]
    values = (chain_values(plan, out_dir, verify_feeds(plan, verify_with, preprocess))
              if verify or fp16_ranks or wire.kind == "fp16" else {})
    past = past_fp16(out_dir, values, fp16_ranks)
    kept_fp32 = fp16_notes(plan, precision, past, console)
    wire = wire_notes(plan, wire, values, console)
    # Converted and checked aside, then renamed in: a failed gen leaves no half of ncnn/.
    with staged(out_dir / "ncnn", owned=True) as converting:
        convert_all(plan, out_dir, converting, fp16_weights, progress)
        if verify:
            verify_conversions(plan, out_dir, converting, values, fp16_weights, past, console,
                               on_noise=verify_with is None)
        int8 = []
        if int8_ranks:
            tools = build_tools(ensure_ncnn(console=console))
            for done in quantize_ranks(plan, out_dir, converting, int8_ranks, frames,
                                       keep_fp32, tools):
                console.print(done.note(), soft_wrap=True, markup=False)
                if done.quantized.int8:
                    int8.append(done.rank.rank)
        claim(out_dir, "ncnn/")
    ncnn_dir = out_dir / "ncnn"
    program = render_program(plan, precision, kept_fp32, int8, wire)
    runtime = resources.files("autodice.runtime_cpp")
    with staged(out_dir / "packages", owned=True) as tmp:
        (tmp / ".precision").write_text(f"{precision}\n")  # no host name starts with "."
        (tmp / WIRE_FILE).write_text(wire.dumps())
        if int8_ranks:  # what a regenerated plan (recover.py) calibrates on
            (tmp / ".calibration").write_text(json.dumps(
                {"source": str(calibration) if str(calibration) == "-" or "://" in
                 str(calibration) else str(Path(calibration).resolve()), "preprocess": preprocess,
                 "keep_fp32": list(keep_fp32)}) + "\n")
        for host in plan.hosts():
            pkg = tmp / host
            (pkg / "runtime").mkdir(parents=True)
            (pkg / "program.cpp").write_text(program)
            (pkg / "CMakeLists.txt").write_text(render_cmake())
            (pkg / "rankfile").write_text(rankfile(plan))
            (pkg / "hostfile").write_text(hostfile(plan))
            run = pkg / "run.sh"
            run.write_text(render_run_script(plan))
            run.chmod(0o755)
            for name in RUNTIME_SOURCES:
                (pkg / "runtime" / name).write_text(runtime.joinpath(name).read_text())
            (pkg / "models").mkdir()
            for r in plan.ranks:
                if r.host == host:
                    for suffix in ("param", "bin"):
                        src = ncnn_dir / f"{r.key}.ncnn.{suffix}"
                        shutil.copyfile(src, pkg / "models" / src.name)
        claim(out_dir, "packages/")
    return plan
