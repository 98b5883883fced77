"""The ``rows`` split: each part computes a band of output rows from the rows of its input it
needs -- its own band plus the halo a window reaches into its neighbours' -- cut from the
input's own bands where the input is already in bands (fused tiles), else sliced from the whole.
Per-element layers, joins (Add, Mul, ...) and Concat over channels go band by band."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ...core.errors import AutodiceError
from .state import JOINS, PER_ELEMENT, ROW_LAYERS, Pieces, Split, State, cut_ranges

BAND_BY_BAND = PER_ELEMENT | JOINS | {"BatchNormalization", "Concat"}


def split_rows(st: State, name: str, node: onnx.NodeProto,
               split: Split) -> list[onnx.NodeProto]:
    op, keys = node.op_type, split.keys
    if op not in ROW_LAYERS and op not in BAND_BY_BAND or op == "Concat" and _axis(node) == 2:
        return st.fail(name, keys[0], f"a {op} has no row split (Conv, MaxPool, AveragePool, "
                       "per-element layers, Add/Mul/... and Concat over channels do)")
    y = node.output[0]
    ys = st.shape(y)
    if len(ys) != 4 or op in ROW_LAYERS and len(st.shape(node.input[0])) != 4:
        return st.fail(name, keys[0], "rows split 4-D NCHW tensors only")
    bands = cut_ranges(ys[2], split.shares)
    if bands is None:
        return st.fail(name, keys[0], f"{len(keys)} bands of {ys[2]} output rows: a finer "
                       "split than the tensor")
    if op in BAND_BY_BAND:
        return _band_by_band(st, name, node, split, bands)
    x = node.input[0]
    xs = st.shape(x)
    got = _bands_of(st, x)
    made: list[onnx.NodeProto] = [] if got else st.gather_inputs(node, keys[0])
    window = _window(st, node)
    if op == "AveragePool" and _counts_part_windows(node, xs, ys, window):
        return st.fail(name, keys[0], "an AveragePool in ceil_mode that counts padding has no "
                       "row split: its part windows divide by less than the padding they cross")
    parts = []
    for k, (a, e) in enumerate(bands):
        lo, hi, top, bottom = _rows_needed(node, a, e, xs, ys, window)
        if got:
            source = _rows_from_bands(st, x, got, lo, hi, keys[k], name, made)
        else:
            sliced = st.slice(x, 2, lo, hi, keys[k], name)
            made.extend(sliced)
            source = sliced[0].output[0]
        out = st.fresh(f"{y}/{k}")
        made.extend(_row_part(st, node, source, out, f"{name}/{k}", keys[k], name,
                              (e - a) / ys[2], top, bottom, window))
        parts.append(out)
    st.pieces[y] = (parts, 2, keys, bands)
    return made


def _band_by_band(st: State, name: str, node: onnx.NodeProto, split: Split,
                  bands: list[tuple[int, int]]) -> list[onnx.NodeProto]:
    """A layer whose output rows are made from the same rows of its inputs: each part reads
    its band of every input that varies by row (from the input's bands where it has them, else
    a Slice of it) and the whole of every input broadcast over rows (weights, per-channel
    parameters, a squeeze-excite scale)."""
    y, keys = node.output[0], split.keys
    rows = st.shape(y)[2]
    made: list[onnx.NodeProto] = []
    per_input: list[list[str]] = []
    for t in node.input:
        got = _bands_of(st, t)
        info = st.graph.types.get(t)
        if t in st.graph.tensors:
            ts = tuple(st.graph.tensors[t].dims)
        elif not t or info is None or not info.static:
            return st.fail(name, keys[0], f'input "{t}" has no static shape')
        else:
            ts = st.shape(t)
        if got is None and (len(ts) < 2 or ts[-2] != rows):
            per_input.append([t] * len(bands))  # broadcast over rows
            continue
        if got is None and t in st.pieces and t not in st.whole:  # parts of another kind
            made.append(st.gather(t, keys[0]))
        column = []
        for k, (a, e) in enumerate(bands):
            if got:
                column.append(_rows_from_bands(st, t, got, a, e, keys[k], name, made))
            else:
                sliced = st.slice(t, len(ts) - 2, a, e, keys[k], name)
                made.extend(sliced)
                column.append(sliced[0].output[0])
        per_input.append(column)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    parts = []
    for k, (a, e) in enumerate(bands):
        out = st.fresh(f"{y}/{k}")
        made.append(st.node(node.op_type, [column[k] for column in per_input], out,
                            st.fresh(f"{name}/{k}"), keys[k], name, (e - a) / rows, **attrs))
        parts.append(out)
    st.pieces[y] = (parts, 2, keys, bands)
    return made


def _bands_of(st: State, tensor: str) -> Pieces | None:
    """``tensor``'s parts if it is in row bands (over any keys), else None."""
    got = st.pieces.get(tensor)
    return got if got is not None and got[1] == 2 and len(st.shape(tensor)) == 4 else None


def _rows_from_bands(st: State, x: str, got: Pieces, lo: int, hi: int, key: str, origin: str,
                     made: list[onnx.NodeProto]) -> str:
    """Rows [lo, hi) of ``x`` for a part on ``key``, from ``x``'s bands: whole bands as they
    are, Slices of the neighbours' (run where they are, so only the halo moves), joined by a
    Concat on ``key`` when they come from more than one band."""
    parts_in, _, keys_in, bands_in = got
    pieces = []
    for j, (pa, pe) in enumerate(bands_in):
        s0, s1 = max(lo, pa), min(hi, pe)
        if s0 >= s1:
            continue
        if (s0, s1) == (pa, pe):
            pieces.append(parts_in[j])
        else:
            sliced = st.slice(parts_in[j], 2, s0 - pa, s1 - pa, keys_in[j], origin)
            made.extend(sliced)
            pieces.append(sliced[0].output[0])
    if len(pieces) == 1:
        return pieces[0]
    joined = st.fresh(f"{x}/{lo}:{hi}")
    made.append(st.node("Concat", pieces, joined, st.fresh(f"{joined}/concat"), key, origin,
                        0.0, axis=2))
    return joined


