"""Spelling a sub-model so pnnx converts it right: rewrites of ONNX that mean the same thing.

pnnx (ONNX -> ncnn) mis-converts some correct ONNX, silently or with a layer ncnn cannot load.
Each rewrite here was found by running real models distributed and comparing with onnxruntime,
and each keeps the function exactly:

* Softmax before opset 13 on inputs of rank > 2 (SqueezeNet): through a 2-D reshape.
* AveragePool with asymmetric pads (Inception-v1): zero padding + an unpadded pool.
* 4-D and 5-D inputs read only by batch-blind ops: an identity MaxPool tells pnnx axis 0 is the
  batch (else a 5-D Transpose becomes an identity).
* Gather with constant indices that are an arithmetic range, in any shape and on any axis
  (torch's dynamo exporter, ConvNeXt's head; ``select``/``narrow``): a Slice and a Reshape (ncnn
  has no Gather layer).
* Opset 18's Reduce* with the axes as an input (dynamo exports): pnnx reads a one-element axes
  input as a scalar and writes a Reduction over no axes (a LayerNorm over channels then comes out
  wrong by 100 %, with no error); the axes become an attribute again and the sub-model opset 17,
  when no other op of it changed at opset 18.
* Dynamo's GELU (Erf, then the halving, then x) in TorchScript's order, which pnnx fuses into
  one ncnn GELU layer (speed only: both orders compute the same bits).
* The IR version: pnnx's bundled onnxruntime refuses IR 14 (what onnx 1.23's make_model stamps)
  and pnnx then crashes; a sub-model gets the lowest opset its ops allow (the same schemas) and
  the lowest IR that opset allows.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..core.model import Graph
from ..core.onnxio import read_array
from ..core.plan import TensorSpec
from .exporters import respell
from .nodes import mark_origin

LEGACY_SOFTMAX = ("Softmax", "LogSoftmax", "Hardmax")


def main_opset(model) -> int:
    """The version of the default (ai.onnx) opset."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _through_2d(graph: Graph, node: onnx.NodeProto, shape2d: list[int],
                **attrs) -> list[onnx.NodeProto]:
    """``node`` applied to its first input reshaped to ``shape2d``, the result reshaped back."""
    name, x, y = node.name or node.output[0], node.input[0], node.output[0]

    def const(suffix: str, values) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [f"{name}/{suffix}"], name=f"{name}/{suffix}",
                                value=helper.make_tensor(f"{name}/{suffix}", onnx.TensorProto.INT64,
                                                         [len(values)], values))

    return [const("shape2d", shape2d), const("shape", list(graph.types[y].shape)),
            helper.make_node("Reshape", [x, f"{name}/shape2d"], [f"{name}/2d"], name=f"{name}/2d"),
            helper.make_node(node.op_type, [f"{name}/2d", *node.input[1:]], [f"{name}/out2d"],
                             name=name, **attrs),
            helper.make_node("Reshape", [f"{name}/out2d", f"{name}/shape"], [y],
                             name=f"{name}/back")]


def _ints(node: onnx.NodeProto, name: str) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == name), None)


