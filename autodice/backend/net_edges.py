"""A converted sub-model's edges as the runtime feeds and extracts them.

The runtime hands ncnn every input ``in<k>``, and takes every output ``out<k>``, as one plain Mat
of the tensor's shape less a leading 1 (``ncnn_shape`` in autodice_tensors.cpp): 1x64x56x56 is
a 3-d Mat, 4x64x120 a 3-d Mat of 4 channels. pnnx decides for each blob which axis ncnn holds as
its batch (``Mat::n``, ncnn's NCNN_BATCH), and says so in the ``.ncnn.py`` it writes beside the
net: axis 0 of MobileViT's 4x64x120 tokens, which attention reads (one batch entry per position
inside a patch), so the net wants four 64x120 Mats; no axis of a 1x197x192 it finds no batch for, so
the net wants a 3-d Mat of one channel. Where the net's form differs from the plain one, a
Reshape between the two batch axes (ncnn's ``12=``/``13=``) goes at the edge: each side then holds
the tensor as it expects, and the runtime, the checks and the profiler need not know.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# pnnx's word for "no axis is the batch".
NO_BATCH = 233

_INPUT = re.compile(r'ex\.input\("in(\d+)", ncnn\.Mat\(in\d+\.numpy\(\), batch_index=(-?\d+)\)')
_OUTPUT = re.compile(r"out(\d+)\.numpy\(batch_index=(-?\d+)\)")


def batch_axes(ncnn_py: str) -> tuple[dict[int, int], dict[int, int]]:
    """The batch axis pnnx gave each input and output (k -> axis), read from its ``.ncnn.py``."""
    return ({int(k): int(a) for k, a in _INPUT.findall(ncnn_py)},
            {int(k): int(a) for k, a in _OUTPUT.findall(ncnn_py)})


def _forms(shape: Sequence[int], axis: int) -> tuple[tuple[int, tuple[int, ...]], int]:
    """(the net's (batch, Mat dims), its batch axis or NO_BATCH) for ``shape`` with ``axis``."""
    shape = tuple(shape)
    if axis != NO_BATCH and axis < 0:
        axis += len(shape)
    if axis == NO_BATCH or len(shape) < 2 or not 0 <= axis < len(shape):
        return (1, shape), NO_BATCH
    return (shape[axis], shape[:axis] + shape[axis + 1:]), axis


def plain_form(shape: Sequence[int]) -> tuple[int, ...]:
    """The Mat dims the runtime uses: the shape less a leading 1 (a batch of one)."""
    shape = tuple(shape)
    return shape[1:] if len(shape) >= 2 and shape[0] == 1 else shape


def _shape_params(shape: Sequence[int]) -> str:
    """A Reshape's target shape in ncnn's params (0=w 1=h 11=d 2=c), at most four axes."""
    keys = {1: ("0",), 2: ("1", "0"), 3: ("2", "1", "0"), 4: ("2", "11", "1", "0")}[len(shape)]
    return " ".join(f"{k}={d}" for k, d in sorted(zip(keys, shape)))


def _layer(kind: str, name: str, bottoms: Sequence[str], tops: Sequence[str],
           params: Sequence[str] = ()) -> str:
    """One layer line of an ncnn param, laid out as pnnx writes them."""
    return " ".join([f"{kind:<24}", f"{name:<24}", str(len(bottoms)), str(len(tops)), *bottoms,
                     *tops, *params])


def _reshape(name: str, bottom: str, top: str, shape: Sequence[int], axes: tuple[int, int]) -> str:
    return _layer("Reshape", name, [bottom], [top],
                  [_shape_params(shape), f"12={axes[0]} 13={axes[1]}"])


def _renamed(line: str, bottoms: dict[str, str], tops: dict[str, str]) -> str:
    parts = line.split()
    if len(parts) < 4:
        return line
    n_in, n_out = int(parts[2]), int(parts[3])
    blobs = parts[4:4 + n_in + n_out]
    new = [bottoms.get(b, b) for b in blobs[:n_in]] + [tops.get(t, t) for t in blobs[n_in:]]
    if new == blobs:
        return line
    return _layer(parts[0], parts[1], new[:n_in], new[n_in:], parts[4 + n_in + n_out:])


def passed_on(param: str) -> dict[int, int]:
    """The inputs pnnx hands straight on as an output (``Input in3 0 1 out2``: {3: 2})."""
    return {int(parts[1][2:]): int(parts[4][3:]) for parts in map(str.split,
                                                                    param.splitlines()[2:])
            if parts[:1] == ["Input"] and parts[4:5] != parts[1:2]}


def plain_edges(param: str, inputs: Sequence[Sequence[int]], in_axes: Sequence[int | None],
                outputs: Sequence[Sequence[int]], out_axes: Sequence[int | None]) -> str:
    """The ncnn param with every input and output in its plain form (see the module's text):
    ``inputs``/``outputs`` are the shapes of in0.. and out0.., the axes pnnx's batch axis of
    each (:func:`batch_axes`; None: pnnx did not say, taken as plain). A tensor whose net
    form needs more than four logical axes keeps pnnx's form."""
    bottoms, tops, after_input, at_end = {}, {}, {}, []
    for k, (shape, said) in enumerate(zip(inputs, in_axes)):
        net, axis = _forms(shape, NO_BATCH if said is None else said)
        if said is not None and net != (1, plain_form(shape)) and len(shape) <= 4:
            blob = f"in{k}"
            bottoms[blob] = f"{blob}_net"
            after_input[blob] = _reshape(f"plain_{blob}", blob, bottoms[blob], shape,
                                         (NO_BATCH, axis))
    for k, (shape, said) in enumerate(zip(outputs, out_axes)):
        net, axis = _forms(shape, NO_BATCH if said is None else said)
        plain = plain_form(shape)
        if said is not None and net != (1, plain) and len(plain) <= 4:
            blob = f"out{k}"
            tops[blob] = bottoms[blob] = f"{blob}_net"
            at_end.append(_reshape(f"plain_{blob}", tops[blob], blob, plain, (axis, NO_BATCH)))
    if not after_input and not at_end:
        return param
    lines = param.splitlines()
    # ncnn counts a blob a layer reads before any layer writes it as one more blob: each
    # input's Reshape goes right after its Input layer, each output's after everything.
    body = []
    for line in lines[2:]:
        body.append(_renamed(line, bottoms, tops))
        parts = line.split()
        if parts[:1] == ["Input"] and parts[4:5] and parts[4] in after_input:
            body.append(after_input[parts[4]])
    added = len(after_input) + len(at_end)
    layers, blobs = map(int, lines[1].split())
    return "\n".join([lines[0], f"{layers + added} {blobs + added}", *body, *at_end]) + "\n"


def keep_inputs(param: str) -> str:
    """The ncnn param with every input blob under its own name.

    Where a sub-model sends on what it received with nothing but a no-op between (a reshape
    between two alike Mat forms, a bias of zeros that an exporter shared between layers),
    pnnx folds the no-op away and names the input's blob after the output:
    ``Input in3 0 1 out2``. The runtime feeds in3 and extracts out2, so the input keeps its name
    and a Noop layer hands it on as out2.
    """
    lines = param.splitlines()
    passed = []
    for k, line in enumerate(lines[2:], 2):
        parts = line.split()
        if parts[:1] == ["Input"] and parts[2:4] == ["0", "1"] and parts[4] != parts[1]:
            name, top = parts[1], parts[4]
            lines[k] = _layer("Input", name, [], [name], parts[5:])
            passed.append(_layer("Noop", f"noop_{top}", [name], [top]))
    if not passed:
        return param
    layers, blobs = map(int, lines[1].split())
    lines[1] = f"{layers + len(passed)} {blobs + len(passed)}"
    return "\n".join([*lines, *passed]) + "\n"
