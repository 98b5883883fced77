"""Random DAGs x random mappings: every sub-model is valid ONNX and the chain equals the model.

Tensors are all 1x4x5x5 so any op can read any earlier tensor; the op menu covers element-wise,
two-input, weighted, concat, a Constant and a Shape->Reshape follower chain. Mappings are drawn
per layer, so they come out non-contiguous and ping-pong between ranks as often as not.
"""

import json
import os

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from autodice.core.model import load_model
from autodice.frontend.check import check
from autodice.frontend.split import split

SHAPE = [1, 4, 5, 5]
OPS = ("Relu", "Sigmoid", "Add", "Mul", "Conv", "MaxPool", "ConcatConv", "AddConst", "Reshape")


@st.composite
def dags(draw):
    n = draw(st.integers(1, 10))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    tensors, nodes, inits = ["x"], [], []
    for k in range(n):
        op = draw(st.sampled_from(OPS))
        a = draw(st.sampled_from(tensors))
        b = draw(st.sampled_from(tensors))
        out = f"t{k}"
        name = f"L{k}"
        if op in ("Relu", "Sigmoid"):
            nodes.append(helper.make_node(op, [a], [out], name=name))
        elif op in ("Add", "Mul"):
            nodes.append(helper.make_node(op, [a, b], [out], name=name))
        elif op == "Conv":
            w = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32) / 6,
                                        f"w{k}")
            inits.append(w)
            nodes.append(helper.make_node("Conv", [a, w.name], [out], name=name, pads=[1] * 4))
        elif op == "MaxPool":
            nodes.append(helper.make_node("MaxPool", [a], [out], name=name, kernel_shape=[3, 3],
                                          pads=[1] * 4))
        elif op == "ConcatConv":
            w = numpy_helper.from_array(rng.standard_normal((4, 8, 1, 1)).astype(np.float32) / 3,
                                        f"w{k}")
            inits.append(w)
            nodes += [helper.make_node("Concat", [a, b], [f"c{k}"], name=f"{name}cat", axis=1),
                      helper.make_node("Conv", [f"c{k}", w.name], [out], name=name)]
        elif op == "AddConst":
            value = numpy_helper.from_array(rng.standard_normal(SHAPE[1:]).astype(np.float32))
            nodes += [helper.make_node("Constant", [], [f"k{k}"], name=f"{name}k", value=value),
                      helper.make_node("Add", [a, f"k{k}"], [out], name=name)]
        else:  # Reshape to b's shape, through Shape: the Shape node follows the Reshape
            nodes += [helper.make_node("Shape", [b], [f"s{k}"], name=f"{name}shape"),
                      helper.make_node("Reshape", [a, f"s{k}"], [out], name=name)]
        tensors.append(out)
    consumed = {t for node in nodes for t in node.input}
    outputs = [t for t in tensors[1:] if t not in consumed] or [tensors[-1]]
    if draw(st.booleans()) and len(tensors) > 2:  # an intermediate tensor as an extra output
        extra = draw(st.sampled_from(tensors[1:]))
        outputs = list(dict.fromkeys(outputs + [extra]))
    graph = helper.make_graph(
        nodes, "random", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, SHAPE) for t in outputs], inits)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13)])


PLATFORM = "my_board_1, x86, slots=0-7, gpu=Test (VULKAN)\nother, arm, slots=0-3\n"
KEYS = ["my_board_1_x860", "my_board_1_gpu", "other_arm2", "my_board_1_cpu5-7"]


# CI explores the same examples every run (a red CI should mean a change broke something);
# locally each run explores new ones. AUTODICE_EXAMPLES=500 for a longer hunt.
@settings(max_examples=int(os.environ.get("AUTODICE_EXAMPLES", 60)), deadline=None,
          derandomize=bool(os.environ.get("CI")),
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=dags(), data=st.data())
def test_random_dag_random_mapping(tmp_path_factory, model, data):
    tmp = tmp_path_factory.mktemp("prop")
    onnx.save(model, tmp / "m.onnx")
    graph = load_model(tmp / "m.onnx")
    layers = [graph.names[i] for i in range(len(graph.nodes)) if i not in graph.followers]
    n_ranks = data.draw(st.integers(1, len(KEYS)))
    keys = KEYS[:n_ranks]
    mapping = {k: [] for k in keys}
    for layer in layers:
        mapping[data.draw(st.sampled_from(keys))].append(layer)
    mapping = {k: v for k, v in mapping.items() if v}  # split refuses a key with no layers
    (tmp / "mapping.json").write_text(json.dumps(mapping))
    (tmp / "platform.txt").write_text(PLATFORM)
    plan = split(tmp / "m.onnx", tmp / "mapping.json", tmp / "platform.txt", tmp / "out")
    for r in plan.ranks:
        onnx.checker.check_model(str(tmp / "out" / r.submodel), full_check=True)
    for diff in check(tmp / "out", samples=2):
        assert diff.rel <= 1e-6, diff