def _explicit_pads(graph: Graph, node: onnx.NodeProto, pads: list[int]) -> list[onnx.NodeProto]:
    """AveragePool with asymmetric pads (Inception-v1's last pool pads only bottom and right),
    which pnnx leaves as an op ncnn does not have, spelled as zero padding + unpadded
    AveragePool, times the window size over what onnxruntime divides each window by: its real
    elements (count_include_pad=0), else the window up to the padding's edge (smaller than the
    window only where ceil_mode's part windows reach past the padding: zeros there too)."""
    name, x, y = node.name or node.output[0], node.input[0], node.output[0]
    (kh, kw), (sh, sw) = _ints(node, "kernel_shape"), _ints(node, "strides") or [1, 1]
    _, _, h, w = graph.types[x].shape
    _, _, oh, ow = graph.types[y].shape
    past = [max(0, (oh - 1) * sh + kh - (h + pads[0] + pads[2])),  # ceil_mode's part windows
            max(0, (ow - 1) * sw + kw - (w + pads[1] + pads[3]))]
    # Zeros concatenated on each padded side: pnnx converts Concat, not opset-9 Pad.
    c, pad, cur, size = graph.types[x].shape[1], [], x, [h, w]
    for axis, before, after in ((2, pads[0], pads[2] + past[0]), (3, pads[1], pads[3] + past[1])):
        parts = []
        for side, n in (("before", before), ("after", after)):
            if n:
                shape = [1, c, *size]
                shape[axis] = n
                zeros = f"{name}/zeros{axis}{side}"
                pad.append(helper.make_node("Constant", [], [zeros], name=zeros,
                                            value=numpy_helper.from_array(
                                                np.zeros(shape, np.float32), zeros)))
                parts.append((side, zeros))
        if not parts:
            continue
        out = f"{name}/padded{axis}"
        pad.append(helper.make_node(
            "Concat", [z for sd, z in parts if sd == "before"] + [cur]
            + [z for sd, z in parts if sd == "after"], [out], name=out, axis=axis))
        cur, size[axis - 2] = out, size[axis - 2] + before + after
    pool = helper.make_node("AveragePool", [cur], [y], name=name,
                            kernel_shape=[kh, kw], strides=[sh, sw])
    if next((a.i for a in node.attribute if a.name == "count_include_pad"), 0):
        if not any(past):
            return [*pad, pool]
        rows = np.array([min(i * sh + kh, h + pads[0] + pads[2]) - i * sh for i in range(oh)])
        cols = np.array([min(j * sw + kw, w + pads[1] + pads[3]) - j * sw for j in range(ow)])
    else:
        rows = np.array([min(i * sh - pads[0] + kh, h) - max(i * sh - pads[0], 0)
                         for i in range(oh)])
        cols = np.array([min(j * sw - pads[1] + kw, w) - max(j * sw - pads[1], 0)
                         for j in range(ow)])
    scale = (kh * kw / np.outer(rows, cols)).astype(np.float32).reshape(1, 1, oh, ow)
    pool.output[0] = f"{name}/sum"
    return [*pad, pool,
            helper.make_node("Constant", [], [f"{name}/scale"], name=f"{name}/scale",
                             value=numpy_helper.from_array(scale, f"{name}/scale")),
            helper.make_node("Mul", [f"{name}/sum", f"{name}/scale"], [y], name=f"{name}/mean")]


def legalize(graph: Graph, node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto] | None:
    """The same function in a spelling pnnx converts correctly, or None if ``node`` is fine:
    the rules for what exporters write (:mod:`.exporters`), then the ones here on what those
    give."""
    spelled = respell(graph, node, opset)
    if spelled is None:
        rewrite = _legalize(graph, node, opset)
        return mark_origin(rewrite, node) if rewrite is not None else None
    return mark_origin([m for n in spelled for m in (_legalize(graph, n, opset) or [n])], node)


def _legalize(graph: Graph, node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto] | None:
    """The same function in a spelling pnnx converts correctly, or None if ``node`` is fine.

    Before opset 13, Softmax(axis=a) flattens the input to 2-D at ``a``; pnnx converts that
    wrongly for inputs of rank > 2 (SqueezeNet's 1x1000x1x1 comes out all ones). It becomes
    Reshape to 2-D, Softmax, Reshape back. AveragePool with asymmetric pads: see
    ``_explicit_pads``.
    """
    if node.input and node.input[0] not in graph.types:
        return None  # a node a rule of .exporters made: it spells what pnnx converts
    shape = graph.types[node.input[0]].shape if node.input else ()
    if node.op_type == "AveragePool" and len(shape) == 4:
        pads = list(_ints(node, "pads") or [0, 0, 0, 0])
        if pads[:2] != pads[2:]:
            return _explicit_pads(graph, node, pads)
    if node.op_type in LEGACY_SOFTMAX and opset < 13 and len(shape) > 2:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1) % len(shape)
        rows = 1
        for d in shape[:axis]:
            rows *= d
        return _through_2d(graph, node, [rows, -1], axis=1)
    return None


# Ops from which pnnx learns that axis 0 of a 4-D tensor is the batch axis.
BATCH_OPS = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
                       "GlobalMaxPool", "BatchNormalization", "InstanceNormalization", "LRN"})


