"""The ``channels`` split: each part computes a range of output channels (features) and holds
only that slice of the weights; per-channel layers after it follow part by part."""

from __future__ import annotations

import onnx
from onnx import helper

from .state import CHANNEL_LAYERS, PER_ELEMENT, Split, State, cut_ranges


def split_channels(st: State, name: str, node: onnx.NodeProto,
                   split: Split) -> list[onnx.NodeProto]:
    """Conv (whole groups per part), Gemm and MatMul by a constant weight: each part its range
    of output channels from the whole input; per-channel layers follow their input's parts."""
    op, keys = node.op_type, split.keys
    x = node.input[0]
    if op in PER_ELEMENT or op == "BatchNormalization":
        return follow_channels(st, name, node, split)
    if op not in CHANNEL_LAYERS:
        return st.fail(name, keys[0], f"a {op} has no channel split (Conv, Gemm, MatMul "
                       "and the per-channel layers after them do)")
    made = st.gather_inputs(node, keys[0])
    y = node.output[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if op == "Conv":
        if len(node.input) < 2 or node.input[1] not in st.graph.tensors:
            return st.fail(name, keys[0], "its weights are not a constant")
        w = st.array(node.input[1])
        groups = int(attrs.get("group", 1))
        cout = w.shape[0]
        # A grouped Conv splits at group boundaries (a part takes whole groups and reads only
        # their input channels); an ordinary one at any output channel.
        unit = cout // groups if groups > 1 else 1
        ranges = cut_ranges(groups if groups > 1 else cout, split.shares)
        if ranges is None:
            return st.fail(name, keys[0], f"{len(keys)} parts of {cout} output channels "
                           f"in {groups} group(s): a finer split than the tensor")
        b = st.array(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        cin_unit = w.shape[1]
        parts = []
        for k, (g0, g1) in enumerate(ranges):
            c0, c1 = g0 * unit, g1 * unit
            inputs = [x]
            if groups > 1:
                sliced = st.slice(x, 1, g0 * cin_unit, g1 * cin_unit, keys[k], name)
                made.extend(sliced)
                inputs = [sliced[0].output[0]]
            inputs.append(st.weight(f"{node.input[1]}/{k}", w[c0:c1]))
            if b is not None:
                inputs.append(st.weight(f"{node.input[2]}/{k}", b[c0:c1]))
            part_attrs = {**attrs, "group": g1 - g0} if groups > 1 else attrs
            out = st.fresh(f"{y}/{k}")
            made.append(st.node("Conv", inputs, out, st.fresh(f"{name}/{k}"), keys[k],
                                name, (c1 - c0) / cout, **part_attrs))
            parts.append(out)
        st.pieces[y] = (parts, 1, keys, [(g0 * unit, g1 * unit) for g0, g1 in ranges])
        return made
    # Gemm / MatMul: the output's last axis, by the weight's output-feature axis.
    if len(node.input) < 2 or node.input[1] not in st.graph.tensors:
        return st.fail(name, keys[0], "its second input is not a constant weight")
    w = st.array(node.input[1])
    trans_b = op == "Gemm" and int(attrs.get("transB", 0))
    if w.ndim != 2:
        return st.fail(name, keys[0], f"its weight has {w.ndim} dimensions, not 2")
    n = w.shape[0] if trans_b else w.shape[1]
    ranges = cut_ranges(n, split.shares)
    if ranges is None:
        return st.fail(name, keys[0], f"{len(keys)} parts of {n} output features: a "
                       "finer split than the tensor")
    c = (st.array(node.input[2]) if op == "Gemm" and len(node.input) > 2 and node.input[2]
         else None)
    parts = []
    for k, (a, e) in enumerate(ranges):
        wk = w[a:e] if trans_b else w[:, a:e]
        inputs = [x, st.weight(f"{node.input[1]}/{k}", wk)]
        if c is not None:
            ck = c[..., a:e] if c.ndim and c.shape[-1] == n else c
            inputs.append(st.weight(f"{node.input[2]}/{k}", ck))
        out = st.fresh(f"{y}/{k}")
        made.append(st.node(op, inputs, out, st.fresh(f"{name}/{k}"), keys[k], name,
                            (e - a) / n, **attrs))
        parts.append(out)
    rank = len(st.shape(y)) or 2
    st.pieces[y] = (parts, rank - 1, keys, ranges)
    return made


def follow_channels(st: State, name: str, node: onnx.NodeProto,
                    split: Split) -> list[onnx.NodeProto]:
    """A per-channel layer after a channel split over the same keys: one per part."""
    x = node.input[0]
    got = st.pieces.get(x)
    if got is None or got[2] != split.keys or got[1] != 1 and node.op_type == \
            "BatchNormalization":
        return st.fail(name, split.keys[0], "a per-channel layer splits only right after "
                       "a layer split by channels over the same keys")
    parts, axis, keys, bounds = st.pieces[x]
    y = node.output[0]
    made, outs = [], []
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    total = sum(e - a for a, e in bounds)
    for k, (part, (a, e)) in enumerate(zip(parts, bounds)):
        inputs = [part]
        for extra in node.input[1:]:
            if node.op_type == "BatchNormalization" and extra in st.graph.tensors:
                inputs.append(st.weight(f"{extra}/{k}", st.array(extra)[a:e]))
            elif extra in st.graph.tensors and node.op_type == "PRelu":
                slope = st.array(extra)
                inputs.append(st.weight(f"{extra}/{k}", slope[a:e] if slope.size > 1
                                        else slope))
            else:
                inputs.append(extra)
        out = st.fresh(f"{y}/{k}")
        made.append(st.node(node.op_type, inputs, out, st.fresh(f"{name}/{k}"), keys[k],
                            name, (e - a) / total, **attrs))
        outs.append(out)
    st.pieces[y] = (outs, axis, keys, bounds)
    return made
