"""The rewrite's bookkeeping: the split layers, weight views, fresh names, Slices and gathers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...core.errors import Problems
from ...core.model import Graph
from ...core.onnxio import TensorRef, read_array
from ...core.onnxwrite import TensorFile
from ..legalize import main_opset

KINDS = ("channels", "rows")
# Layers that act on each channel (and each row) alone: they follow a split without gathering.
PER_ELEMENT = frozenset({"Relu", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "Clip", "Elu", "Selu",
                         "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Erf", "Gelu",
                         "Dropout", "Identity", "Abs", "Neg", "Exp", "Sqrt", "Mish"})
# Layers that combine tensors element by element (with broadcasting): a band of each input
# makes the same band of the output.
JOINS = frozenset({"Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "Mean"})
CHANNEL_LAYERS = frozenset({"Conv", "Gemm", "MatMul"})
ROW_LAYERS = frozenset({"Conv", "MaxPool", "AveragePool"})

# tensor -> (its parts, the axis they split, the keys, each part's range on that axis)
Pieces = tuple[list[str], int, tuple[str, ...], list[tuple[int, int]]]


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


class View:
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

    def __getitem__(self, index) -> View:
        if self.index:
            raise TypeError("a weight view is sliced once")
        return View(self.ref, index if isinstance(index, tuple) else (index,))

    def values(self) -> np.ndarray:
        return read_array(self.ref)[self.index] if self.index else read_array(self.ref)


class State:
    """What the rewrite has made so far while it walks the graph in order."""

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
        self.pieces: dict[str, Pieces] = {}
        self.whole: set[str] = set()  # split tensors also gathered (their parts stay usable)
        self.opset = main_opset(graph.lazy.proto)

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

    def const(self, base: str, values, dtype=np.int64) -> str:
        name = self.fresh(base)
        array = np.array(values, dtype)
        self.new_small[name] = numpy_helper.from_array(array, name)
        self.new_tensors[name] = (self.weights.add(name, array) if self.weights is not None else
                                  TensorRef(name, array.shape,
                                            helper.np_dtype_to_tensor_dtype(array.dtype),
                                            array.nbytes, Path(), 0, 0,
                                            None, False))
        return name

    def weight(self, base: str, view: View) -> str:
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

    def array(self, tensor: str) -> View:
        return View(self.graph.tensors[tensor])

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

    def fail(self, layer: str, key: str, why: str) -> list[onnx.NodeProto]:
        self.problems.add(f'{self.where}: key "{key}": layer "{layer}" cannot be split: {why}')
        return []

    def follows(self, node: onnx.NodeProto, split: Split) -> str:
        """The split a per-element layer or a join inherits from its input's (same keys)."""
        got = self.pieces.get(node.input[0]) if node.input else None
        if node.op_type not in PER_ELEMENT | JOINS | {"BatchNormalization"} or got is None or \
                got[2] != split.keys:
            return ""
        return "rows" if got[1] == 2 and len(self.shape(node.input[0])) == 4 else "channels"

    def slice(self, x: str, axis: int, start: int, end: int, key: str,
              origin: str) -> list[onnx.NodeProto]:
        """A Slice of ``x`` on ``axis``, run on ``x``'s producer's key (only the slice moves)."""
        out = self.fresh(f"{x}/{axis}:{start}:{end}")
        name, where = self.fresh(f"{out}/slice"), self.producer_key(x, key)
        if self.opset < 10:  # Slice took its bounds as attributes then (ResNet-50 of the zoo)
            return [self.node("Slice", [x], out, name, where, origin, 0.0, starts=[start],
                              ends=[end], axes=[axis])]
        starts, ends, axes = (self.const(f"{out}/{w}", [v]) for w, v in
                              (("starts", start), ("ends", end), ("axes", axis)))
        return [self.node("Slice", [x, starts, ends, axes], out, name, where, origin, 0.0)]

    # -- gathering

    def gather_inputs(self, node: onnx.NodeProto, key: str | None) -> list[onnx.NodeProto]:
        """Concats for the split tensors a whole layer reads (on that layer's key), each made
        once: the parts stay for the tensor's other readers."""
        return [self.gather(t, key or self.pieces[t][2][0]) for t in dict.fromkeys(node.input)
                if t in self.pieces and t not in self.whole]

    def gather_outputs(self) -> list[onnx.NodeProto]:
        """Model outputs still in parts: gathered on their last part's key."""
        return [self.gather(t, self.pieces[t][2][-1]) for t in self.pieces
                if t in self.graph.outputs and t not in self.whole]

    def gather(self, tensor: str, key: str) -> onnx.NodeProto:
        """The Concat that makes ``tensor`` whole from its parts, on ``key``."""
        parts, axis, _, _ = self.pieces[tensor]
        self.whole.add(tensor)
        p = self.graph.producer.get(tensor)
        origin = self.graph.names[p] if p is not None else tensor
        name = self.fresh(f"{tensor}/gather")
        return self.node("Concat", parts, tensor, name, key, origin, 0.0, axis=axis)


def cut_ranges(n: int, shares: tuple[float, ...]) -> list[tuple[int, int]] | None:
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