def pin_batch(g: onnx.GraphProto, inputs: tuple[TensorSpec, ...]) -> None:
    """Put an identity MaxPool (1, 1x1, or 1x1x1) in front of 3-D, 4-D and 5-D inputs that only
    batch-blind ops read.

    pnnx decides whether axis 0 is the batch from the ops that read a tensor. A sub-model whose
    input goes straight into Mul/Add/Concat/MatMul (a DenseNet cut inside its batch norm, spelled
    Mul + Add; Figure 2's FC1 + Add1) gets no hint, and pnnx then takes 1x64x56x56 for a 4-D
    tensor without batch: a 64-vector broadcasts along the wrong axis and the rank sends 4x the
    elements. A 5-D input (ShuffleNet's channel shuffle cut between its Reshape to 1x2xCxHxW and
    its Transpose) is worse: pnnx finds no batch, has no 5-D Permute, and writes an identity in
    its place, with no error. A 3-D input is a transformer's 1x197x192 tokens: pnnx keeps
    the leading 1 of a tensor it finds no batch for, and adding it to tokens it knows batched
    (those a Linear or LayerNorm reads) broadcast 197 times the elements (DeiT, EdgeNeXt). A
    MaxPool tells pnnx; in ncnn it is one copy of the tensor.
    """
    for spec in inputs:
        if len(spec.shape) not in (3, 4, 5) or spec.shape[0] != 1 or spec.dtype != "float32":
            continue
        users = [n for n in g.node if spec.name in n.input]
        if all(n.op_type in BATCH_OPS for n in users):
            continue
        pinned = f"{spec.name}/batch"
        for n in users:
            n.input[:] = [pinned if t == spec.name else t for t in n.input]
        g.node.insert(0, helper.make_node("MaxPool", [spec.name], [pinned], name=pinned,
                                          kernel_shape=[1] * (len(spec.shape) - 2)))


class Constants:
    """Values of the small initializers and Constant nodes a rewrite may read, parsed on demand
    (a rank of DenseNet-121 holds hundreds of small tensors and the rewrites read a few)."""

    def __init__(self, model: onnx.ModelProto, graph: Graph):
        self._graph = graph
        self._nodes = {n.output[0]: n.attribute[0].t for n in model.graph.node
                       if n.op_type == "Constant" and n.attribute
                       and n.attribute[0].name == "value"}
        self._cache: dict[str, np.ndarray | None] = {}

    def get(self, name: str) -> np.ndarray | None:
        if name not in self._cache:
            tensor = self._nodes.get(name, self._graph.lazy.small.get(name))
            if tensor is not None:
                # A small initializer may still live in external data beside the model.
                self._cache[name] = numpy_helper.to_array(tensor, str(self._graph.path.parent))
            elif self._graph.is_weight(name):
                # Past the small-tensor bound (768 int64 indices are 6 KB, as one torch release
                # exports ConvNeXt's head): read from the file, only because a rewrite asks.
                self._cache[name] = read_array(self._graph.tensors[name])
            else:
                self._cache[name] = None
        return self._cache[name]


def as_range(indices: np.ndarray, n: int) -> tuple[int, int, int] | None:
    """``(start, step, count)`` when the flattened ``indices`` into an axis of length ``n`` are
    ``start + step * arange(count)`` (negative indices counted from the end, as Gather does),
    else None. Out-of-range indices are None too: Gather would fail, so nothing is rewritten."""
    flat = indices.astype(np.int64).ravel()
    if flat.size == 0 or (flat < -n).any() or (flat >= n).any():
        return None
    flat = np.where(flat < 0, flat + n, flat)
    step = int(flat[1] - flat[0]) if flat.size > 1 else 1
    if step == 0 or not np.array_equal(flat, flat[0] + step * np.arange(flat.size)):
        return None
    return int(flat[0]), step, flat.size


