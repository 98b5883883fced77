"""Small test graphs, each drawn above its builder."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def figure2(seed: int = 0) -> onnx.ModelProto:
    """The AutoDiCE paper's Figure 2::

        input -> MaxPool1 -> Buff1 -+-> Conv1 -> Buff2 -+
                                    |                   +-> Add1 -> Buff4 -> Relu1 -> output
                                    +-> FC1   -> Buff3 -+
    """
    rng = np.random.default_rng(seed)
    w_conv = numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "w_conv")
    w_fc = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w_fc")
    nodes = [
        helper.make_node("MaxPool", ["input"], ["Buff1"], name="MaxPool1", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Conv", ["Buff1", "w_conv"], ["Buff2"], name="Conv1"),
        helper.make_node("MatMul", ["Buff1", "w_fc"], ["Buff3"], name="FC1"),
        helper.make_node("Add", ["Buff2", "Buff3"], ["Buff4"], name="Add1"),
        helper.make_node("Relu", ["Buff4"], ["output"], name="Relu1"),
    ]
    graph = helper.make_graph(
        nodes, "figure2",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4, 4, 4])],
        [w_conv, w_fc])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8,
                             producer_name="autodice-tests")


def symbolic_model() -> onnx.ModelProto:
    """Two Relus on a 1x4xHxW input: shapes only with --input-shape."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu1"),
             helper.make_node("Relu", ["r"], ["y"], name="relu2")]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]), ir_version=8,
                             opset_imports=[helper.make_opsetid("", 13)])
