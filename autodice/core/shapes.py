"""The model's tensors as shape inference sees them: static shapes at batch 1, dtypes, sizes.

Apart from the layer table (:mod:`autodice.core.model`, which runs this once per model) because
a shape is what every later stage asks of a tensor, while only the front end needs the layers.
Also the checks on shapes that onnx accepts but no engine would run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from .errors import AutodiceError, Problems
from .onnxio import MAX_ELEMENTS, LazyModel, element_size, elements

# Ops the ncnn/pnnx tool chain cannot convert (control flow, dynamic-output and sequence ops).
# Every one of them has a data-dependent output shape or no tensor semantics at all.
UNSUPPORTED_OPS = frozenset({
    "If", "Loop", "Scan", "NonZero", "NonMaxSuppression", "Unique", "Compress",
    "StringNormalizer", "TfIdfVectorizer", "RandomNormal", "RandomNormalLike", "RandomUniform",
    "RandomUniformLike", "Multinomial", "SequenceAt", "SequenceConstruct", "SequenceEmpty",
    "SequenceErase", "SequenceInsert", "SequenceLength", "SplitToSequence",
    "ConcatFromSequence", "Optional", "OptionalGetElement", "OptionalHasElement", "DFT", "STFT",
})

DTYPE_NAMES = {t: np.dtype(helper.tensor_dtype_to_np_dtype(t)).name
               for t in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE,
                         TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16,
                         TensorProto.UINT16, TensorProto.INT32, TensorProto.UINT32,
                         TensorProto.INT64, TensorProto.UINT64, TensorProto.BOOL)}

Dim = int | str | None  # a static size, a symbolic name, or unknown


@dataclass(frozen=True)
class TensorType:
    shape: tuple[Dim, ...]
    elem_type: int

    @property
    def static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def dtype(self) -> str:
        return DTYPE_NAMES.get(self.elem_type) or TensorProto.DataType.Name(
            self.elem_type).lower() if self.elem_type in TensorProto.DataType.values() \
            else str(self.elem_type)

    @property
    def nbytes(self) -> int:
        n = element_size(self.elem_type)
        for d in self.shape:
            n *= d if isinstance(d, int) else 1
        return n

    def shape_str(self) -> str:
        return "x".join(str(d) if d is not None else "?" for d in self.shape) or "scalar"


def mat_form(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The same bytes on at most the four axes of an ncnn Mat: axes of length one dropped, the
    leading axes merged down to four (Swin-T's 1x8x7x8x7x96 window partition is 56x8x7x96)."""
    axes = [d for d in shape if d != 1] or [1]
    while len(axes) > 4:
        axes[:2] = [axes[0] * axes[1]]
    return tuple(axes)


def parse_input_shapes(specs: tuple[str, ...] | list[str]) -> dict[str, tuple[int, ...]]:
    """``["data=1x3x224x224"]`` -> ``{"data": (1, 3, 224, 224)}``.

    Raises:
        AutodiceError: one line per malformed spec.
    """
    shapes, problems = {}, Problems()
    for spec in specs:
        m = re.fullmatch(r"(.+)=(\d+(?:x\d+)*)", spec.strip())
        if not m:
            problems.add(f'--input-shape "{spec}": expected NAME=DxDx... such as data=1x3x224x224')
            continue
        name = m.group(1)
        if max(len(d) for d in m.group(2).split("x")) > 100:  # Python reads 4300 digits at most
            problems.add(f'--input-shape {name}=...: tensor "{name}" has a dimension past 2^31 '
                         "(the most autodice handles in one tensor)")
            continue
        shape = tuple(int(d) for d in m.group(2).split("x"))
        if name in shapes:
            problems.add(f"--input-shape {name}: given twice")
        elif min(shape) < 1:
            problems.add(f'--input-shape "{spec}": dimensions must be at least 1')
        elif elements(shape) > MAX_ELEMENTS:
            problems.add(f'--input-shape {spec}: tensor "{name}" would hold {elements(shape)} '
                         "elements, past 2^31 (the most autodice handles in one tensor)")
        shapes[name] = shape
    problems.raise_if_any()
    return shapes


def _type_of(value_info) -> TensorType | None:
    t = value_info.type
    if not t.HasField("tensor_type"):
        return None
    tt = t.tensor_type
    if not tt.HasField("shape"):
        return None
    dims: list[Dim] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return TensorType(tuple(dims), tt.elem_type)


