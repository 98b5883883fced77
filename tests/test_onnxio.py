"""The lazy reader/writer: weights by reference, external data, old-style models, layer names."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from autodice.core import onnxio, onnxwrite
from autodice.core.model import load_model, name_layers
from autodice.core.shapes import parse_input_shapes
from autodice.frontend.check import check
from autodice.frontend.split import split
from autodice.frontend.suggest import balanced_mapping


def write_mapping(path, model, keys):
    """A balanced mapping of ``model`` over ``keys``, written to ``path``."""
    path.write_text(json.dumps(balanced_mapping(load_model(model), keys)))


def test_round_trip_keeps_every_weight(tmp_path, zoo_model):
    src = zoo_model("squeezenet")
    lazy = onnxio.read_model(src)
    assert lazy.proto.graph.initializer == [] and len(lazy.tensors) > 20
    onnxwrite.write_model(tmp_path / "copy.onnx", lazy.proto, list(lazy.tensors.values()))
    a, b = onnx.load(src), onnx.load(tmp_path / "copy.onnx")
    onnx.checker.check_model(b)
    assert {i.name: numpy_helper.to_array(i).tobytes() for i in a.graph.initializer} == \
           {i.name: numpy_helper.to_array(i).tobytes() for i in b.graph.initializer}
    assert list(a.graph.node) == list(b.graph.node)


def test_large_weights_keep_their_page_offset_and_go_as_one_range(tmp_path, zoo_model,
                                                                   monkeypatch):
    """The kernel copies whole pages when a weight lands at its source offset modulo the page
    size; weights that lie back to back in the source are one range to copy."""
    src = zoo_model("squeezenet")
    lazy = onnxio.read_model(src)
    ranges = []
    copy = onnxwrite.Sources.copy
    monkeypatch.setattr(onnxwrite.Sources, "copy",
                        lambda self, *args: ranges.append(args[1:]) or copy(self, *args))
    # every other weight, in reverse: runs of one tensor each, at shifted offsets
    chosen = list(lazy.tensors.values())[::-2]
    onnxwrite.write_model(tmp_path / "some.onnx", lazy.proto, chosen)
    onnxwrite.write_model(tmp_path / "all.onnx", lazy.proto, list(lazy.tensors.values()))
    big = [t for t in chosen if t.length >= onnxwrite.COPY_MIN]
    assert len(ranges) == len(big) + 1 and big  # ... and the whole model's weights in one
    written = onnxio.read_model(tmp_path / "some.onnx").tensors
    for t in big:
        assert written[t.name].raw_offset % 4096 == t.raw_offset % 4096
    onnx.checker.check_model(onnx.load(tmp_path / "all.onnx"))
    for name, tensors in (("some", chosen), ("all", lazy.tensors.values())):
        model = onnx.load(tmp_path / f"{name}.onnx")
        want = {t.name: onnxio.read_array(t) for t in tensors}
        assert [i.name for i in model.graph.initializer] == list(want)
        for i in model.graph.initializer:
            assert np.array_equal(numpy_helper.to_array(i), want[i.name])
            assert not i.doc_string.strip()


def test_a_weights_own_doc_string_outlasts_the_padding(tmp_path):
    """The padding that shifts a weight is a doc_string before the tensor's own fields."""
    w = numpy_helper.from_array(np.arange(70_000, dtype=np.float32).reshape(70, 1000), "w")
    w.doc_string = "kept"
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 70])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1000])],
                              [w])
    onnx.save(helper.make_model(graph), tmp_path / "m.onnx")
    lazy = onnxio.read_model(tmp_path / "m.onnx")
    for pad in range(0, 4096, 511):  # the header before the weight: every padding size
        lazy.proto.doc_string = "x" * pad
        onnxwrite.write_model(tmp_path / "w.onnx", lazy.proto, list(lazy.tensors.values()))
        (t,) = onnx.load(tmp_path / "w.onnx").graph.initializer
        assert t.doc_string == "kept" and numpy_helper.to_array(t).tobytes() == w.raw_data
        ref = onnxio.read_model(tmp_path / "w.onnx").tensors["w"]
        assert ref.raw_offset % 4096 == lazy.tensors["w"].raw_offset % 4096