def _row_part(st: State, node: onnx.NodeProto, x: str, out: str, base: str, key: str,
              origin: str, fraction: float, top: int, bottom: int,
              window: list[int]) -> list[onnx.NodeProto]:
    """A Conv or pool on a band: its pads at the top and bottom only where the band meets the
    map's edge (elsewhere the halo rows are real rows).

    A MaxPool whose band pads differ top to bottom gets its rows of padding from a Concat
    before it: pnnx 20261020 turns such a MaxPool into ncnn's Padding *and* a Pooling that pads
    again, on every side (ResNet-50's stem pool came out 2 columns wide)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    xs, ys = st.shape(node.input[0]), st.shape(node.output[0])
    pads = _explicit_pads(node, xs, ys, window)
    attrs.pop("auto_pad", None)
    if attrs.get("ceil_mode"):  # the pads make the part windows explicit: bottom and right
        attrs["ceil_mode"] = 0
        pads[3] = max(pads[3], _reach(node, ys[3], window, 1) - xs[3] - pads[1])
    attrs["pads"] = [top, pads[1], bottom, pads[3]]
    made = []
    if node.op_type == "MaxPool" and top != bottom:
        x = _pad_rows(st, x, st.shape(node.input[0]), top, bottom, key, origin, made)
        attrs["pads"] = [0, pads[1], 0, pads[3]]
    made.append(st.node(node.op_type, [x, *node.input[1:]], out, st.fresh(base), key, origin,
                        fraction, **attrs))
    return made


def _pad_rows(st: State, x: str, whole: tuple[int, ...], top: int, bottom: int, key: str,
              origin: str, made: list[onnx.NodeProto]) -> str:
    """``x``, a band of a map shaped ``whole``, with ``top`` and ``bottom`` rows of the lowest
    float around it, as a max pool pads: a Concat with constants, which pnnx lowers in every
    opset (ONNX Pad before opset 11 it cannot)."""
    n, c, _, w = whole

    def rows(count: int, where: str) -> list[str]:
        lowest = np.full((n, c, count, w), np.finfo(np.float32).min)
        return [st.const(f"{x}/{where}", lowest, np.float32)] if count else []

    pieces = [*rows(top, "top"), x, *rows(bottom, "bottom")]
    out = st.fresh(f"{x}/padded")
    made.append(st.node("Concat", pieces, out, st.fresh(f"{out}/concat"), key, origin, 0.0,
                        axis=2))
    return out


def _axis(node: onnx.NodeProto) -> int:
    """A Concat's axis, counted from the front of a 4-D tensor."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    return axis + 4 if axis < 0 else axis


def _counts_part_windows(node: onnx.NodeProto, xs: tuple[int, ...], ys: tuple[int, ...],
                         kernel: list[int]) -> bool:
    """An average pool whose ceil_mode windows reach past its padding while it counts padding:
    onnxruntime divides those by the window up to the padding's edge, which explicit pads (as a
    band's are) cannot say."""
    attrs = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    if not (attrs.get("ceil_mode") and attrs.get("count_include_pad")):
        return False
    pads = _explicit_pads(node, xs, ys, kernel)
    return any(_reach(node, ys[2 + ax], kernel, ax) > xs[2 + ax] + pads[ax] + pads[ax + 2]
               for ax in (0, 1))


def _window(st: State, node: onnx.NodeProto) -> list[int]:
    """A Conv's or pool's window size: its kernel_shape, else (a Conv) its weights' spatial
    dimensions."""
    for a in node.attribute:
        if a.name == "kernel_shape":
            return list(a.ints)
    w = st.shape(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else ()
    if len(w) == 4:
        return list(w[2:])
    raise AutodiceError(f'layer "{node.name}": no kernel_shape')


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


def _reach(node: onnx.NodeProto, out: int, kernel: list[int], axis: int) -> int:
    """How far into the padded map (0 = its first padding row or column) ``out`` windows of
    ``node`` along ``axis`` (0 rows, 1 columns) reach."""
    attrs = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    s = list(attrs.get("strides", [1, 1]))[axis]
    d = list(attrs.get("dilations", [1, 1]))[axis]
    return (out - 1) * s + (kernel[axis] - 1) * d + 1


def _rows_needed(node: onnx.NodeProto, a: int, e: int, xs: tuple[int, ...],
                 ys: tuple[int, ...], kernel: list[int]) -> tuple[int, int, int, int]:
    """The input rows [lo, hi) that output rows [a, e) of ``node`` read, and the padding rows
    (top, bottom) the band needs where it passes the map's edge."""
    attrs = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    k = kernel[0]
    s = list(attrs.get("strides", [1, 1]))[0]
    d = list(attrs.get("dilations", [1, 1]))[0]
    pad_top = _explicit_pads(node, xs, ys, kernel)[0]
    height = xs[2]
    u = a * s - pad_top
    v = (e - 1) * s - pad_top + (k - 1) * d + 1
    return max(u, 0), min(v, height), max(-u, 0), max(v - height, 0)