def gather_by_range(graph: Graph, node: onnx.NodeProto, constants: Constants,
                    opset: int) -> list[onnx.NodeProto] | None:
    """Gather(x, indices) on any axis, where the constant indices are an arithmetic range in any
    shape, is Slice(x) on that axis then Reshape to Gather's output shape; None for any other
    Gather. ncnn has no Gather layer, and exporters write such Gathers over activations: torch's
    dynamo spells an ``as_strided`` after a mean as a Gather of ``arange(768).reshape(1,768,1,1)``
    from the flattened mean (ConvNeXt's head), a ``select`` as a scalar index, a ``narrow`` as a
    short range. Needs x's static shape; a step other than 1 needs opset 10 (Slice's steps)."""
    if node.op_type != "Gather" or len(node.input) < 2:
        return None
    indices = constants.get(node.input[1])
    x = graph.types.get(node.input[0])
    # Integer data is shape plumbing, which the followers pass folds: only activations here.
    if indices is None or x is None or not x.static or not x.shape or "float" not in x.dtype:
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % len(x.shape)
    found = as_range(indices, x.shape[axis])
    if found is None:
        return None
    start, step, count = found
    if step != 1 and opset < 10:
        return None
    name = node.name or node.output[0]
    out_shape = [*x.shape[:axis], *indices.shape, *x.shape[axis + 1:]]

    def const(suffix: str, values) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [f"{name}/{suffix}"], name=f"{name}/{suffix}",
                                value=numpy_helper.from_array(np.array(values, np.int64),
                                                              f"{name}/{suffix}"))

    nodes, sliced = [], node.input[0]
    if not (step == 1 and count == x.shape[axis]):
        sliced = f"{name}/slice"
        # Past the last element: a negative step's end may be -1 - n, which Slice clamps to
        # "before the first"; a plain -1 would mean the last element.
        end = start + step * count if step > 0 or start + step * count >= 0 else -x.shape[axis] - 1
        if opset < 10:
            nodes.append(helper.make_node("Slice", [node.input[0]], [sliced], name=sliced,
                                          starts=[start], ends=[end], axes=[axis]))
        else:
            nodes += [const("starts", [start]), const("ends", [end]), const("axes", [axis]),
                      const("steps", [step]),
                      helper.make_node("Slice", [node.input[0], f"{name}/starts", f"{name}/ends",
                                                 f"{name}/axes", f"{name}/steps"], [sliced],
                                       name=sliced)]
    return nodes + [const("shape", out_shape),
                    helper.make_node("Reshape", [sliced, f"{name}/shape"], list(node.output),
                                     name=name)]


def _scalar(constants: Constants, name: str, value: float) -> bool:
    v = constants.get(name)
    return v is not None and v.size == 1 and bool(np.isclose(float(v.ravel()[0]), value))


def gelu_in_pnnx_order(g: onnx.GraphProto, constants: Constants) -> None:
    """Dynamo's GELU, ``x * (0.5 * (erf(x / sqrt2) + 1))``, in TorchScript's order,
    ``(x * (erf(x / sqrt2) + 1)) * 0.5``, which pnnx fuses into one ncnn GELU layer instead of
    five element-wise passes over the MLP's widest tensor (ConvNeXt). Halving is exact in
    floating point, so both orders give the same result; the inner Mul changes what it
    multiplies only when nothing else reads its output.
    """
    producer = {t: n for n in g.node for t in n.output}
    readers: dict[str, int] = {}
    for n in g.node:
        for t in n.input:
            readers[t] = readers.get(t, 0) + 1
    outputs = {o.name for o in g.output}
    for outer in g.node:
        if outer.op_type != "Mul" or len(outer.input) != 2:
            continue
        a, b = outer.input
        for x, m in ((a, b), (b, a)):
            inner = producer.get(m)
            if (inner is None or inner.op_type != "Mul" or readers.get(m) != 1
                    or m in outputs):
                continue
            half = next((t for t in inner.input if _scalar(constants, t, 0.5)), None)
            add = producer.get(next((t for t in inner.input if t != half), ""))
            if half is None or add is None or add.op_type != "Add":
                continue
            erf = next((producer[t] for t in add.input if t in producer
                        and producer[t].op_type == "Erf"), None)
            if erf is None or not any(_scalar(constants, t, 1.0) for t in add.input):
                continue
            div = producer.get(erf.input[0])
            if (div is None or div.op_type != "Div" or div.input[0] != x
                    or not _scalar(constants, div.input[1], float(np.sqrt(2.0)))):
                continue
            inner.input[:] = [x, add.output[0]]
            outer.input[:] = [m, half]
            break