def test_external_data_in_and_out(tmp_path, zoo_model, fig2):
    model = onnx.load(zoo_model("squeezenet"))
    onnx.save_model(model, tmp_path / "ext.onnx", save_as_external_data=True,
                    location="ext.weights", size_threshold=0)
    lazy = onnxio.read_model(tmp_path / "ext.onnx")
    assert all(t.external for t in lazy.tensors.values())
    write_mapping(tmp_path / "m.json", tmp_path / "ext.onnx", ["edge01_arm1", "edge04_x862"])
    plan = split(tmp_path / "ext.onnx", tmp_path / "m.json", fig2 / "platform.txt", tmp_path / "o")
    for r in plan.ranks:
        assert (tmp_path / "o" / (r.submodel + ".data")).exists()
    assert check(tmp_path / "o")[0].rel < 1e-5


def test_submodels_past_the_protobuf_limit_go_external(tmp_path, zoo_model, fig2, monkeypatch):
    monkeypatch.setattr(onnxwrite, "PROTOBUF_LIMIT", 100_000)
    src = zoo_model("squeezenet")
    write_mapping(tmp_path / "m.json", src, ["edge01_arm1", "edge01_arm2"])
    plan = split(src, tmp_path / "m.json", fig2 / "platform.txt", tmp_path / "o")
    sizes = [(tmp_path / "o" / r.submodel).stat().st_size for r in plan.ranks]
    assert max(sizes) < 100_000
    assert check(tmp_path / "o")[0].rel < 1e-5


def test_old_style_initializers_listed_as_inputs(tmp_path, zoo_model, fig2):
    """Zoo-era models list every weight in graph.input; the weights must not get lost."""
    model = onnx.load(zoo_model("squeezenet"))
    model.graph.input.extend(helper.make_tensor_value_info(i.name, i.data_type, i.dims)
                             for i in model.graph.initializer)
    model.ir_version = 3
    onnx.save(model, tmp_path / "old.onnx")
    g = load_model(tmp_path / "old.onnx")
    assert g.inputs == ["data_0"]
    write_mapping(tmp_path / "m.json", tmp_path / "old.onnx", ["edge01_arm1", "edge01_arm2",
                                                               "edge04_gpu"])
    plan = split(tmp_path / "old.onnx", tmp_path / "m.json", fig2 / "platform.txt", tmp_path / "o")
    assert [t.name for t in plan.model_inputs] == ["data_0"]
    for r in plan.ranks:
        sub = onnx.load(tmp_path / "o" / r.submodel)
        onnx.checker.check_model(sub)
        assert {i.name for i in sub.graph.input} == {t.name for t in r.submodel_inputs}
    assert check(tmp_path / "o")[0].rel < 1e-5


def test_layer_names_unnamed_and_duplicates():
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Relu", ["a"], ["b"], name="r"),
             helper.make_node("Relu", ["b"], ["c"], name="r"),
             helper.make_node("Relu", ["c"], ["d"], name="r_1"),
             helper.make_node("Relu", ["d"], ["e"], name="r")]
    assert name_layers(nodes) == ["a", "r", "r_2", "r_1", "r_3"]


def test_unsorted_graph_is_sorted(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    nodes = [helper.make_node("Relu", ["a"], ["y"], name="second"),
             helper.make_node("Neg", ["x"], ["a"], name="first")]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y]), ir_version=8),
              tmp_path / "m.onnx")
    assert load_model(tmp_path / "m.onnx").names == ["first", "second"]


