"""Full-size ONNX model-zoo CNNs made from the "light" graphs that the ``onnx`` wheel ships.

The wheel replaces every large weight with ``ConstantOfShape(shape)``; we turn each back into an
initializer filled with seeded He-scaled noise, so the graph, shapes, parameter count and file size
are those of the real zoo model (VGG-19: 143.7 M parameters, 548 MB) and outputs stay finite.
ResNet-101, which the wheel lacks, is its ResNet-50 with the res4 stage grown from 6 to 23 blocks.
No network access is needed, which is why tests and benchmarks use these.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ..core.errors import AutodiceError

# Bumped whenever materialize() makes different weights, so caches of zoo models are refreshed.
WEIGHTS_VERSION = 2

SHIPPED = ("vgg19", "densenet121", "resnet50", "squeezenet", "inception_v1", "inception_v2",
           "shufflenet", "bvlc_alexnet", "zfnet512")

# Deeper ResNets the wheel does not ship: ResNet-50's graph with its res4 stage grown to this many
# bottleneck blocks (ResNet-101 is ResNet-50 with 23 res4 blocks instead of 6, He et al. 2016).
DEEPER = {"resnet101": 23}

ZOO = SHIPPED + tuple(DEEPER)


def light_path(name: str) -> Path:
    """Where the ``onnx`` wheel keeps the light graph of shipped zoo model ``name``."""
    if name not in SHIPPED:
        raise AutodiceError(f'zoo model "{name}" is unknown (known: {", ".join(ZOO)})')
    return Path(onnx.__file__).parent / "backend/test/data/light" / f"light_{name}.onnx"


def light_model(name: str) -> onnx.ModelProto:
    """The light graph of zoo model ``name``: the wheel's, or ResNet-50's grown for a deeper one."""
    if name in DEEPER:
        model = onnx.load(str(light_path("resnet50")))
        _grow_res4(model.graph, DEEPER[name])
        model.graph.name = name
        return model
    return onnx.load(str(light_path(name)))


def _grow_res4(graph: onnx.GraphProto, blocks: int) -> None:
    """Repeat the last res4 identity block (``res4_5``) until res4 has ``blocks`` blocks.

    A block is the ReLU of the previous block's sum, three Conv+BatchNorm (ReLUs between) and the
    Sum with that ReLU's output. Each copy gets its own weights (the ``ConstantOfShape`` nodes are
    copied under the name ``res4_<k>``, so ``materialize`` draws fresh noise for them) and its own
    tensor names; the ReLU after the last block reads the last copy's sum.
    """
    nodes = list(graph.node)
    first = next(i for i, n in enumerate(nodes)
                 if n.op_type == "Conv" and n.input[1] == "gpu_0/res4_5_branch2a_w_0") - 1
    last = next(i for i in range(first, len(nodes)) if nodes[i].op_type == "Sum")
    template, source = nodes[first:last + 1], nodes[first].input[0]
    weights = [n for n in nodes if n.op_type == "ConstantOfShape" and "/res4_5_" in n.output[0]]
    copies, tail = [], nodes[last].output[0]
    for k in range(6, blocks):
        rename = {source: tail}
        for node in weights:
            rename[node.output[0]] = node.output[0].replace("/res4_5_", f"/res4_{k}_")
            copies.append(_copy(node, rename, ""))
        for node in template:
            copies.append(_copy(node, rename, f"_res4_{k}"))
        tail = rename[nodes[last].output[0]]
    for node in nodes[last + 1:]:
        for j, name in enumerate(node.input):
            if name == nodes[last].output[0]:
                node.input[j] = tail
    del graph.node[:]
    graph.node.extend(nodes[:last + 1] + copies + nodes[last + 1:])


def _copy(node: onnx.NodeProto, rename: dict[str, str], suffix: str) -> onnx.NodeProto:
    """``node`` with inputs read through ``rename``; its outputs renamed (``suffix`` appended,
    unless ``rename`` already names them) and recorded in ``rename`` for the nodes after it."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    if node.name:
        copy.name = node.name + suffix
    for j, name in enumerate(node.input):
        copy.input[j] = rename.get(name, name)
    for j, name in enumerate(node.output):
        copy.output[j] = rename.setdefault(name, name + suffix)
    return copy