def _dynamic(d) -> bool:
    """A dimension the model leaves open: named, unset, or -1 (Paddle's exports). A 0 is a
    size: an empty tensor, which split refuses by name (``--input-shape`` overrides it)."""
    return not d.HasField("dim_value") or d.dim_value < 0


def infer_types(path: Path, lazy: LazyModel, nodes, inputs: list[str],
                input_shapes: dict[str, tuple[int, ...]],
                constants: dict[str, TensorProto] | None = None,
                names: list[str] | None = None) -> dict[str, TensorType]:
    """Shapes and element types of every tensor, for batch 1.

    Inference runs on a model whose large weights are replaced by typed graph inputs, so a
    548 MB model costs what its graph costs. A symbolic leading dimension is taken as batch 1;
    other symbolic dimensions need ``input_shapes``. ``constants`` (folded follower outputs)
    replace the nodes that produce them.

    Inference is strict: a node whose inputs contradict it (MatMul of 8 by 5 columns, a
    kernel_shape longer than the input) is an error naming the node, not a tensor left without
    a type for a later pass to trip over.
    """
    constants = constants or {}
    graph = lazy.proto.graph
    unknown = set(input_shapes) - set(inputs)
    if unknown:
        raise AutodiceError(*(f'--input-shape {n}: the model has no input "{n}" (inputs: '
                              f'{", ".join(inputs)})' for n in sorted(unknown)))
    model = onnx.ModelProto()
    model.ir_version = max(lazy.proto.ir_version, 4)
    model.opset_import.extend(lazy.proto.opset_import)
    model.functions.extend(lazy.proto.functions)
    g = model.graph
    g.node.extend(n for n in nodes if not any(t in constants for t in n.output))
    g.initializer.extend(constants.values())
    problems = Problems()
    for vi in graph.input:
        if vi.name in lazy.tensors:
            continue
        new = g.input.add()
        new.CopyFrom(vi)
        dims = new.type.tensor_type.shape.dim
        if vi.name in input_shapes:
            want = input_shapes[vi.name]
            if len(want) != len(dims):
                problems.add(f"--input-shape {vi.name}: {len(want)} dimensions given, the model's "
                             f"input has {len(dims)}")
                continue
            for d, v in zip(dims, want):
                d.Clear()
                d.dim_value = v
            continue
        for k, d in enumerate(dims):
            if _dynamic(d):  # Paddle's exports write -1 where others name the dim
                d.Clear()
                if k == 0:
                    d.dim_value = 1
    problems.raise_if_any()
    for name, ref in lazy.tensors.items():
        if name in lazy.small:
            g.initializer.append(lazy.small[name])
        else:
            g.input.append(helper.make_tensor_value_info(name, ref.data_type, ref.dims))
    g.output.extend(graph.output)
    for vi in g.output:  # a declared -1 or 0 would contradict what batch 1 infers
        for d in vi.type.tensor_type.shape.dim:
            if _dynamic(d) or d.dim_value == 0:
                d.Clear()
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception as e:  # onnx raises several C++-bound error types
        causes = inference_errors(path, str(e), nodes, names)
        if causes:
            raise AutodiceError(*causes) from None
        # Only ops ncnn cannot run failed (a Loop's body): the mapping check names them better.
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    types: dict[str, TensorType] = {
        name: TensorType(tuple(c.dims), c.data_type) for name, c in constants.items()}
    for vi in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        t = _type_of(vi)
        if t is not None and (vi.name not in types or t.static):
            types[vi.name] = t
    for name, ref in lazy.tensors.items():
        types[name] = TensorType(ref.dims, ref.data_type)
    read = {t for n in model.graph.node for t in n.input} | {o.name for o in g.output}
    unknown = [t for n in model.graph.node for t in n.output
               if t in read and not (t in types and types[t].static)]  # not Dropout's mask
    if unknown and not any(n.op_type in UNSUPPORTED_OPS for n in model.graph.node):
        types.update(_measured(model, unknown))
    return types


