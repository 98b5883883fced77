"""ONNX's own node conformance tests for CNN operators, run through autodice.

The ``onnx`` wheel ships the generators of its backend tests
(``onnx.backend.test.case.node.collect_testcases``): each case is a one-node model with its
inputs and the outputs the ONNX spec's reference computes. Each case here is taken as a model
user would bring: its first input is the model input, and the rest (weights, biases, pads,
shapes) are initializers holding the test's values. Then, like any model:

1. ``split`` onto one key, and ``gen`` (pnnx, then each conversion checked in ncnn against
   onnxruntime). A refusal at either is an outcome: it must name the ONNX op.
2. The cases that pass gen are built and run as one program: their nodes side by side in one
   model (names prefixed per case), split, gen'd, built and run once, each output compared with
   the case's expected output (shape and values, 1e-4 of its scale). Building and starting a
   program costs ~2.7 s a case alone; this way a hundred cost one.

A case whose input is a batch above one, which ``split`` refuses for ops that read axis 0 as
the batch, is run again as its N frames of one (the model re-declared at batch 1, one copy per
frame), each frame's output against its slice of the expected output.

Outcomes: ``pass``, ``refused`` (split or gen said why, naming the op), ``onnxruntime-differs``
(equal to onnxruntime on the case's model, which differs from the spec's reference there:
autodice's contract is onnxruntime), ``wrong`` (ran and differs: never allowed), ``crash``
(anything but an AutodiceError: never allowed).
"""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

import autodice
from autodice.core.errors import AutodiceError
from autodice.frontend.check import RTOL

CNN_OPS = ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
           "GlobalMaxPool", "BatchNormalization", "InstanceNormalization", "LRN",
           "LayerNormalization", "GroupNormalization", "Relu", "LeakyRelu", "PRelu", "Sigmoid",
           "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu", "Softmax", "LogSoftmax",
           "Softplus", "Mish", "Gelu", "Clip", "Gemm", "MatMul", "Add", "Sub", "Mul", "Div",
           "Sum", "Max", "Min", "Concat", "Flatten", "Reshape", "Transpose", "Squeeze",
           "Unsqueeze", "Pad", "DepthToSpace", "SpaceToDepth", "Resize", "Upsample", "Dropout",
           "Identity", "Slice", "Split", "ReduceMean", "Sqrt", "Exp", "Abs", "Neg", "Pow", "Erf",
           "Tile")
PLATFORM = "edge01, cpu, slots=0\n"


@dataclass
class Case:
    name: str
    op: str
    model: onnx.ModelProto  # first input the model input, the others initializers
    x: np.ndarray
    want: list[np.ndarray]


@dataclass
class Outcome:
    case: str
    op: str
    status: str  # pass, refused, wrong, crash
    detail: str = ""
    rel: float = 0.0


