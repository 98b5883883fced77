"""Every conversion checked at ``gen``, before anything is built or deployed.

pnnx can fail in two quiet ways: it writes a layer type ncnn cannot create (the run then dies on
the board with "cannot load ... .param"), or it writes layers that load and compute something
else (a Reduction over no axes: wrong by 100 %, no error anywhere). So each converted sub-model is
loaded by ncnn (``ncnn_check``, built with the runtime) and run, and its outputs are compared
with onnxruntime's. A failure names the rank, its key, the ncnn layer types that do not exist and
the ONNX nodes they came from, or the output that is off and by how much.

Each rank is fed what the model itself gives it: the sub-models chained in onnxruntime on seeded
model inputs (as ``autodice check`` runs them). Random values would leave the domain the layers
expect: a rank cut inside a LayerNorm after its ``Pow`` would take the mean of negative
"squares", and the square root of that is NaN on both sides.
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx

from ..core.errors import AutodiceError
from ..core.plan import Plan, Rank
from ..frontend.axis_views import NCNN_AXES
from ..frontend.check import RTOL, RTOL_FP16, difference, session
from ..frontend.nodes import origin
from .engine import ensure_ncnn
from .fp16_range import Largest
from .tools import build_tools

# np.load reads a .npy header with ast.literal_eval, and CPython 3.11's AST construction keeps
# its recursion depth in state the threads share (python/cpython#106905): two ranks checked at
# once raised "SystemError: AST constructor recursion depth mismatch" in a clean-clone run on
# 3.11.7. The checks' results are read one at a time.
_READING = threading.Lock()


def verify_conversions(plan: Plan, out_dir: Path, ncnn_models: Path,
                       values: dict[str, np.ndarray], fp16_ranks: Collection[int] = (),
                       past_fp16: dict[int, Largest] | None = None, console=None,
                       on_noise: bool = True) -> float:
    """Load and run every rank's ncnn model; compare with its ONNX sub-model, each fed
    ``values`` (:func:`~..frontend.check.chain_values` of the model's inputs: random ones of
    seed 0, ``on_noise``, else the user's frame). Of ``fp16_ranks`` (fp16 weights), a rank in
    ``past_fp16`` that is off is blamed on its values' range, not on pnnx. Returns the largest
    error found (of an output's scale).

    A trained detector fed noise may find nothing: its map sits near 0 (PP-OCR's text detector:
    6e-5 at most), where an error that is nothing on a real frame is a large share of the scale.
    So a mismatch on noise says how to verify on real frames instead. (PP-OCR's was onnxruntime's
    own: its Sigmoid is approximate in the tail, so a Sigmoid is held to the function,
    :func:`_exact_sigmoid`.)

    Raises:
        AutodiceError: one line per rank whose model ncnn cannot load (unknown layer types and
            their ONNX nodes named) or whose outputs differ from onnxruntime's beyond the
            tolerance (the output, the error).
    """
    found = verify_ranks(plan, out_dir, ncnn_models, values, fp16_ranks, past_fp16, console,
                         on_noise)
    problems = [p for said, _ in found.values() for p in said]
    if problems:
        raise AutodiceError(*problems)
    return max((worst for _, worst in found.values()), default=0.0)


def verify_ranks(plan: Plan, out_dir: Path, ncnn_models: Path, values: dict[str, np.ndarray],
                 fp16_ranks: Collection[int] = (), past_fp16: dict[int, Largest] | None = None,
                 console=None, on_noise: bool = True) -> dict[int, tuple[list[str], float]]:
    """:func:`verify_conversions`' findings by rank: its problems (none: it passed) and the
    largest error of its outputs."""
    tools = build_tools(ensure_ncnn(console=console))
    with tempfile.TemporaryDirectory(prefix="autodice-verify-") as tmp:
        def one(rank: Rank) -> tuple[list[str], float]:
            work = Path(tmp) / str(rank.rank)
            work.mkdir()
            fp16 = rank.rank in fp16_ranks
            too_big = (past_fp16 or {}).get(rank.rank) if fp16 else None
            cause = (f"its {too_big.note()}: fp16 may not hold them (gen --precision auto or "
                     f"fp32), or pnnx mis-converted layers of {rank.submodel}" if too_big
                     else f"pnnx mis-converted layers of {rank.submodel}")
            if on_noise:
                cause += (" (checked on random frames: if the model's outputs are near 0 on "
                          "noise, check on a real one with gen --verify-with FRAME)")
            return _verify_rank(rank, out_dir, ncnn_models, tools / "ncnn_check", work,
                                RTOL_FP16 if fp16 else RTOL, values, cause)

        with ThreadPoolExecutor(max_workers=2) as pool:
            return dict(zip((r.rank for r in plan.ranks), pool.map(one, plan.ranks)))


def run_checker(checker: Path, base: Path, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """What ncnn computes (its outputs out0..) with ``base``.param/.bin on ``inputs`` (in0..).

    Raises:
        AutodiceError: ncnn could not load or run it (what ncnn_check said last).
    """
    with tempfile.TemporaryDirectory(prefix="autodice-check-") as tmp:
        paths = [Path(tmp) / f"in{k}.npy" for k in range(len(inputs))]
        for path, x in zip(paths, inputs):
            np.save(path, np.asarray(x, np.float32))
        proc = subprocess.run([str(checker), f"{base}.param", f"{base}.bin", tmp,
                               *map(str, paths)], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            said = (proc.stdout + proc.stderr).strip().splitlines()
            raise AutodiceError(f"ncnn cannot run {base.name}.param: "
                                f"{said[-1] if said else f'exit {proc.returncode}'}")
        outs = sorted(Path(tmp).glob("out*.npy"), key=lambda p: int(p.stem[3:]))
        with _READING:
            return [np.load(p) for p in outs]


def _who(rank: Rank) -> str:
    return f'rank {rank.rank} (key "{rank.key}")'


def _verify_rank(rank: Rank, out_dir: Path, ncnn_models: Path, checker: Path, work: Path,
                 rtol: float, values: dict[str, np.ndarray], cause: str
                 ) -> tuple[list[str], float]:
    floats = all(np.issubdtype(np.dtype(t.dtype), np.floating) for t in rank.submodel_inputs)
    feeds = {t.name: np.asarray(values[t.name], np.float32)
             for t in rank.submodel_inputs} if floats else {}
    paths = []
    for k, t in enumerate(rank.submodel_inputs if floats else ()):
        paths.append(work / f"in{k}.npy")
        np.save(paths[-1], feeds[t.name])
    base = ncnn_models / f"{rank.key}.ncnn"
    proc = subprocess.run([str(checker), f"{base}.param", f"{base}.bin", str(work),
                           *map(str, paths)], capture_output=True, text=True, timeout=600)
    if proc.returncode == 3:
        return [_unknown_layers(rank, out_dir, proc.stdout)], 0.0
    if proc.returncode != 0:
        said = (proc.stdout + proc.stderr).strip().splitlines()
        ops = model_ops(onnx.load(str(out_dir / rank.submodel), load_external_data=False))
        return [f"{_who(rank)}: ncnn cannot load {base.name}.param "
                f"({said[-1] if said else f'exit {proc.returncode}'}), converted from ONNX "
                f"{', '.join(ops[:8])}{' ...' if len(ops) > 8 else ''}"], 0.0
    if not feeds:
        return [], 0.0  # integer inputs: ncnn computes in floats; the load check is all we can do
    problems, worst = [], 0.0
    for k, spec in enumerate(rank.submodel_outputs):
        ref = values[spec.name]
        with _READING:
            got = np.load(work / f"out{k}.npy")
        ref = np.asarray(ref, dtype=np.float32)
        if got.size != ref.size:
            problems.append(f'{_who(rank)}: ncnn computes "{spec.name}"'
                            f"{_made_by(rank, out_dir, spec.name)} with {got.size} elements, "
                            f"onnxruntime {ref.size}: pnnx mis-converted it")
            continue
        diff, rel = difference(got, ref)
        if not rel <= rtol and (exact := _exact_sigmoid(rank, out_dir, feeds, spec.name)) \
                is not None:
            diff, rel = difference(got, exact)
        worst = max(worst, rel)
        if not rel <= rtol:
            problems.append(f'{_who(rank)}: ncnn computes "{spec.name}"'
                            f"{_made_by(rank, out_dir, spec.name)} off by {rel:.3g} of its "
                            f"scale (max |diff| {diff:.3g}, tolerance {rtol:g}) against "
                            f"onnxruntime: {cause}")
    return problems, worst


# pnnx's names for what it could not lower, by the ONNX ops they come from (its torch-level
# ops: ``F.linear`` is a Gemm or a MatMul, ``Tensor.slice`` a Slice).
PNNX_OPS = {
    "F.linear": ("Gemm", "MatMul"), "F.conv1d": ("Conv",), "F.conv2d": ("Conv",),
    "F.conv3d": ("Conv",), "F.conv_transpose2d": ("ConvTranspose",),
    "F.max_pool1d": ("MaxPool",), "F.max_pool2d": ("MaxPool",), "F.max_pool3d": ("MaxPool",),
    "F.avg_pool1d": ("AveragePool",), "F.avg_pool2d": ("AveragePool",),
    "F.avg_pool3d": ("AveragePool",), "F.layer_norm": ("LayerNormalization",),
    "F.group_norm": ("GroupNormalization",), "F.instance_norm": ("InstanceNormalization",),
    "F.batch_norm": ("BatchNormalization",), "F.local_response_norm": ("LRN",),
    "F.prelu": ("PRelu",), "F.pad": ("Pad",), "F.interpolate": ("Resize", "Upsample"),
    "F.pixel_shuffle": ("DepthToSpace",), "F.pixel_unshuffle": ("SpaceToDepth",),
    "Tensor.slice": ("Slice",), "Tensor.reshape": ("Reshape",), "Tensor.view": ("Reshape",),
    "torch.permute": ("Transpose",), "torch.cat": ("Concat",), "Tensor.expand": ("Expand",),
    "torch.flatten": ("Flatten",), "torch.squeeze": ("Squeeze",),
    "torch.unsqueeze": ("Unsqueeze",), "torch.mean": ("ReduceMean",),
}


def onnx_ops(kind: str) -> tuple[str, ...]:
    """The ONNX op types an ncnn or pnnx layer type ``kind`` comes from (its own name when it is
    one: ``Selu``, or pnnx's ``F.selu``)."""
    if kind in PNNX_OPS:
        return PNNX_OPS[kind]
    bare = kind.split(".")[-1].replace("_", "").lower()
    return tuple(op for op in _ONNX_OPS if op.lower() == bare) or (kind,)


_ONNX_OPS = sorted({s.name for s in onnx.defs.get_all_schemas()})


def model_ops(model: onnx.ModelProto) -> list[str]:
    """The op types of a sub-model as the user's model has them: a node a rewrite made counts
    as the op it came from (a Split, not the Slices it became)."""
    ops = {(origin(n) or (n.op_type,))[0] for n in model.graph.node}
    return sorted(ops - {"Constant"})


def describe(node: onnx.NodeProto) -> str:
    """``Gemm node "fc" (transB=1, alpha=0.5)``: an ONNX node as errors name it, with the
    attributes it sets (among them, the one at fault)."""
    attrs = []
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if isinstance(value, (int, float, str)) or (isinstance(value, list) and len(value) <= 8):
            attrs.append(f"{a.name}={value}")
    came = origin(node)
    return (f'{node.op_type} node "{node.name or node.output[0]}"'
            + (f" ({', '.join(attrs)})" if attrs else "")
            + (f', from {came[0]} node "{came[1]}"' if came and came[0] != node.op_type else ""))


def _maker(rank: Rank, out_dir: Path, tensor: str) -> onnx.NodeProto | None:
    """The node of the rank's sub-model that makes ``tensor`` (through the Reshapes a rewrite
    put at its edge)."""
    model = onnx.load(str(out_dir / rank.submodel), load_external_data=False)
    producer = {t: n for n in model.graph.node for t in n.output}
    node = producer.get(tensor)
    while node is not None and node.op_type == "Reshape" and node.input[0] in producer \
            and node.input[0].startswith(tensor):
        node = producer[node.input[0]]
    return node


def _made_by(rank: Rank, out_dir: Path, tensor: str) -> str:
    """`` (the output of ONNX Conv node "c1" (...))``, or ""."""
    node = _maker(rank, out_dir, tensor)
    return f" (the output of ONNX {describe(node)})" if node is not None else ""


def _exact_sigmoid(rank: Rank, out_dir: Path, feeds: dict[str, np.ndarray], tensor: str
                   ) -> np.ndarray | None:
    """``tensor`` as the sigmoid itself of onnxruntime's input to it, where a Sigmoid makes it.

    onnxruntime's Sigmoid is MLAS's rational approximation, good to about 1e-7 absolute. In a
    sigmoid's tail that is no longer small: a seeded YOLO's class scores on noise are 1e-5 to
    2e-4, and onnxruntime's are off by 0.7 % of that scale, where ncnn's 1 / (1 + exp(-x)) is
    within 1e-10 of the function. Held to onnxruntime's own output, every such cut failed."""
    node = _maker(rank, out_dir, tensor)
    if node is None or node.op_type != "Sigmoid":
        return None
    x = session(out_dir / rank.submodel, also=[node.input[0]]).run([node.input[0]], feeds)[0]
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def _unknown_layers(rank: Rank, out_dir: Path, said: str) -> str:
    """One line: the layer types ncnn lacks, and the ONNX nodes they come from."""
    unknown: dict[str, list[str]] = {}
    for line in said.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "unknown-layer":
            unknown.setdefault(parts[1], []).append(parts[2])
    model = onnx.load(str(out_dir / rank.submodel), load_external_data=False)
    found = []
    for kind, layers in unknown.items():
        ops = onnx_ops(kind)
        nodes = [describe(n) for n in model.graph.node if n.op_type in ops] or [
            describe(n) for n in model.graph.node  # pnnx's own kinds: by the layers' names,
            if n.name in layers or set(n.output) & set(layers)] or [  # or what they feed
            describe(n) for n in model.graph.node if set(n.input) & set(layers)]
        where = (f"from ONNX {'; '.join(nodes[:3])}{' ...' if len(nodes) > 3 else ''}" if nodes
                 else f"ncnn layer{'s' if len(layers) > 1 else ''} {', '.join(layers[:5])}")
        found.append(f"{kind} ({where})")
    why = missing_rewrites(model)
    return (f"{_who(rank)}: ncnn has no layer type {'; '.join(found)}: pnnx could not lower "
            f"{'them' if len(found) > 1 else 'it'} to ncnn; "
            + (f"{why}; " if why else "") + "map those layers elsewhere or change how the model "
            "spells them")


def missing_rewrites(model: onnx.ModelProto) -> str:
    """What is left on more than four axes in a sub-model, by the ops that read it: "" when
    nothing, else one clause for an error message (pnnx failed or left layers ncnn lacks)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - a hint only; the caller's error stands without it
        return ""
    g = inferred.graph
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*g.value_info, *g.input, *g.output)}
    high = {t: s for t, s in shapes.items() if len(s) > NCNN_AXES}
    # A Reshape reading one is the seam of a rewrite, not the op that lacks one.
    readers = [(n, t) for n in g.node for t in n.input if t in high and n.op_type != "Reshape"]
    if not readers:
        return ""
    ops = sorted({n.op_type for n, _ in readers})
    shown = ", ".join(f'{n.name or n.output[0]} reads "{t}" '
                      f'({"x".join(map(str, high[t]))})' for n, t in readers[:3])
    more = f" and {len(readers) - 3} more" if len(readers) > 3 else ""
    return (f"no rewrite onto four axes for {', '.join(ops)} ({shown}{more}); ncnn holds at "
            "most four")