def _weights(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if len(shape) >= 2:
        fan_in = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in)))
    # 1-D tensors are biases and batch-norm statistics: positive keeps variances valid.
    return rng.uniform(0.5, 1.5, size=shape).astype(np.float32)


def materialize(name: str, seed: int = 0) -> onnx.ModelProto:
    """The zoo model ``name`` with every ``ConstantOfShape`` weight replaced by seeded noise."""
    model = light_model(name)
    graph = model.graph
    rng = np.random.default_rng(seed)
    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    keep, new_inits, dropped = [], [], set()
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in consts:
            shape = tuple(int(d) for d in consts[node.input[0]])
            new_inits.append(numpy_helper.from_array(_weights(shape, rng), node.output[0]))
            dropped.add(node.input[0])
        else:
            keep.append(node)
    inits = [i for i in graph.initializer if i.name not in dropped] + new_inits
    inputs = [i for i in graph.input if i.name not in dropped]
    del graph.node[:]
    graph.node.extend(keep)
    del graph.initializer[:]
    graph.initializer.extend(inits)
    del graph.input[:]
    # Modern exporters do not list initializers as graph inputs (the zoo's originals did); IR 4 is
    # the first version that allows that.
    graph.input.extend(i for i in inputs if i.name not in {t.name for t in inits})
    model.ir_version = max(model.ir_version, 4)
    _temper_logits(model, rng)
    return model


# Ops between the last weighted layer and the Softmax that commute with a positive scale.
_HOMOGENEOUS = {"Relu", "Dropout", "Reshape", "Flatten", "AveragePool", "GlobalAveragePool",
                "MaxPool"}


def _temper_logits(model: onnx.ModelProto, rng: np.random.Generator) -> None:
    """Scale the classifier so the softmax is not saturated.

    Random weights grow activations with depth (ResNet-50's logits reach 1e5), which makes the
    softmax one-hot and any output comparison blind. Scaling the last Gemm/Conv before the Softmax
    by a positive factor scales the logits by the same factor (everything in between is positively
    homogeneous), so one seeded run of onnxruntime can bring their spread to about 2.
    """
    nodes = list(model.graph.node)
    if not nodes or nodes[-1].op_type != "Softmax":
        return
    producer = {o: n for n in nodes for o in n.output}
    node = producer.get(nodes[-1].input[0])
    while node is not None and node.op_type in _HOMOGENEOUS:
        node = producer.get(node.input[0])
    inits = {i.name: i for i in model.graph.initializer}
    if node is None or node.op_type not in ("Gemm", "Conv") or node.input[1] not in inits:
        return
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.append(onnx.ValueInfoProto(name=nodes[-1].input[0]))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape],
                                         dtype=np.float32) for i in session.get_inputs()}
    spread = float(session.run(None, feeds)[0].std())
    if not np.isfinite(spread) or spread <= 0:
        return
    for name in node.input[1:]:
        if name in inits:
            t = inits[name]
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * np.float32(2 / spread),
                                               t.name))


def save(model: onnx.ModelProto, path: Path) -> None:
    """Write ``model``; above 1.8 GB the weights go to an external-data file beside it."""
    big = model.ByteSize() > 1_800_000_000
    onnx.save_model(model, str(path), save_as_external_data=big,
                    location=Path(path).name + ".data" if big else None)


def cached(name: str, seed: int = 0) -> Path:
    """The zoo model ``name`` saved once under ``~/.cache/autodice/zoo`` (benchmarks share it)."""
    path = (Path.home() / ".cache" / "autodice" / "zoo"
            / f"{name}-seed{seed}-v{WEIGHTS_VERSION}.onnx")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        save(materialize(name, seed), tmp)
        os.replace(tmp, path)
    return path
