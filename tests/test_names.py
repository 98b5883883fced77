"""Names are data, never code: any ONNX name (quotes, backslashes, newlines, ``*/``, ``??/``, NUL,
bidirectional overrides) reaches the generated C++ only escaped, the program compiles and runs
equal to onnxruntime, and the name's bytes come back unchanged in plan.json.
"""

from __future__ import annotations

import json
import re
import subprocess

import jinja2
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from autodice.backend.build import build
from autodice.backend.gen import gen
from autodice.backend.run import run
from autodice.core.names import Escaped, cpp_comment, cpp_string, file_slug, finalize, unique_slugs
from autodice.core.plan import load_plan
from autodice.frontend.split import split

EVIL = [
    'x"); system("touch /tmp/pwned"); //\nint pwn = 1; /*',
    "ends in a backslash \\",
    "trigraph ??/ and */ and /* and \\n",
    "nul\x00inside",
    "bidi \u202e override \u2066 and \u2028 line sep",
    "\t\r\n",
    "日本語のテンソル",
]
names = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=24)


def compile_and_run(tmp_path, source: str) -> str:
    (tmp_path / "t.cpp").write_text(source)
    proc = subprocess.run(["c++", "-std=c++17", "-Wall", "-Werror", "-o", str(tmp_path / "t"),
                           str(tmp_path / "t.cpp")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return subprocess.run([str(tmp_path / "t")], capture_output=True, text=True,
                          check=True).stdout


@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(names, min_size=40, max_size=40))
def test_string_literals_keep_every_byte_and_comments_end_nothing(tmp_path, drawn):
    texts = EVIL + drawn
    body = []
    for k, t in enumerate(texts):
        body.append(f"  // {cpp_comment(t)}")  # must not swallow the next line
        body.append(f"  print({cpp_string(t)}); total += {k};")
    source = ("#include <cstdio>\n#include <string>\nusing namespace std::string_literals;\n"
              "static void print(const std::string& s) {\n"
              "  for (unsigned char c : s) std::printf(\"%02x\", c);\n  std::printf(\"\\n\");\n}\n"
              "int main() {\n  long total = 0;\n" + "\n".join(body)
              + '\n  std::printf("%ld\\n", total);\n}\n')
    lines = compile_and_run(tmp_path, source).splitlines()
    assert lines[:-1] == [t.encode().hex() for t in texts]
    assert lines[-1] == str(sum(range(len(texts))))


@given(names)
def test_a_comment_is_one_printable_line(text):
    c = cpp_comment(text)
    assert c.isprintable() and "\\" not in c and "?" not in c and len(c) <= 120


def test_templates_cannot_print_a_raw_name():
    env = jinja2.Environment(finalize=finalize)
    with pytest.raises(TypeError, match="raw string"):
        env.from_string("{{ x }}").render(x="a\nb")
    assert env.from_string("{{ x }} {{ n }}").render(x=cpp_string("a"), n=3) == '"a"s 3'
    assert isinstance(cpp_comment("x"), Escaped)


def test_file_slugs_are_safe_and_unique():
    assert file_slug("gpu_0/softmax_1", ".npy") == "gpu_0_softmax_1.npy"
    assert file_slug("..") == "_.." and file_slug(".hidden") == "_.hidden"
    assert unique_slugs(["a/b", "a_b", "A_B", "a b"], ".npy") == {
        "a/b": "a_b.npy", "a_b": "a_b-2.npy", "A_B": "A_B-3.npy", "a b": "a_b-4.npy"}
    long = "x" * 300
    assert len(file_slug(long)) < 120 and file_slug(long) != file_slug(long + "y")


def evil_model(n: list[str], seed: int = 0) -> onnx.ModelProto:
    """Figure 2's shape with names from ``n`` (tensors n[0..4], nodes n[5..9])::

        n0 -> MaxPool n5 -> n1 -+-> Conv n6 -> n2 -+-> Add n8 -> n4 -> Relu n9 -> n3 (output)
                                +-> MatMul n7 -> n10 +
    """
    rng = np.random.default_rng(seed)
    w_conv = numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "wc")
    w_fc = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "wf")
    nodes = [
        helper.make_node("MaxPool", [n[0]], [n[1]], name=n[5], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", [n[1], "wc"], [n[2]], name=n[6]),
        helper.make_node("MatMul", [n[1], "wf"], [n[10]], name=n[7]),
        helper.make_node("Add", [n[2], n[10]], [n[4]], name=n[8]),
        helper.make_node("Relu", [n[4]], [n[3]], name=n[9]),
    ]
    graph = helper.make_graph(
        nodes, "evil", [helper.make_tensor_value_info(n[0], TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info(n[3], TensorProto.FLOAT, [1, 4, 4, 4])], [w_conv, w_fc])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def run_evil(tmp_path, n: list[str]) -> None:
    """split -> gen -> build -> run with these names; equal to onnxruntime; names round-trip."""
    model = evil_model(n)
    (tmp_path / "platform.txt").write_text("edge01, x86, slots=0-3\n")
    # Layers named as `autodice layers` would (node names), cut so evil tensors cross ranks.
    (tmp_path / "mapping.json").write_text(json.dumps(
        {"edge01_x860": [n[5], n[8]], "edge01_x861": [n[7]], "edge01_x862": [n[6], n[9]]}))
    onnx.save(model, tmp_path / 'mo"del\n.onnx')
    split(tmp_path / 'mo"del\n.onnx', tmp_path / "mapping.json", tmp_path / "platform.txt",
          tmp_path / "out")
    plan = load_plan(tmp_path / "out")
    assert {t for r in plan.ranks for t in r.layers} == set(n[5:10])
    assert {e.tensor for e in plan.edges} == {n[1], n[2], n[10], n[4]}
    gen(tmp_path / "out")
    program = (tmp_path / "out" / "packages" / "edge01" / "program.cpp").read_text()
    code = re.sub(r"//[^\n]*", "", re.sub(r'"(?:[^"\\\n]|\\.)*"s', '""', program))
    assert "system(" not in code and "pwn" not in code  # the names are only in literals/comments
    build(tmp_path / "out")
    x = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    res = run(tmp_path / "out", {n[0]: tmp_path / "x.npy"}, frames=3)
    want = ort.InferenceSession(str(tmp_path / 'mo"del\n.onnx')).run(None, {n[0]: x})[0]
    np.testing.assert_allclose(res.outputs[n[3]], want, rtol=1e-5, atol=1e-6)


@pytest.mark.cpp
def test_the_worst_names_compile_run_and_round_trip(tmp_path):
    run_evil(tmp_path, [*EVIL, "plain", "'single'", "back\\slash\\", "a b c"])


@pytest.mark.cpp
@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(names, min_size=11, max_size=11, unique=True))
def test_random_names_compile_run_and_round_trip(tmp_path_factory, drawn):
    assume(not {"wc", "wf"} & set(drawn))  # the weights' own names
    run_evil(tmp_path_factory.mktemp("names"), drawn)


def test_names_that_look_like_markup_print_as_they_are(tmp_path):
    """The console shows names as they are: "[/x]" would otherwise end a style that never began
    (rich raises) and "[bold]" start one."""
    from click.testing import CliRunner

    from autodice.cli import main

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu[/x]"),
             helper.make_node("Relu", ["r"], ["y"], name="a[bold]b$\\x$")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), ir_version=8,
                              opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, tmp_path / "m.onnx")
    res = CliRunner().invoke(main, ["layers", str(tmp_path / "m.onnx")])
    assert res.exit_code == 0, res.output
    assert "relu[/x]" in res.output and "a[bold]b$\\x$" in res.output
    res = CliRunner().invoke(main, ["zoo", "[/x]", "-o", str(tmp_path / "z.onnx")])
    assert res.exit_code == 2 and 'zoo model "[/x]" is unknown' in res.output, res.output
    # Nor is "$\x$" a formula (matplotlib cannot parse that one) in the partition's picture.
    (tmp_path / "platform.txt").write_text("edge01, x86, slots=0-1\n")
    (tmp_path / "mapping.json").write_text(json.dumps({"edge01_x860": ["relu[/x]"],
                                                       "edge01_x861": ["a[bold]b$\\x$"]}))
    res = CliRunner().invoke(main, ["split", str(tmp_path / "m.onnx"), "-m",
                                    str(tmp_path / "mapping.json"), "-p",
                                    str(tmp_path / "platform.txt"), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["view", str(tmp_path / "out"), "-o", str(tmp_path / "p.png")])
    assert res.exit_code == 0, res.output