def cases(ops=CNN_OPS, names=None) -> list[Case]:
    """The one-node cases of ``ops`` (or only those named), in the wheel's order."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():  # the generators' own overflow warnings
        warnings.simplefilter("ignore")
        collected = node.collect_testcases(None)
    found = []
    for c in collected:
        if c.model is None or len(c.model.graph.node) != 1 or not c.data_sets:
            continue
        op = c.model.graph.node[0].op_type
        if op not in ops or (names is not None and c.name not in names):
            continue
        inputs, outputs = c.data_sets[0]
        m = onnx.ModelProto()
        m.CopyFrom(c.model)
        g = m.graph
        if not g.input or not isinstance(inputs[0], np.ndarray):
            continue
        for vi, value in list(zip(g.input, inputs))[1:]:
            g.initializer.append(numpy_helper.from_array(np.asarray(value), vi.name))
        del g.input[1:]
        found.append(Case(c.name, op, m, np.asarray(inputs[0]),
                          [np.asarray(o) for o in outputs]))
    return found


def _split_gen(model: onnx.ModelProto, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / "model.onnx")
    (folder / "platform.txt").write_text(PLATFORM)
    layers = [n.name or n.output[0] for n in model.graph.node]
    (folder / "mapping.json").write_text(json.dumps({"edge01_cpu0": layers}))
    autodice.split(folder / "model.onnx", folder / "mapping.json", folder / "platform.txt",
                   folder / "out")
    autodice.gen(folder / "out")


def at_batch_one(case: Case) -> onnx.ModelProto:
    """The case's model with its input (and outputs) declared at batch 1."""
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    for vi in (*m.graph.input, *m.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if dims:
            dims[0].dim_value = 1
    return m


def classify(case: Case, work: Path) -> tuple[Outcome | None, list[tuple[onnx.ModelProto,
                                                                        np.ndarray, list]]]:
    """Split and gen the case alone: its outcome if it stops there, else what to run (the
    model, its input, the outputs wanted; one per frame where its batch is run frame by frame).
    """
    where = work / case.name
    shutil.rmtree(where, ignore_errors=True)
    try:
        try:
            _split_gen(case.model, where / "as-is")
            return None, [(case.model, case.x, case.want)]
        except AutodiceError as e:
            if "a batch of" not in e.problems[0]:
                raise
            model = at_batch_one(case)
            _split_gen(model, where / "frames")
            return None, [(model, case.x[i:i + 1], [w[i:i + 1] for w in case.want])
                          for i in range(len(case.x))]
    except AutodiceError as e:
        return Outcome(case.name, case.op, "refused", " / ".join(e.problems)), []
    except Exception as e:  # noqa: BLE001 - a crash is an outcome the test reports
        return Outcome(case.name, case.op, "crash", f"{type(e).__name__}: {e}"), []


def merged(parts: list[tuple[str, onnx.ModelProto]]) -> onnx.ModelProto:
    """One model holding every part's graph side by side, each name prefixed with its key."""
    opset = _opset(parts[0][1])
    nodes, inputs, outputs, inits = [], [], [], []
    for key, m in parts:
        def name(t: str) -> str:
            return f"{key}/{t}" if t else t
        for n in m.graph.node:
            new = onnx.NodeProto()
            new.CopyFrom(n)
            new.name = name(n.name or n.output[0])
            new.input[:] = [name(t) for t in n.input]
            new.output[:] = [name(t) for t in n.output]
            nodes.append(new)
        for vi_list, into in ((m.graph.input, inputs), (m.graph.output, outputs)):
            for vi in vi_list:
                new = onnx.ValueInfoProto()
                new.CopyFrom(vi)
                new.name = name(vi.name)
                into.append(new)
        for t in m.graph.initializer:
            new = onnx.TensorProto()
            new.CopyFrom(t)
            new.name = name(t.name)
            inits.append(new)
    graph = helper.make_graph(nodes, "conformance", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def run_together(runs: dict[str, list], work: Path) -> list[Outcome]:
    """Build and run every case that passed gen as one program per opset (an op means what its
    opset says); an outcome per case. A program that fails as a whole is tried case by case,
    to name the case at fault."""
    groups: dict[int, dict[str, list]] = {}
    for case, items in runs.items():
        groups.setdefault(_opset(items[0][0]), {})[case] = items
    if len(groups) > 1:
        return [o for group in groups.values() for o in run_together(group, work)]
    try:
        return _run_together(runs, work)
    except Exception as e:  # noqa: BLE001 - each case alone says which
        print(f"conformance: {len(runs)} cases together failed ({type(e).__name__}: "
              f"{str(e)[:300]}); trying them apart", file=sys.stderr)
        if len(runs) == 1:
            case = next(iter(runs))
            op = runs[case][0][0].graph.node[0].op_type
            import traceback

            return [Outcome(case, op, "crash", traceback.format_exc(limit=2))]
        return [o for case, items in runs.items()
                for o in run_together({case: items}, work)]


def _run_together(runs: dict[str, list], work: Path) -> list[Outcome]:
    parts, feeds, wanted = [], {}, {}
    for case, items in runs.items():
        for k, (model, x, want) in enumerate(items):
            key = f"c{len(parts)}"
            parts.append((key, model))
            feeds[f"{key}/{model.graph.input[0].name}"] = x
            wanted[case] = wanted.get(case, []) + [
                (f"{key}/{o.name}", w) for o, w in zip(model.graph.output, want)]
    if not parts:
        return []
    folder = work / f"together-{_opset(parts[0][1])}"
    shutil.rmtree(folder, ignore_errors=True)
    _split_gen(merged(parts), folder)
    autodice.build(folder / "out")
    inputs = {}
    for k, (name, x) in enumerate(feeds.items()):
        np.save(folder / f"in{k}.npy", x.astype(np.float32))
        inputs[name] = folder / f"in{k}.npy"
    got = autodice.run(folder / "out", inputs).outputs
    results = []
    for case, outs in wanted.items():
        op = next(m.graph.node[0].op_type for m, _, _ in runs[case][:1])
        worst, bad = 0.0, ""
        for name, want in outs:
            g = got[name]
            if g.shape != want.shape:
                bad = f"{name.split('/', 1)[1]}: shape {g.shape}, expected {want.shape}"
                break
            scale = float(np.abs(want).max()) if want.size else 0.0
            diff = float(np.abs(g.astype(np.float64) - want).max()) if want.size else 0.0
            worst = max(worst, diff / scale if scale > 0 else diff)
            # The suite's own bound (onnx's backend runner: rtol 1e-3, atol 1e-7 elementwise;
            # some expected outputs are written to 4 digits), and autodice's, 1e-4 of scale.
            if not np.allclose(g, want, rtol=1e-3, atol=1e-7) and not worst <= RTOL:
                bad = f"{name.split('/', 1)[1]}: off by {worst:.3g} of its scale"
        if bad and _onnxruntime_agrees(runs[case], [got[name] for name, _ in outs]):
            results.append(Outcome(case, op, "onnxruntime-differs",
                                   f"{bad}; equal to onnxruntime, which differs from the "
                                   "spec's reference here", worst))
        elif bad:
            results.append(Outcome(case, op, "wrong", bad, worst))
        else:
            frames = f" ({len(runs[case])} frames of batch 1)" if len(runs[case]) > 1 else ""
            results.append(Outcome(case, op, "pass", f"rel {worst:.2g}{frames}", worst))
    return results


def _onnxruntime_agrees(items: list, got: list[np.ndarray]) -> bool:
    """Whether onnxruntime, on the case's own model, gives what autodice gave (1e-4 of scale):
    then autodice kept its contract, equal to onnxruntime, where onnxruntime and the spec's
    reference part (Resize with align_corners, downsampling)."""
    from autodice.frontend.check import difference

    outs = iter(got)
    for model, x, _ in items:
        m = onnx.ModelProto()
        m.CopyFrom(model)
        m.ir_version = min(m.ir_version, 10)
        try:
            import onnxruntime as ort

            sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
            wants = sess.run(None, {m.graph.input[0].name: x})
        except Exception:  # noqa: BLE001 - onnxruntime cannot run it: no second opinion
            return False
        for want in wants:
            if difference(next(outs), want)[1] > RTOL:
                return False
    return True


def conformance(work: Path, ops=CNN_OPS, names=None) -> list[Outcome]:
    """Every case of ``ops`` (or those named) through autodice: one outcome each."""
    outcomes, runs = [], {}
    for case in cases(ops, names):
        stopped, items = classify(case, work)
        if stopped is not None:
            outcomes.append(stopped)
        else:
            runs[case.name] = items
    return outcomes + run_together(runs, work)