AXES_INPUT_AT_18 = frozenset({"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                              "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"})


def reduce_axes_as_attributes(model: onnx.ModelProto, constants: Constants) -> None:
    """At opset 18, move constant Reduce* axes back into an attribute and make the model opset
    17, when every other op means the same at 17 (else leave the model alone: gen's conversion
    check compares ncnn with onnxruntime and says if it went wrong)."""
    opset = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset.version < 18:
        return
    reduces = [n for n in model.graph.node if n.op_type in AXES_INPUT_AT_18 and n.domain == ""]
    if not reduces:
        return
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx") or n.op_type in AXES_INPUT_AT_18:
            continue
        try:
            changed = onnx.defs.get_schema(n.op_type, opset.version, n.domain).since_version > 17
        except onnx.defs.SchemaError:
            return
        if changed:
            return
    for n in reduces:
        noop = next((a.i for a in n.attribute if a.name == "noop_with_empty_axes"), 0)
        axes = constants.get(n.input[1]) if len(n.input) > 1 and n.input[1] else None
        if (axes is None and len(n.input) > 1 and n.input[1]) or (axes is None and noop):
            return  # axes computed at run time, or "no axes means identity": not expressible
    for n in reduces:
        axes = constants.get(n.input[1]) if len(n.input) > 1 and n.input[1] else None
        keep = [a for a in n.attribute if a.name != "noop_with_empty_axes"]
        if axes is not None and axes.size:  # (empty: every axis, as no attribute says at 17)
            keep.append(helper.make_attribute("axes", [int(v) for v in axes.ravel()]))
        del n.input[1:]
        del n.attribute[:]
        n.attribute.extend(keep)
    opset.version = 17


def _same_but_types(old, new) -> bool:
    """Whether two versions of an op's schema differ in the element types they admit alone
    (DepthToSpace at opset 28 took more types, float among them as at 13): the same text, the
    same attributes with the same defaults, the same inputs and outputs. (Softmax 11 and 13,
    whose axis changed meaning, differ in their text and default.)"""
    def form(schema):
        return (schema.doc,
                {a: (v.type, v.description, v.default_value.SerializeToString())
                 for a, v in schema.attributes.items()},
                [(i.name, i.option) for i in schema.inputs],
                [(o.name, o.option) for o in schema.outputs])

    floats = {c.type_param_str: "tensor(float)" in c.allowed_type_strs
              for c in old.type_constraints}
    return form(old) == form(new) and all(floats.values())


# Opsets up to 22 need IR 10 at most, which every onnxruntime and pnnx of this project reads;
# only a model stamped later is moved down.
READ_EVERYWHERE = 22


def lowest_equivalent_opset(model: onnx.ModelProto) -> None:
    """Stamp the model with the lowest default-domain opset at which every op of it computes
    what it computes now on float tensors (each op's schema back to where it last changed in
    more than the types it admits): onnx 1.23's test models say opset 28, which needs IR 14,
    and neither the installed onnxruntime nor pnnx's reads that, for a DepthToSpace that has
    meant the same on floats since opset 13. Not below :data:`READ_EVERYWHERE`, and only where
    onnx's strict inference accepts the model there; a model with an op unknown to this onnx, or
    with functions, keeps its opset."""
    opset = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or model.functions or opset.version <= READ_EVERYWHERE:
        return
    least = READ_EVERYWHERE
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx"):
            continue
        try:
            schema = onnx.defs.get_schema(n.op_type, opset.version)
        except onnx.defs.SchemaError:
            return
        while schema.since_version > 1:
            try:
                older = onnx.defs.get_schema(n.op_type, schema.since_version - 1)
            except onnx.defs.SchemaError:  # the op's first version
                break
            if not _same_but_types(older, schema):
                break
            schema = older
        least = max(least, schema.since_version)
    if least >= opset.version:
        return
    was, opset.version = opset.version, least
    try:  # a type an op takes only since its later version (Pow's int exponent): keep it there
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception:  # noqa: BLE001 - onnx's inference errors have no one type
        opset.version = was


IR_MIN_FOR_FUNCTIONS = 8  # model-local functions arrived with IR 8


def ir_version(model: onnx.ModelProto) -> int:
    """The lowest IR version the model's opsets (and functions) allow, at least 4 (initializers
    outside the graph inputs): what every converter reads."""
    need = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    return max(4, need, IR_MIN_FOR_FUNCTIONS if model.functions else 0)
