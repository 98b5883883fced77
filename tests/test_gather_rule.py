"""The Gather rule is proven on the operation, not on one exporter's spelling of it.

    x (random static shape) --Gather(axis, constant indices)--> y

For random shapes, axes and index sets: when the indices are an arithmetic range (any start,
step, shape, negative spellings), the rewrite (Slice + Reshape) gives onnxruntime's Gather output
bit for bit; for any other index set it leaves the Gather alone.
"""

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from autodice.core.model import load_model
from autodice.frontend.legalize import Constants, as_range, gather_by_range


@st.composite
def gathers(draw, ranges: bool):
    rank = draw(st.integers(1, 4))
    shape = [draw(st.integers(1, 6)) for _ in range(rank)]
    axis = draw(st.integers(-rank, rank - 1))
    n = shape[axis]
    if ranges:
        start = draw(st.integers(0, n - 1))
        step = draw(st.sampled_from([s for s in range(-n, n + 1) if s] or [1]))
        most = (n - 1 - start) // step + 1 if step > 0 else start // -step + 1
        count = draw(st.integers(1, most))
        flat = start + step * np.arange(count)
    else:
        flat = np.array(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=8)))
    # Gather takes i and i - n alike.
    flat = np.where(np.array(draw(st.lists(st.booleans(), min_size=flat.size,
                                           max_size=flat.size))), flat - n, flat)
    shapes = [(flat.size,), (1, flat.size, 1, 1)] + ([(2, flat.size // 2)] if flat.size % 2 == 0
                                                     else [])
    if flat.size == 1:
        shapes.append(())  # a scalar index drops the axis (torch's select)
    indices = flat.reshape(draw(st.sampled_from(shapes)))
    # Below opset 10, Slice has no steps: the rule may rewrite only step-1 ranges there. The step
    # is the one Gather sees, counting negative indices from the end ([-1, 0] of 2 steps by -1).
    seen = np.where(flat < 0, flat + n, flat)
    step = int(seen[1] - seen[0]) if flat.size > 1 else 1
    opset = draw(st.sampled_from([9, 13])) if step == 1 or not ranges else 13
    return shape, axis, indices.astype(np.int64), opset


def model_of(shape, axis, indices, opset) -> onnx.ModelProto:
    node = helper.make_node("Gather", ["x", "idx"], ["y"], name="g", axis=axis)
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(indices, "idx")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=7)


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def rewrite(tmp_path, model: onnx.ModelProto, opset: int):
    path = tmp_path / "g.onnx"
    onnx.save(model, path)
    graph = load_model(path)
    return gather_by_range(graph, model.graph.node[0], Constants(model, graph), opset)


SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(case=gathers(ranges=True))
# The edges a random draw may miss: a negative step down to index 0 (Slice's end must then be
# "before the first", not -1), ConvNeXt's head as dynamo exports it, a scalar select.
@example(case=([3], 0, np.array([2, 1, 0]), 13))
@example(case=([768], 0, np.arange(768).reshape(1, 768, 1, 1), 18))
@example(case=([1, 5, 4], -2, np.array(-1), 9))
@example(case=([2], 0, np.array([-1, 0]), 13))
def test_a_range_becomes_slice_and_reshape_with_the_same_output(tmp_path, case):
    shape, axis, indices, opset = case
    model = model_of(shape, axis, indices, opset)
    nodes = rewrite(tmp_path, model, opset)
    assert nodes is not None, f"not rewritten: {indices.ravel()} on axis {axis} of {shape}"
    assert "Gather" not in {n.op_type for n in nodes}
    new = onnx.ModelProto()
    new.CopyFrom(model)
    del new.graph.node[:]
    new.graph.node.extend(nodes)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want, got = run(model, x), run(new, x)
    assert want.shape == got.shape and np.array_equal(want, got)


@SETTINGS
@given(case=gathers(ranges=False))
def test_other_index_sets_are_left_alone(tmp_path, case):
    shape, axis, indices, opset = case
    n = shape[axis]
    nodes = rewrite(tmp_path, model_of(shape, axis, indices, opset), opset)
    found = as_range(indices, n)
    # A draw that happens to be a range is rewritten, unless its step needs Slice's steps input.
    assert (nodes is not None) == (found is not None and (found[1] == 1 or opset >= 10))


def test_as_range():
    assert as_range(np.arange(768).reshape(1, 768, 1, 1), 768) == (0, 1, 768)
    assert as_range(np.array([-1, -2, -3]), 5) == (4, -1, 3)
    assert as_range(np.array(2), 5) == (2, 1, 1)
    assert as_range(np.array([0, 2, 3]), 5) is None
    assert as_range(np.array([1, 1]), 5) is None
    assert as_range(np.array([5]), 5) is None  # out of range: Gather itself would fail
