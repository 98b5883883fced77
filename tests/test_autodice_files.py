"""Users of the original AutoDiCE tool bring its files: a platform.txt with ``cpu`` as the arch and
``gpu=none (none)`` (or only host names, one per line), and mappings that name layers by their
first output as its exporter spelled them (``/`` -> ``_``). They work unchanged, end to end:
split --check, gen, build, run under mpirun against onnxruntime, and dse.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from test_cost import fixture_profile

from autodice.cli import main
from autodice.core.errors import AutodiceError
from autodice.core.mapping import parse_mapping_text
from autodice.core.model import load_model
from autodice.core.spec import parse_platform_text
from autodice.dse.profile import save_profile
from autodice.frontend.place import assign_ranks, check_resources

PLATFORM = "edge01, cpu, slots=0-1, gpu=none (none)\nedge02, cpu, slots=0-1, gpu=none (none)\n"


def exported_cnn(seed: int = 0) -> onnx.ModelProto:
    """A small CNN named the way torch's exporter names things (node ``/features/conv1/Conv``,
    output ``/features/conv1/Conv_output_0``)::

        x -> /features/conv1/Conv -> /features/relu1/Relu -> /features/pool/MaxPool
          -> /features/conv2/Conv -> /features/relu2/Relu -> /head/GlobalAveragePool -> y
    """
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w2")
    chain = [("/features/conv1/Conv", "Conv", ["w1"], {"pads": [1, 1, 1, 1]}),
             ("/features/relu1/Relu", "Relu", [], {}),
             ("/features/pool/MaxPool", "MaxPool", [], {"kernel_shape": [2, 2], "strides": [2, 2]}),
             ("/features/conv2/Conv", "Conv", ["w2"], {"pads": [1, 1, 1, 1]}),
             ("/features/relu2/Relu", "Relu", [], {}),
             ("/head/GlobalAveragePool", "GlobalAveragePool", [], {})]
    nodes, prev = [], "x"
    for k, (name, op, extra, attrs) in enumerate(chain):
        out = "y" if k == len(chain) - 1 else f"{name}_output_0"
        nodes.append(helper.make_node(op, [prev, *extra], [out], name=name, **attrs))
        prev = out
    graph = helper.make_graph(nodes, "exported",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 1, 1])],
                              [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def autodice_mapping(model: onnx.ModelProto) -> dict[str, list[str]]:
    """What the original tool's users write: first outputs, ``/`` as ``_`` (its format_onnx)."""
    names = [n.output[0].replace("/", "_") for n in model.graph.node]
    names[-1] = model.graph.node[-1].output[0]  # one by the raw output name, too
    return {"edge01_cpu0": names[:3], "edge02_cpu01": names[3:]}


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.cpp
def test_autodice_files_split_check_gen_build_run_and_dse(tmp_path):
    model = exported_cnn()
    onnx.save(model, tmp_path / "model.onnx")
    (tmp_path / "platform.txt").write_text(PLATFORM)
    (tmp_path / "mapping.json").write_text(json.dumps(autodice_mapping(model)))
    r = invoke("split", tmp_path / "model.onnx", "-m", tmp_path / "mapping.json",
               "-p", tmp_path / "platform.txt", "-o", tmp_path / "out", "--check")
    assert r.exit_code == 0, r.output
    assert "check y:" in r.output and "ok" in r.output
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert [r["layers"] for r in plan["ranks"]] == [
        ["/features/conv1/Conv", "/features/relu1/Relu", "/features/pool/MaxPool"],
        ["/features/conv2/Conv", "/features/relu2/Relu", "/head/GlobalAveragePool"]]
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    for args in (("gen", tmp_path / "out"), ("build", tmp_path / "out"),
                 ("run", tmp_path / "out", "--input", tmp_path / "x.npy", "--frames", 4,
                  "--check")):
        r = invoke(*args)
        assert r.exit_code == 0, r.output
    assert "check y:" in r.output and "FAIL" not in r.output

    save_profile(fixture_profile(load_model(tmp_path / "model.onnx")), tmp_path / "profile.json")
    r = invoke("dse", tmp_path / "model.onnx", "-p", tmp_path / "platform.txt", "--profile",
               tmp_path / "profile.json", "-o", tmp_path / "front", "--pop", 8, "--gens", 3)
    assert r.exit_code == 0, r.output
    assert "assumed 1 Gbit/s Ethernet" in r.output
    notes = json.loads((tmp_path / "front" / "pareto.json").read_text())["notes"]
    assert any("no bandwidth for edge01-edge02: assumed 1 Gbit/s" in n for n in notes)