def test_shape_arithmetic_follows_its_consumers(tmp_path, fig2):
    """x -> Relu(a) -> Reshape(shape = Concat(Shape(x)[0], -1)) -> Relu(b): the Shape/Gather/
    Concat/Constant nodes are not mapped and land on the rank of Reshape."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="a"),
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
        helper.make_node("Constant", [], ["minus1"], name="const",
                         value=numpy_helper.from_array(np.array([-1], np.int64))),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsq"),
        helper.make_node("Concat", ["n1", "minus1"], ["shp"], name="concat", axis=0),
        helper.make_node("Reshape", ["r", "shp"], ["flat"], name="reshape"),
        helper.make_node("Relu", ["flat"], ["y"], name="b"),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes")]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits), ir_version=8,
                                opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "m.onnx")
    g = load_model(tmp_path / "m.onnx")
    assert {g.names[i] for i in g.followers} == {"shape", "gather", "const", "unsq", "concat"}
    (tmp_path / "map.json").write_text('{"edge01_arm1": ["a"], "edge01_arm2": ["reshape", "b"]}')
    plan = split(tmp_path / "m.onnx", tmp_path / "map.json", fig2 / "platform.txt", tmp_path / "o")
    assert [e.tensor for e in plan.edges] == ["r"]  # no shape tensor crosses ranks
    assert set(plan.ranks[1].followers) == {"shape", "gather", "const", "unsq", "concat"}
    assert plan.ranks[0].followers == ()
    # The chain reaches pnnx as its value: Reshape reads a constant [1, -1] (of the 1x3x4 input
    # that the identity MaxPool tells pnnx has a batch, as only a Reshape reads it).
    sub = onnx.load(tmp_path / "o" / plan.ranks[1].submodel)
    assert [n.op_type for n in sub.graph.node] == (["MaxPool"] + ["Constant"] * 5
                                                   + ["Reshape", "Relu"])
    shp = next(n for n in sub.graph.node if n.output[0] == "shp")
    assert numpy_helper.to_array(shp.attribute[0].t).tolist() == [1, -1]
    assert check(tmp_path / "o")[0].max_abs == 0


@pytest.mark.parametrize("text, shapes", [("data=1x3x224x224", {"data": (1, 3, 224, 224)})])
def test_input_shape_spec(text, shapes):
    assert parse_input_shapes([text]) == shapes


def test_chained_shape_reshape_resolves(tmp_path):
    """Reshape(x, Shape(Reshape(...))): ONNX inference leaves these unknown; folding settles
    one level per round, so it must repeat until nothing changes (found by hypothesis)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a")]
    prev = "a"
    for k in range(3):
        nodes += [helper.make_node("Shape", [prev], [f"s{k}"], name=f"s{k}"),
                  helper.make_node("Reshape", ["x", f"s{k}"], [f"r{k}"], name=f"r{k}")]
        prev = f"r{k}"
    y = helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y]), ir_version=8,
                                opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "m.onnx")
    g = load_model(tmp_path / "m.onnx")
    assert all(g.types[f"r{k}"].shape == (1, 4, 5, 5) for k in range(3))
    assert {g.names[i] for i in g.followers} == {"s0", "s1", "s2"}


def test_paddles_minus_one_dims_are_open_and_an_input_shape_fixes_them(tmp_path):
    """Paddle's exports write -1 where others name a dim, in inputs and in declared outputs
    (PP-OCR's classifier: x -1x3x-1x-1, its output -1x2); inference at batch 1 or at the given
    shape must not take those for sizes that contradict it."""
    w = numpy_helper.from_array(np.ones((2, 3, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["c"], ["m"], name="pool", axes=[2, 3], keepdims=0),
             helper.make_node("Identity", ["m"], ["y"], name="out")]
    graph = helper.make_graph(nodes, "paddle", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [-1, 3, -1, -1])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [-1, 2])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
              tmp_path / "m.onnx")
    g = load_model(tmp_path / "m.onnx", {"x": (1, 3, 48, 192)})
    assert g.types["c"].shape == (1, 2, 48, 192) and g.types["y"].shape == (1, 2)
    assert load_model(tmp_path / "m.onnx").types["y"].shape == (1, 2)  # batch 1, sizes open
