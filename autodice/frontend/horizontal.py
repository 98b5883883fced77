"""Horizontal partitioning: one layer computed by several keys, as a rewrite of the model.

A layer listed under k keys is split k ways before anything else happens: the model is rewritten
so each key gets a *part* of the layer, Slice nodes cut what each part reads (on the producer's
key, so only the slice travels), and a Concat node puts the whole tensor back together on the
key of the first layer that needs it whole. Placement, edges, steps, sub-models and the program
then see an ordinary vertical mapping of the rewritten model, so the early-post /
send-when-ready discipline and pipelining hold unchanged, and the sub-models, tables and memory
estimate say exactly which slice each rank holds and sends.

Two splits:

* ``channels`` (Conv with any group count, Gemm, MatMul by a weight): each part computes a range
  of output channels and holds only its slice of the weights -- what lets a small board hold
  part of VGG's fully connected layers. Layers that act per channel (activations, BatchNorm,
  Dropout...) listed under the same keys follow the split without gathering.
* ``rows`` (Conv, MaxPool, AveragePool, and per-element layers between them): each part computes a
  band of output rows from its band of input rows plus the halo the kernel, stride, dilation and
  padding need. Consecutive layers split by rows over the same keys keep their bands (fused
  tiles: the halo of the whole run is cut once, at its start); the bands are gathered only
  where a layer needs the whole map.

Shares: equal by default, or given per key (``{"layer": "fc6", "share": 0.7}``), e.g. in
proportion to the keys' speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..core.errors import AutodiceError, Problems
from ..core.model import Graph
from ..core.onnxio import LazyModel, TensorFile, TensorRef, read_array

KINDS = ("channels", "rows")
# Layers that act on each channel (and each row) alone: they follow a split without gathering.
PER_ELEMENT = frozenset({"Relu", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "Clip", "Elu", "Selu",
                         "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Erf", "Gelu",
                         "Dropout", "Identity", "Abs", "Neg", "Exp", "Sqrt", "Mish"})
CHANNEL_LAYERS = frozenset({"Conv", "Gemm", "MatMul"})
ROW_LAYERS = frozenset({"Conv", "MaxPool", "AveragePool"})


@dataclass(frozen=True)
class Split:
    """A layer the mapping lists under several keys."""

    layer: str
    keys: tuple[str, ...]  # in mapping (rank) order: part i runs on keys[i]
    kind: str  # "channels" | "rows" | "" (the default for the layer's type)
    shares: tuple[float, ...]  # relative work per key, summing to 1


@dataclass(frozen=True)
class Derived:
    """A node the rewrite made: the layer it computes part of, and how much of its work."""

    origin: str
    fraction: float  # 0 for the Slice and Concat nodes that move data


class _View:
    """A weight and the part of it a split takes, read from the file only when needed."""

    def __init__(self, ref: TensorRef, index: tuple = ()):
        self.ref, self.index = ref, index

    @property
    def tensor(self) -> str:
        return self.ref.name

    @property
    def shape(self) -> tuple[int, ...]:
        # The shape of the indexed array without reading (or allocating) it.
        probe = np.lib.stride_tricks.as_strided(np.zeros(1), self.ref.dims,
                                                (0,) * len(self.ref.dims))
        return tuple(probe[self.index].shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __getitem__(self, index) -> _View:
        if self.index:
            raise TypeError("a weight view is sliced once")
        return _View(self.ref, index if isinstance(index, tuple) else (index,))

    def values(self) -> np.ndarray:
        return read_array(self.ref)[self.index] if self.index else read_array(self.ref)


@dataclass
class Rewrite:
    """What splitting made: the new model, which key runs each new node, what each one is."""

    lazy: LazyModel
    assigned: dict[str, str]  # new layer name -> key
    derived: dict[str, Derived]
    replaced: set[str]  # original layer names that no longer exist


def default_kind(op: str) -> str:
    return "channels" if op in CHANNEL_LAYERS else "rows"


def split_layers(graph: Graph, splits: list[Split], key_of: dict[str, str], work: Path | None,
                 where: str = "mapping.json") -> Rewrite:
    """Rewrite ``graph``'s model so each split layer becomes its parts.

    Args:
        key_of: the key of every layer the mapping lists under one key (Slices go there).
        work: a folder for the sliced weights (copied into sub-models by reference later);
            None plans only (shapes, no weights written: what the search needs).

    Raises:
        AutodiceError: a layer type with no rule for the split asked, or a split finer than
            the tensor (one line per layer and key).
    """
    by_layer = {s.layer: s for s in splits}
    problems = Problems()
    weights = TensorFile(work / "slices.bin") if work is not None else None
    state = _State(graph, key_of, weights, problems, where)
    try:
        out_nodes: list[onnx.NodeProto] = []
        for i, node in enumerate(graph.nodes):
            name = graph.names[i]
            split = by_layer.get(name)
            if split is None:
                out_nodes.extend(state.gather_inputs(node, key_of.get(name)))
                out_nodes.append(node)
                continue
            kind = split.kind or state.follows(node, split) or default_kind(node.op_type)
            rule = {"channels": state.split_channels, "rows": state.split_rows}[kind]
            out_nodes.extend(rule(i, name, node, split))
        out_nodes.extend(state.gather_outputs())
    finally:
        if weights is not None:
            weights.close()
    problems.raise_if_any()
    proto = onnx.ModelProto()
    proto.CopyFrom(graph.lazy.proto)
    del proto.graph.node[:]
    proto.graph.node.extend(out_nodes)
    lazy = LazyModel(graph.lazy.path, proto, {**graph.lazy.tensors, **state.new_tensors},
                     {**graph.lazy.small, **state.new_small})
    return Rewrite(lazy, state.assigned, state.derived, set(by_layer))


class _State:
    """The rewrite's bookkeeping while it walks the graph in order."""

    def __init__(self, graph: Graph, key_of: dict[str, str], weights: TensorFile | None,
                 problems: Problems, where: str):
        self.graph, self.key_of, self.weights = graph, key_of, weights
        self.problems, self.where = problems, where
        self.assigned: dict[str, str] = {}
        self.derived: dict[str, Derived] = {}
        self.new_tensors: dict[str, TensorRef] = {}
        self.new_small: dict[str, onnx.TensorProto] = {}
        self.taken = set(graph.names) | {t for n in graph.nodes for t in n.output} | set(
            graph.tensors) | set(graph.inputs)
        # tensor -> (its parts, the axis they split, the keys, each part's range on that axis)
        self.pieces: dict[str, tuple[list[str], int, tuple[str, ...], list[tuple[int, int]]]] = {}

    # -- names and small helpers

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}~{k}"
        self.taken.add(name)
        return name

    def node(self, op: str, inputs: list[str], output: str, name: str, key: str,
             origin: str, fraction: float, **attrs) -> onnx.NodeProto:
        node = helper.make_node(op, inputs, [output], name=name, **attrs)
        self.assigned[name] = key
        self.derived[name] = Derived(origin, fraction)
        return node

    def const(self, base: str, values: list[int]) -> str:
        name = self.fresh(base)
        array = np.array(values, np.int64)
        self.new_small[name] = numpy_helper.from_array(array, name)
        self.new_tensors[name] = (self.weights.add(name, array) if self.weights is not None else
                                  TensorRef(name, array.shape, 7, array.nbytes, Path(), 0, 0,
                                            None, False))
        return name

    def weight(self, base: str, view: _View) -> str:
        """A new initializer: a slice of a weight, written once when the rewrite is for real,
        only described (name, shape, type) when it is for planning (the search scores many)."""
        name = self.fresh(base)
        ref = self.graph.tensors[view.tensor]
        if self.weights is None:
            shape = view.shape
            nbytes = int(np.prod(shape, dtype=np.int64)) * (ref.nbytes // max(1, int(np.prod(
                ref.dims, dtype=np.int64))))
            self.new_tensors[name] = TensorRef(name, shape, ref.data_type, nbytes, Path(),
                                               0, 0, None, False)
            if nbytes <= 4096:  # shape inference and folding may read small values
                self.new_small[name] = numpy_helper.from_array(np.ascontiguousarray(
                    view.values()), name)
            return name
        values = np.ascontiguousarray(view.values())
        self.new_tensors[name] = self.weights.add(name, values)
        if values.nbytes <= 4096:
            self.new_small[name] = numpy_helper.from_array(values, name)
        return name

    def array(self, tensor: str) -> _View:
        return _View(self.graph.tensors[tensor])

    def producer_key(self, tensor: str, fallback: str) -> str:
        """Where a tensor is made (a Slice of it runs there, so only the slice travels)."""
        p = self.graph.producer.get(tensor)
        if p is None:
            return fallback
        return self.key_of.get(self.graph.names[p]) or self.assigned.get(
            self.graph.names[p], fallback)

    def shape(self, tensor: str) -> tuple[int, ...]:
        t = self.graph.types.get(tensor)
        return tuple(t.shape) if t is not None and t.static else ()

    def kernel(self, node: onnx.NodeProto) -> list[int]:
        """A Conv's or pool's window ([] for a per-element layer)."""
        if node.op_type not in ROW_LAYERS:
            return []
        w = node.input[1] if node.op_type == "Conv" and len(node.input) > 1 else ""
        return _kernel(node, self.shape(w) if w else ())

    def fail(self, layer: str, key: str, why: str) -> list[onnx.NodeProto]:
        self.problems.add(f'{self.where}: key "{key}": layer "{layer}" cannot be split: {why}')
        return []

    def follows(self, node: onnx.NodeProto, split: Split) -> str:
        """The split a per-element layer inherits from its input's (same keys), else ""."""
        got = self.pieces.get(node.input[0]) if node.input else None
        if node.op_type not in PER_ELEMENT | {"BatchNormalization"} or got is None or \
                got[2] != split.keys:
            return ""
        return "rows" if got[1] == 2 and self.graph.types[node.input[0]].shape and len(
            self.graph.types[node.input[0]].shape) == 4 else "channels"

    # -- gathering

    def gather(self, tensor: str, key: str) -> onnx.NodeProto:
        """The Concat that makes ``tensor`` whole again from its parts, on ``key``."""
        parts, axis, keys, _ = self.pieces.pop(tensor)
        p = self.graph.producer.get(tensor)
        origin = self.graph.names[p] if p is not None else tensor
        name = self.fresh(f"{tensor}/gather")
        return self.node("Concat", parts, tensor, name, key, origin, 0.0, axis=axis)

    def gather_inputs(self, node: onnx.NodeProto, key: str | None) -> list[onnx.NodeProto]:
        """Concats for the split tensors a whole layer reads (on that layer's key)."""
        made = []
        for t in dict.fromkeys(node.input):
            if t in self.pieces:
                made.append(self.gather(t, key or self.pieces[t][2][0]))
        return made

    def gather_outputs(self) -> list[onnx.NodeProto]:
        """Model outputs still in parts: gathered on their last part's key."""
        return [self.gather(t, self.pieces[t][2][-1]) for t in list(self.pieces)
                if t in self.graph.outputs]

    # -- channels

    def split_channels(self, i: int, name: str, node: onnx.NodeProto,
                       split: Split) -> list[onnx.NodeProto]:
        op, keys = node.op_type, split.keys
        x = node.input[0]
        if op in PER_ELEMENT or op == "BatchNormalization":
            return self.follow_channels(name, node, split)
        if op not in CHANNEL_LAYERS:
            return self.fail(name, keys[0], f"a {op} has no channel split (Conv, Gemm, MatMul "
                             "and the per-channel layers after them do)")
        made = self.gather_inputs(node, keys[0])
        y = node.output[0]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if op == "Conv":
            if len(node.input) < 2 or node.input[1] not in self.graph.tensors:
                return self.fail(name, keys[0], "its weights are not a constant")
            w = self.array(node.input[1])
            groups = int(attrs.get("group", 1))
            cout = w.shape[0]
            # A grouped Conv splits at group boundaries (a part takes whole groups and reads only
            # their input channels); an ordinary one at any output channel.
            unit = cout // groups if groups > 1 else 1
            ranges = _ranges(groups if groups > 1 else cout, split.shares)
            if ranges is None:
                return self.fail(name, keys[0], f"{len(keys)} parts of {cout} output channels "
                                 f"in {groups} group(s): a finer split than the tensor")
            b = self.array(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            cin_unit = w.shape[1]
            parts = []
            for k, (g0, g1) in enumerate(ranges):
                c0, c1 = g0 * unit, g1 * unit
                inputs = [x]
                if groups > 1:
                    sliced = self.slice(x, 1, g0 * cin_unit, g1 * cin_unit, keys[k], name)
                    made.extend(sliced)
                    inputs = [sliced[0].output[0]]
                inputs.append(self.weight(f"{node.input[1]}/{k}", w[c0:c1]))
                if b is not None:
                    inputs.append(self.weight(f"{node.input[2]}/{k}", b[c0:c1]))
                part_attrs = {**attrs, "group": g1 - g0} if groups > 1 else attrs
                out = self.fresh(f"{y}/{k}")
                made.append(self.node("Conv", inputs, out, self.fresh(f"{name}/{k}"), keys[k],
                                      name, (c1 - c0) / cout, **part_attrs))
                parts.append(out)
            self.pieces[y] = (parts, 1, keys, [(g0 * unit, g1 * unit) for g0, g1 in ranges])
            return made
        # Gemm / MatMul: the output's last axis, by the weight's output-feature axis.
        if len(node.input) < 2 or node.input[1] not in self.graph.tensors:
            return self.fail(name, keys[0], "its second input is not a constant weight")
        w = self.array(node.input[1])
        trans_b = op == "Gemm" and int(attrs.get("transB", 0))
        if w.ndim != 2:
            return self.fail(name, keys[0], f"its weight has {w.ndim} dimensions, not 2")
        n = w.shape[0] if trans_b else w.shape[1]
        ranges = _ranges(n, split.shares)
        if ranges is None:
            return self.fail(name, keys[0], f"{len(keys)} parts of {n} output features: a "
                             "finer split than the tensor")
        c = (self.array(node.input[2]) if op == "Gemm" and len(node.input) > 2 and node.input[2]
             else None)
        parts = []
        for k, (a, e) in enumerate(ranges):
            wk = w[a:e] if trans_b else w[:, a:e]
            inputs = [x, self.weight(f"{node.input[1]}/{k}", wk)]
            if c is not None:
                ck = c[..., a:e] if c.ndim and c.shape[-1] == n else c
                inputs.append(self.weight(f"{node.input[2]}/{k}", ck))
            out = self.fresh(f"{y}/{k}")
            made.append(self.node(op, inputs, out, self.fresh(f"{name}/{k}"), keys[k], name,
                                  (e - a) / n, **attrs))
            parts.append(out)
        rank = len(self.shape(y)) or 2
        self.pieces[y] = (parts, rank - 1, keys, ranges)
        return made

    def follow_channels(self, name: str, node: onnx.NodeProto,
                        split: Split) -> list[onnx.NodeProto]:
        """A per-channel layer after a channel split over the same keys: one per part."""
        x = node.input[0]
        got = self.pieces.get(x)
        if got is None or got[2] != split.keys or got[1] != 1 and node.op_type == \
                "BatchNormalization":
            return self.fail(name, split.keys[0], "a per-channel layer splits only right after "
                             "a layer split by channels over the same keys")
        parts, axis, keys, ranges = self.pieces.pop(x)
        y = node.output[0]
        made, outs = [], []
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        total = sum(e - a for a, e in ranges)
        for k, (part, (a, e)) in enumerate(zip(parts, ranges)):
            inputs = [part]
            for extra in node.input[1:]:
                if node.op_type == "BatchNormalization" and extra in self.graph.tensors:
                    inputs.append(self.weight(f"{extra}/{k}", self.array(extra)[a:e]))
                elif extra in self.graph.tensors and node.op_type == "PRelu":
                    slope = self.array(extra)
                    inputs.append(self.weight(f"{extra}/{k}", slope[a:e] if slope.size > 1
                                              else slope))
                else:
                    inputs.append(extra)
            out = self.fresh(f"{y}/{k}")
            made.append(self.node(node.op_type, inputs, out, self.fresh(f"{name}/{k}"), keys[k],
                                  name, (e - a) / total, **attrs))
            outs.append(out)
        self.pieces[y] = (outs, axis, keys, ranges)
        return made

    def slice(self, x: str, axis: int, start: int, end: int, key: str,
              origin: str) -> list[onnx.NodeProto]:
        """A Slice of ``x`` on ``axis``, run on ``x``'s producer's key (only the slice moves)."""
        out = self.fresh(f"{x}/{axis}:{start}:{end}")
        starts, ends, axes = (self.const(f"{out}/{w}", [v]) for w, v in
                              (("starts", start), ("ends", end), ("axes", axis)))
        return [self.node("Slice", [x, starts, ends, axes], out, self.fresh(f"{out}/slice"),
                          self.producer_key(x, key), origin, 0.0)]

    # -- rows

    def split_rows(self, i: int, name: str, node: onnx.NodeProto,
                   split: Split) -> list[onnx.NodeProto]:
        op, keys = node.op_type, split.keys
        if op not in ROW_LAYERS and op not in PER_ELEMENT and op != "BatchNormalization":
            return self.fail(name, keys[0], f"a {op} has no row split (Conv, MaxPool, "
                             "AveragePool, BatchNormalization and per-element layers do)")
        x, y = node.input[0], node.output[0]
        xs, ys = self.shape(x), self.shape(y)
        if len(xs) != 4 or len(ys) != 4:
            return self.fail(name, keys[0], "rows split 4-D NCHW tensors only")
        made: list[onnx.NodeProto] = []
        if x in self.pieces and self.pieces[x][1] == 2 and self.pieces[x][2] == keys:
            # Fused tiles: the previous layer's bands, each extended by the halo this layer
            # needs from the neighbouring bands, are this layer's inputs.
            return made + self.rows_from_bands(name, node, split)
        made.extend(self.gather_inputs(node, keys[0]))
        bands = _ranges(ys[2], split.shares)
        if bands is None:
            return self.fail(name, keys[0], f"{len(keys)} bands of {ys[2]} output rows: a finer "
                             "split than the tensor")
        parts = []
        for k, (a, e) in enumerate(bands):
            lo, hi, top, bottom = _rows_needed(node, a, e, xs, ys, self.kernel(node))
            sliced = self.slice(x, 2, lo, hi, keys[k], name)
            made.extend(sliced)
            out = self.fresh(f"{y}/{k}")
            made.append(self.row_part(node, sliced[0].output[0], out, f"{name}/{k}", keys[k],
                                      name, (e - a) / ys[2], top, bottom))
            parts.append(out)
        self.pieces[y] = (parts, 2, keys, bands)
        return made

    def rows_from_bands(self, name: str, node: onnx.NodeProto,
                        split: Split) -> list[onnx.NodeProto]:
        """The next layer of a row-split run: its bands need halos, so each part reads the
        rows it needs from the previous bands (its own, plus Slices of its neighbours')."""
        x, y = node.input[0], node.output[0]
        parts_in, _, keys, bands_in = self.pieces.pop(x)
        xs, ys = self.shape(x), self.shape(y)
        bands = _ranges(ys[2], split.shares)
        if bands is None:
            return self.fail(name, keys[0], f"{len(keys)} bands of {ys[2]} output rows: a finer "
                             "split than the tensor")
        made, parts = [], []
        for k, (a, e) in enumerate(bands):
            lo, hi, top, bottom = _rows_needed(node, a, e, xs, ys, self.kernel(node))
            pieces = []
            for j, (pa, pe) in enumerate(bands_in):
                s0, s1 = max(lo, pa), min(hi, pe)
                if s0 >= s1:
                    continue
                if (s0, s1) == (pa, pe):
                    pieces.append(parts_in[j])
                else:
                    sliced = self.slice(parts_in[j], 2, s0 - pa, s1 - pa, keys[j], name)
                    made.extend(sliced)
                    pieces.append(sliced[0].output[0])
            if len(pieces) > 1:
                joined = self.fresh(f"{x}/{k}/halo")
                made.append(self.node("Concat", pieces, joined, self.fresh(f"{joined}/concat"),
                                      keys[k], name, 0.0, axis=2))
                source = joined
            else:
                source = pieces[0]
            out = self.fresh(f"{y}/{k}")
            made.append(self.row_part(node, source, out, f"{name}/{k}", keys[k], name,
                                      (e - a) / ys[2], top, bottom))
            parts.append(out)
        self.pieces[y] = (parts, 2, keys, bands)
        return made

    def row_part(self, node: onnx.NodeProto, x: str, out: str, base: str, key: str,
                 origin: str, fraction: float, top: int, bottom: int) -> onnx.NodeProto:
        """``node`` on a band: its pads at the top and bottom only where the band meets the
        map's edge (elsewhere the halo rows are real rows)."""
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type in ROW_LAYERS:
            pads = _explicit_pads(node, self.shape(node.input[0]), self.shape(node.output[0]),
                                  self.kernel(node))
            attrs.pop("auto_pad", None)
            attrs["pads"] = [top, pads[1], bottom, pads[3]]
            if "ceil_mode" in attrs:  # the bottom pad now makes the last window explicit
                attrs["ceil_mode"] = 0
        return self.node(node.op_type, [x, *node.input[1:]], out, self.fresh(base), key, origin,
                         fraction, **attrs)


def _ranges(n: int, shares: tuple[float, ...]) -> list[tuple[int, int]] | None:
    """``n`` units cut into ``len(shares)`` contiguous runs in proportion, each at least one."""
    k = len(shares)
    if n < k:
        return None
    cuts = np.rint(np.cumsum(shares) / sum(shares) * n).astype(int)
    bounds = [0]
    for j, c in enumerate(cuts[:-1]):
        bounds.append(int(min(max(c, bounds[-1] + 1), n - (k - 1 - j))))
    bounds.append(n)
    return list(zip(bounds[:-1], bounds[1:]))


def _explicit_pads(node: onnx.NodeProto, xs: tuple[int, ...], ys: tuple[int, ...],
                   kernel: list[int]) -> list[int]:
    """[top, left, bottom, right] of a Conv or pool, auto_pad spelled out."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        k = kernel
        s = list(attrs.get("strides", [1, 1]))
        d = list(attrs.get("dilations", [1, 1]))
        pads = [0, 0, 0, 0]
        for ax in (0, 1):
            total = max((ys[2 + ax] - 1) * s[ax] + (k[ax] - 1) * d[ax] + 1 - xs[2 + ax], 0)
            small, big = total // 2, total - total // 2
            pads[ax], pads[ax + 2] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    return pads


def _kernel(node: onnx.NodeProto, weight_shape: tuple[int, ...] = ()) -> list[int]:
    """The window's size: its kernel_shape, else (a Conv) the weights' spatial dimensions."""
    for a in node.attribute:
        if a.name == "kernel_shape":
            return list(a.ints)
    if len(weight_shape) == 4:
        return list(weight_shape[2:])
    raise AutodiceError(f'layer "{node.name}": no kernel_shape')


def _rows_needed(node: onnx.NodeProto, a: int, e: int, xs: tuple[int, ...],
                 ys: tuple[int, ...], kernel: list[int]) -> tuple[int, int, int, int]:
    """The input rows [lo, hi) that output rows [a, e) of ``node`` read, and the padding rows
    (top, bottom) the band needs where it passes the map's edge."""
    if node.op_type not in ROW_LAYERS:  # per element: row for row
        return a, e, 0, 0
    attrs = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    k = kernel[0]
    s = list(attrs.get("strides", [1, 1]))[0]
    d = list(attrs.get("dilations", [1, 1]))[0]
    pad_top = _explicit_pads(node, xs, ys, kernel)[0]
    height = xs[2]
    u = a * s - pad_top
    v = (e - 1) * s - pad_top + (k - 1) * d + 1
    return max(u, 0), min(v, height), max(-u, 0), max(v - height, 0)
