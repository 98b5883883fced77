"""The rules of the lowering (``lower.py``): each op that reads or writes a tensor of five or
more axes rewritten on a view of the same bytes with at most four, as the docstring there lists.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..core.model import Graph
from .axis_views import NCNN_AXES, broadcast_view, einsum_view, transpose_view, transposes
from .legalize import Constants

ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where",
    "Relu", "LeakyRelu", "Elu", "Selu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf",
    "Gelu", "Sqrt", "Exp", "Log", "Abs", "Neg", "Reciprocal", "Floor", "Ceil", "Round", "Sin",
    "Cos", "Clip", "Identity", "Softplus", "Mish", "Sign", "Not", "Equal", "Less", "Greater"})


def _attr(node: onnx.NodeProto, name: str, default=None):
    a = next((a for a in node.attribute if a.name == name), None)
    return default if a is None else helper.get_attribute_value(a)


class Lowering:
    """One pass over a sub-model's nodes (see the module docstring)."""

    def __init__(self, g: onnx.GraphProto, graph: Graph, constants: Constants):
        self.g, self.graph, self.constants = g, graph, constants
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.nodes: list[onnx.NodeProto] = []
        self.exact: set[str] = set()  # the Reshapes written here, to shapes given in full
        self.fresh = 0

    def target_is_exact(self, reshape: onnx.NodeProto) -> bool:
        """Whether the Reshape's target never copies a dimension of its input (no 0 in it)."""
        if reshape.output[0] in self.exact:
            return True
        target = self.constants.get(reshape.input[1])
        return target is not None and (bool(_attr(reshape, "allowzero", 0)) or 0 not in target)

    def shape(self, name: str) -> tuple[int, ...] | None:
        if name in self.shapes:
            return self.shapes[name]
        t = self.graph.types.get(name)
        return tuple(t.shape) if t is not None and t.static else None

    def _name(self, base: str, what: str) -> str:
        self.fresh += 1
        return f"{base}/{what}{self.fresh}"

    @property
    def nodes_written(self) -> bool:
        return self.fresh > 0

    def const(self, base: str, values) -> str:
        name = self._name(base, "c")
        self.nodes.append(helper.make_node("Constant", [], [name], name=name,
                                           value=numpy_helper.from_array(
                                               np.array(values, np.int64), name)))
        self.shapes[name] = (len(values),)
        return name

    def reshape(self, base: str, x: str, shape: tuple[int, ...], out: str | None = None) -> str:
        if out is None and self.shape(x) == tuple(shape):
            return x
        name = self._name(base, "view")
        out = out or name
        self.exact.add(out)
        self.nodes.append(helper.make_node("Reshape", [x, self.const(base, list(shape))], [out],
                                           name=name))
        self.shapes[out] = tuple(shape)
        return out

    def emit(self, op: str, base: str, inputs: list[str], out_shape: tuple[int, ...],
             out: str | None = None, **attrs) -> str:
        name = self._name(base, op.lower())
        out = out or name
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        self.shapes[out] = tuple(out_shape)
        return out

    def strided(self, node: onnx.NodeProto) -> bool:
        steps = self.constants.get(node.input[4]) if len(node.input) > 4 and node.input[4] \
            else None
        return steps is not None and any(int(v) != 1 for v in steps.ravel())

    def known(self, node: onnx.NodeProto) -> bool:
        """Whether the shapes of the node's first input and its outputs are known (what the
        rules read; a rule that reads more checks for itself)."""
        return all(self.shape(t) is not None for t in (*node.input[:1], *node.output) if t)

    # ---- one rule per kind of op; each returns False to keep the node as it is ----------------

    def transpose(self, node, base) -> bool:
        x, y = node.input[0], node.output[0]
        shape = self.shape(x)
        perm = tuple(_attr(node, "perm", range(len(shape))[::-1]))
        cur, cur_shape = x, shape
        for step in transposes(shape, perm):
            view, p = transpose_view(cur_shape, step)
            cur_shape = tuple(cur_shape[a] for a in step)
            cur = self.reshape(base, cur, view)
            if p != tuple(range(len(p))):
                cur = self.emit("Transpose", base, [cur], tuple(view[a] for a in p), perm=list(p))
        self.reshape(base, cur, self.shape(y), out=y)
        return True

    def _around(self, shape: tuple[int, ...], axis: int) -> tuple[int, int]:
        axis %= len(shape)
        return math.prod(shape[:axis]), math.prod(shape[axis + 1:])

    def slice(self, node, base) -> bool:
        axes = self.constants.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
        x, y = node.input[0], node.output[0]
        shape = self.shape(x)
        if axes is None or axes.size != 1 or any(self.constants.get(t) is None
                                                 for t in node.input[1:] if t):
            return False
        before, after = self._around(shape, int(axes.ravel()[0]))
        axis = int(axes.ravel()[0]) % len(shape)
        view = self.reshape(base, x, (before, shape[axis], after))
        out = self.shape(y)
        inputs = [view, node.input[1], node.input[2], self.const(base, [1]), *node.input[4:]]
        sliced = self.emit("Slice", base, inputs, (before, out[axis], after))
        self.reshape(base, sliced, out, out=y)
        return True

    def strided_slice(self, node, base) -> bool:
        """A Slice with steps (Swin-T's patch merging takes every other row and column), one
        axis at a time (:meth:`every`): ncnn's Crop has no step."""
        bounds = [self.constants.get(t) if t else None for t in node.input[1:5]]
        shape = self.shape(node.input[0])
        if len(bounds) < 4 or any(b is None for b in bounds) or shape is None:
            return False
        starts, ends, axes, steps = (b.ravel().tolist() for b in bounds)
        if any(step < 1 for step in steps):
            return False
        cur, cur_shape = node.input[0], shape
        for lo, hi, axis, step in zip(starts, ends, axes, steps):
            axis %= len(shape)
            n = cur_shape[axis]
            picked = range(*slice(lo, hi, step).indices(n))
            if not picked:
                return False
            before, after = self._around(cur_shape, axis)
            view = self.reshape(base, cur, (before, n, after))
            rows = self.every(base, view, (before, n, after), picked[0], len(picked), step)
            cur_shape = (*cur_shape[:axis], len(picked), *cur_shape[axis + 1:])
            cur = self.reshape(base, rows, cur_shape)
        self.reshape(base, cur, self.shape(node.output[0]), out=node.output[0])
        return True

    def every(self, base: str, view: str, shape: tuple[int, int, int], first: int, m: int,
              step: int) -> str:
        """The m rows of ``view`` (before, n, after) from ``first`` on by ``step``, in the order
        of (before, m, after) (the shape may add a unit axis), with no step in any op. They are
        column c of (before, m, step, after), a view of the step * m rows from ``first - c``.
        Where no such window fits in the axis (from 0 of an odd length by 2: the last row would
        run past the end), the first m - 1 rows come that way (their window fits) and the last
        is sliced alone and concatenated."""
        before, n, after = shape
        step = step if m > 1 else 1
        col = max(0, first + step * m - n)
        if col > first or col >= step:
            head = self.reshape(base, self.every(base, view, shape, first, m - 1, step),
                                (before, m - 1, after))
            last = first + step * (m - 1)
            tail = self.emit("Slice", base, [view, self.const(base, [last]),
                                             self.const(base, [last + 1]), self.const(base, [1])],
                             (before, 1, after))
            return self.emit("Concat", base, [head, tail], (before, m, after), axis=1)
        if step * m != n:
            view = self.emit("Slice", base, [view, self.const(base, [first - col]),
                                             self.const(base, [first - col + step * m]),
                                             self.const(base, [1])],
                             (before, step * m, after))
        rows = self.reshape(base, view, (before, m, step, after))
        if step > 1:
            rows = self.emit("Slice", base, [rows, self.const(base, [col]),
                                             self.const(base, [col + 1]), self.const(base, [2])],
                             (before, m, 1, after))
        return rows

    def split(self, node, base) -> bool:
        x = node.input[0]
        shape = self.shape(x)
        axis = _attr(node, "axis", 0) % len(shape)
        before, after = self._around(shape, axis)
        view = self.reshape(base, x, (before, shape[axis], after))
        parts = [self._name(base, "part") for _ in node.output]
        self.nodes.append(helper.make_node("Split", [view, *node.input[1:]], parts,
                                           name=self._name(base, "split"),
                                           axis=1, **{a.name: helper.get_attribute_value(a)
                                                      for a in node.attribute
                                                      if a.name not in ("axis",)}))
        for part, y in zip(parts, node.output):
            out = self.shape(y)
            self.shapes[part] = (before, out[axis], after)
            self.reshape(base, part, out, out=y)
        return True

    def concat(self, node, base) -> bool:
        y = node.output[0]
        out = self.shape(y)
        axis = _attr(node, "axis") % len(out)
        before, after = self._around(out, axis)
        if any(self.shape(x) is None for x in node.input):
            return False
        views = [self.reshape(base, x, (before, self.shape(x)[axis], after)) for x in node.input]
        joined = self.emit("Concat", base, views, (before, out[axis], after), axis=1)
        self.reshape(base, joined, out, out=y)
        return True

    def softmax(self, node, base) -> bool:
        x, y = node.input[0], node.output[0]
        shape = self.shape(x)
        if self.opset < 13:
            return False  # before 13 Softmax flattens at its axis: legalize spells that
        axis = _attr(node, "axis", -1) % len(shape)
        before, after = self._around(shape, axis)
        view = (before, shape[axis], after) if after != 1 else (before, shape[axis])
        done = self.emit(node.op_type, base, [self.reshape(base, x, view)], view, axis=1)
        self.reshape(base, done, shape, out=y)
        return True

    def elementwise(self, node, base) -> bool:
        y = node.output[0]
        ins = [self.shape(x) if x else () for x in node.input]
        if any(s is None for s in ins):
            return False
        inputs = list(node.input)
        views, out = broadcast_view(ins, self.shape(y))
        spread = {}
        if len(out) > NCNN_AXES:
            # Broadcast along too many separate runs of axes: constant operands (a bias, a
            # mask) are spread to the output's shape here, as constants of its view.
            spread = {k: self.constants.get(x) for k, x in enumerate(inputs)
                      if x and ins[k] != self.shape(y) and self.constants.get(x) is not None}
            for k in spread:
                ins[k] = self.shape(y)
            views, out = broadcast_view(ins, self.shape(y))
            if len(out) > NCNN_AXES:
                return False
        for k, value in spread.items():
            inputs[k] = self._name(base, "spread")
            tensor = numpy_helper.from_array(np.ascontiguousarray(
                np.broadcast_to(value, self.shape(y)).reshape(views[k])), inputs[k])
            self.nodes.append(helper.make_node("Constant", [], [inputs[k]], name=inputs[k],
                                               value=tensor))
            self.shapes[inputs[k]] = views[k]
        inputs = [x if not x or math.prod(s) == 1 and len(s) <= 1 else self.reshape(base, x, v)
                  for x, s, v in zip(inputs, ins, views)]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        done = self.emit(node.op_type, base, inputs, out, **attrs)
        self.reshape(base, done, self.shape(y), out=y)
        return True

    def einsum(self, node, base) -> bool:
        ins = [self.shape(x) for x in node.input]
        if any(s is None for s in ins):
            return False
        view = einsum_view(_attr(node, "equation").decode(), ins)
        if view is None:
            return False
        terms, out, size = view
        if max(len(t) for t in (*terms, out)) > NCNN_AXES:
            return False
        y = node.output[0]
        inputs = [self.reshape(base, x, tuple(size[c] for c in t))
                  for x, t in zip(node.input, terms)]
        out_shape = tuple(size[c] for c in out)
        if len(terms) == 2:
            (a, b) = terms
            # A batched matrix product: a = B i k, b = B k j (or B j k), out = B i j.
            batch = out[:-2]
            if len(out) >= 2 and a[:-2] == batch and b[:-2] == batch and len(a) == len(b) \
                    == len(out) and a[-2] == out[-2] and a[-1] not in out:
                k, j = a[-1], out[-1]
                if b[-2:] in (k + j, j + k):
                    right = inputs[1]
                    if b[-2:] == j + k:
                        perm = [*range(len(batch)), len(b) - 1, len(b) - 2]
                        right = self.emit("Transpose", base, [right],
                                          tuple(size[c] for c in batch + k + j), perm=perm)
                    done = self.emit("MatMul", base, [inputs[0], right], out_shape)
                    self.reshape(base, done, self.shape(y), out=y)
                    return True
        done = self.emit("Einsum", base, inputs, out_shape,
                         equation=",".join(terms) + "->" + out)
        self.reshape(base, done, self.shape(y), out=y)
        return True

    RULES = {"Transpose": transpose, "Slice": slice, "Split": split, "Concat": concat,
             "Softmax": softmax, "LogSoftmax": softmax, "Einsum": einsum}
    RULES.update(dict.fromkeys(ELEMENTWISE, elementwise))

    def slice_shape(self, node) -> None:
        """The output shape of a Slice with constant bounds (legalize's Gathers become those)."""
        shape = self.shape(node.input[0])
        bounds = [self.constants.get(t) if t else None for t in node.input[1:5]]
        if shape is None or any(b is None for b in bounds[:2]):
            return
        starts, ends = (b.ravel() for b in bounds[:2])
        axes = bounds[2].ravel() if len(bounds) > 2 and bounds[2] is not None \
            else range(len(starts))
        steps = bounds[3].ravel() if len(bounds) > 3 and bounds[3] is not None \
            else [1] * len(starts)
        out = list(shape)
        for a, lo, hi, step in zip(axes, starts, ends, steps):
            a = int(a) % len(shape)
            out[a] = len(range(*slice(int(lo), int(hi), int(step)).indices(shape[a])))
        self.shapes[node.output[0]] = tuple(out)

    def rule_for(self, node: onnx.NodeProto):
        """The rule that rewrites ``node``, or None to keep it."""
        if node.domain not in ("", "ai.onnx") or not self.known(node):
            return None
        if node.op_type == "Slice" and self.strided(node):
            return Lowering.strided_slice
        shapes = [self.shape(t) for t in (*node.input, *node.output) if t]
        if max(len(s) for s in shapes if s is not None) <= NCNN_AXES:
            return None
        return self.RULES.get(node.op_type)

    def layout_shape(self, node: onnx.NodeProto) -> None:
        """The output shape of a Reshape to a constant target or of a Transpose, where the
        model's own shapes do not say it (tensors a rewrite of ``.exporters`` made)."""
        x = self.shape(node.input[0])
        if x is None:
            return
        if node.op_type == "Transpose":
            perm = _attr(node, "perm", range(len(x))[::-1])
            self.shapes[node.output[0]] = tuple(x[a] for a in perm)
            return
        target = self.constants.get(node.input[1]) if len(node.input) > 1 else None
        if target is None:
            return
        dims = [x[i] if d == 0 and not _attr(node, "allowzero", 0) else int(d)
                for i, d in enumerate(target.ravel())]
        if dims.count(-1) == 1:
            known = math.prod(d for d in dims if d != -1)
            dims[dims.index(-1)] = math.prod(x) // known if known else 0
        if -1 not in dims and math.prod(dims) == math.prod(x):
            self.shapes[node.output[0]] = tuple(dims)

    def run(self, opset: int) -> None:
        self.opset = opset
        for node in self.g.node:
            if node.op_type == "Slice" and self.shape(node.output[0]) is None:
                self.slice_shape(node)
            if node.op_type in ("Reshape", "Transpose") and self.shape(node.output[0]) is None:
                self.layout_shape(node)
            rule = self.rule_for(node)
            if rule is None or not rule(self, node, node.name or node.output[0]):
                self.nodes.append(node)
        del self.g.node[:]
        self.g.node.extend(self.nodes)