def _measured(model: onnx.ModelProto, tensors: list[str]) -> dict[str, TensorType]:
    """The types of ``tensors`` as onnxruntime makes them, for those onnx cannot infer.

    onnx's inference stops at some ops it has no rule for at an opset (a GroupNormalization of
    opset 18, whose scale is per group), and every tensor after it would have no shape, so no
    cut there could be made. A CNN's shapes follow from its input's, not from its values (the
    ops whose output shapes depend on values are refused anyway: ``UNSUPPORTED_OPS``), so one
    run on zeros measures them: inputs and the large weights (graph inputs here) alike. Empty
    where onnxruntime cannot run it either.
    """
    import onnxruntime as ort

    feeds = {}
    for vi in model.graph.input:
        t = _type_of(vi)
        if t is None or not t.static:
            return {}
        feeds[vi.name] = np.zeros(t.shape, helper.tensor_dtype_to_np_dtype(t.elem_type))
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(onnx.ValueInfoProto(name=t) for t in tensors)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        got = ort.InferenceSession(probe.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"]).run(tensors, feeds)
    except Exception:  # noqa: BLE001 - onnxruntime cannot either: the shapes stay unknown
        return {}
    return {t: TensorType(tuple(v.shape), helper.np_dtype_to_tensor_dtype(v.dtype))
            for t, v in zip(tensors, got)}


def inference_errors(path: Path, said: str, nodes, names: list[str] | None) -> list[str]:
    """onnx's strict inference complaint as one line per node, by the node's layer name.

    A node that fails leaves its outputs untyped, so every node after it complains that an
    input has no type: those echoes are not causes. Nor are ops ncnn cannot run anyway
    (``UNSUPPORTED_OPS``), which the mapping check reports by key. Empty: no cause left.
    """
    layer = {n.name: names[i] for i, n in enumerate(nodes)} if names else {}
    found = re.findall(r"\(op_type:([^,]*), node name: ([^)]*)\): (?:\[\w+\] )?(.*)", said)
    if not found:
        return [f"{path}: shape inference failed: {said.splitlines()[0]}"]
    return [f'{path}: node "{layer.get(name, name)}" ({op}): {what.strip()}'
            for op, name, what in found
            if "but instead is null" not in what and op not in UNSUPPORTED_OPS][:20]


def check_types(path: Path, nodes, names: list[str], types: dict[str, TensorType],
                producer: dict[str, int]) -> None:
    """What shape inference accepts but no engine would run: tensors past 2^31 elements (a typo
    in --input-shape), and Conv weights that do not fit their input (onnx infers the output
    from the weights alone).

    Raises:
        AutodiceError: one line per offending tensor or node.
    """
    problems = Problems()
    over: set[str] = set()  # reported where a tensor first grows past, not downstream of it
    for name in sorted(types, key=lambda t: producer.get(t, -1)):
        t = types[name]
        if not (t.static and elements(t.shape) > MAX_ELEMENTS):
            continue
        over.add(name)
        if name in producer and over & set(nodes[producer[name]].input):
            continue
        source = f' (output of node "{names[producer[name]]}")' if name in producer else ""
        problems.add(f'{path}: tensor "{name}"{source} would hold {elements(t.shape)} '
                     f"elements ({t.shape_str()}), past 2^31 (the most autodice handles in "
                     "one tensor)", f"{path}: and {{n}} more tensors past 2^31 elements")
    for i, n in enumerate(nodes):
        if n.op_type in ("Conv", "ConvTranspose") and len(n.input) >= 2:
            _check_conv(path, n, names[i], types, problems)
    problems.raise_if_any()


def _check_conv(path: Path, node, layer: str, types: dict[str, TensorType],
                problems: Problems) -> None:
    x, w = types.get(node.input[0]), types.get(node.input[1])
    if x is None or w is None or len(x.shape) < 2 or len(w.shape) < 2:
        return
    group = next((a.i for a in node.attribute if a.name == "group"), 1) or 1
    # Conv: W is M x C/group x k...; ConvTranspose: W is C x M/group x k...
    channels, per_group = x.shape[1], w.shape[1] if node.op_type == "Conv" else w.shape[0]
    takes = per_group * group if node.op_type == "Conv" else per_group
    if isinstance(channels, int) and isinstance(takes, int) and channels != takes:
        problems.add(f'{path}: node "{layer}" ({node.op_type}): input "{node.input[0]}" has '
                     f'{channels} channels, weight "{node.input[1]}" ({w.shape_str()}, group '
                     f"{group}) takes {takes}")
    if len(node.input) >= 3 and node.input[2] and node.input[2] in types:
        b, m = types[node.input[2]], w.shape[0] if node.op_type == "Conv" else w.shape[1] * group
        if b.static and isinstance(m, int) and b.shape != (m,):
            problems.add(f'{path}: node "{layer}" ({node.op_type}): bias "{node.input[2]}" is '
                         f"{b.shape_str()}, the weight makes {m} channels")