def test_platform_of_host_names_only(tmp_path):
    """The original tool's own platform.txt lists host names; the keys name the cores."""
    spec = parse_platform_text("nx01\nnx02\n")
    assert [(d.name, d.arch, d.slots, d.gpu) for d in spec.devices.values()] == [
        ("nx01", "cpu", None, None), ("nx02", "cpu", None, None)]
    model = exported_cnn()
    onnx.save(model, tmp_path / "model.onnx")
    (tmp_path / "platform.txt").write_text("nx01\nnx02\n")
    mapping = autodice_mapping(model)
    (tmp_path / "mapping.json").write_text(json.dumps(
        {"nx01_arm123": mapping["edge01_cpu0"], "nx02_gpu": mapping["edge02_cpu01"]}))
    r = invoke("split", tmp_path / "model.onnx", "-m", tmp_path / "mapping.json",
               "-p", tmp_path / "platform.txt", "-o", tmp_path / "out")
    assert r.exit_code == 2 and 'host "nx02" has no GPU' in r.output
    (tmp_path / "platform.txt").write_text("nx01\nnx02, cpu, slots=0-5, gpu=NVIDIAVolta (CUDA)\n")
    r = invoke("split", tmp_path / "model.onnx", "-m", tmp_path / "mapping.json",
               "-p", tmp_path / "platform.txt", "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "rankfile").read_text() == (
        "rank 0=nx01 slots=1,2,3\nrank 1=nx02 slots=0\n")


@pytest.mark.parametrize("line, problem", [
    ("edge01, cpus, slots=0-1", 'arch "cpus" is not one of arm, x86, cpu (did you mean "cpu"?)'),
    ("edge01, arm, slot=0-1", 'unknown field "slot=0-1" (did you mean "slots"?)'),
])
def test_typos_are_still_caught(line, problem):
    with pytest.raises(AutodiceError, match="x") as e:
        parse_platform_text(line + "\n", "x")
    assert any(problem in p for p in e.value.problems), e.value.problems


def test_host_address_lines_of_an_early_autodice():
    """An early version of the original tool wrote "tx01:192.168.178.66" lines."""
    spec = parse_platform_text("tx01:192.168.178.66\ntx02:192.168.178.206\nnx01\n")
    assert [(d.name, d.arch, d.slots) for d in spec.devices.values()] == [
        ("tx01", "cpu", None), ("tx02", "cpu", None), ("nx01", "cpu", None)]
    with pytest.raises(AutodiceError, match='device "tx01" is defined twice'):
        parse_platform_text("tx01:10.0.0.1\ntx01\n")


def test_uname_spellings_and_no_gpu():
    spec = parse_platform_text("a, aarch64, slots=0-3, gpu=none (none)\nb, x86_64, slots=0\n")
    assert [(d.arch, d.gpu, d.gpu_api) for d in spec.devices.values()] == [
        ("arm", None, None), ("x86", None, None)]


def test_a_name_two_nodes_could_mean_is_ambiguous(tmp_path):
    """``a_b`` is one node's first output and, spelled the AutoDiCE way, another's (``a/b``)."""
    nodes = [helper.make_node("Relu", ["x"], ["a/b"], name="first"),
             helper.make_node("Relu", ["a/b"], ["a_b"], name="second"),
             helper.make_node("Relu", ["a_b"], ["y"], name="third")]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("x", "y")]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", io[:1], io[1:]),
                                opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "m.onnx")
    graph = load_model(tmp_path / "m.onnx")
    platform = parse_platform_text("e1, cpu, slots=0\n")
    mapping = parse_mapping_text(json.dumps({"e1_cpu0": ["a_b", "first", "third"]}))
    with pytest.raises(AutodiceError) as e:
        assign_ranks(graph, mapping, check_resources(mapping, platform), platform)
    assert e.value.problems[0] == ('mapping.json: key "e1_cpu0": layer "a_b" is ambiguous: it '
                                   'names the first output of "first", "second"; use one of '
                                   'those names')


def test_many_unknown_layers_are_grouped(zoo_model):
    """A mapping for another model: 20 offenders with did-you-mean, then a count (it once took
    2.5 s to compare 910 names with every layer, one line each)."""
    path = zoo_model("densenet121")
    graph = load_model(path)
    names = [f"nope{i}" for i in range(1000)]
    platform = parse_platform_text("e1, cpu, slots=0\n")
    mapping = parse_mapping_text(json.dumps({"e1_cpu0": names}))
    with pytest.raises(AutodiceError) as e:
        assign_ranks(graph, mapping, check_resources(mapping, platform), platform)
    assert len(e.value.problems) == 21
    assert e.value.problems[-1] == f"mapping.json: and 980 more layers not in {path} (1000 in all)"
