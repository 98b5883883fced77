"""Transformer token plumbing as torch exports it, small: the shapes at which pnnx's idea of a
batch axis met a sub-model's edge (LeViT, DeiT, EdgeNeXt cut in their blocks)."""

from __future__ import annotations

import numpy as np
import onnx
from graphs import _model
from onnx import helper, numpy_helper


def levit_tokens(seed: int = 0) -> onnx.ModelProto:
    """LeViT's Linear + BatchNorm over tokens, as torch exports it: the batch norm reads the
    tokens flattened to N x C, whose leading axis is no batch::

        input 1x8x4x4 -> Conv embed -> Reshape tokens (1x8x16) -> Transpose rows (1x16x8)
          -> MatMul linear (1x16x12) -> Flatten flat (16x12) -> BatchNormalization bn
          -> Reshape back (1x16x12) -> MatMul proj (1x16x8) -> output
    """
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (8, 8, 1, 1)), ("lin", (8, 12)), ("proj", (12, 8)),
                          ("gamma", (12,)), ("beta", (12,)), ("mean", (12,)))]
    inits += [numpy_helper.from_array((0.5 + rng.random(12)).astype(np.float32), "var")]
    inits += [numpy_helper.from_array(np.array(s, np.int64), n)
              for n, s in (("tokens", [1, 8, 16]), ("back", [1, 16, 12]))]
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["c"], name="embed"),
        helper.make_node("Reshape", ["c", "tokens"], ["t"], name="tokens"),
        helper.make_node("Transpose", ["t"], ["r"], name="rows", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["r", "lin"], ["l"], name="linear"),
        helper.make_node("Flatten", ["l"], ["f"], name="flat", axis=2),
        helper.make_node("BatchNormalization", ["f", "gamma", "beta", "mean", "var"], ["b"],
                         name="bn"),
        helper.make_node("Reshape", ["b", "back"], ["u"], name="back"),
        helper.make_node("MatMul", ["u", "proj"], ["output"], name="proj"),
    ]
    return _model(nodes, "levit_tokens", ("input", [1, 8, 4, 4]), ("output", [1, 16, 8]),
                  inits, opset=17, ir=8)


def vit_residual(seed: int = 0) -> onnx.ModelProto:
    """A transformer block's residual: tokens added to what a Linear made of them::

        input 1x8x4x4 -> Conv embed -> Reshape tokens (1x8x16) -> Transpose rows (1x16x8) = t
          -> Relu act -> MatMul mlp (1x16x8) -> Add residual (t + mlp) -> MatMul proj -> output
    """
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (8, 8, 1, 1)), ("fc", (8, 8)), ("proj", (8, 8)))]
    inits.append(numpy_helper.from_array(np.array([1, 8, 16], np.int64), "tokens"))
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["c"], name="embed"),
        helper.make_node("Reshape", ["c", "tokens"], ["s"], name="tokens"),
        helper.make_node("Transpose", ["s"], ["t"], name="rows", perm=[0, 2, 1]),
        helper.make_node("Relu", ["t"], ["a"], name="act"),
        helper.make_node("MatMul", ["a", "fc"], ["m"], name="mlp"),
        helper.make_node("Add", ["t", "m"], ["r"], name="residual"),
        helper.make_node("MatMul", ["r", "proj"], ["output"], name="proj"),
    ]
    return _model(nodes, "vit_residual", ("input", [1, 8, 4, 4]), ("output", [1, 16, 8]),
                  inits, opset=17, ir=8)


def _attention(x: str, name: str) -> list[onnx.NodeProto]:
    """Two-head self-attention of 4x4x8 tokens ``x`` onto themselves, as dynamo spells it
    (queries and keys each scaled by d^-1/4), pnnx's ``F.scaled_dot_product_attention``."""
    def step(op: str, inputs: list[str], out: str, **attrs) -> onnx.NodeProto:
        return helper.make_node(op, [i if i in (x, "heads", "scale") else f"{name}/{i}"
                                     for i in inputs], [f"{name}/{out}"], name=f"{name}/{out}",
                                **attrs)
    return [step("Reshape", [x, "heads"], "split"),
            step("Transpose", ["split"], "h", perm=[0, 2, 1, 3]),
            step("Mul", ["h", "scale"], "q"),
            step("Transpose", ["h"], "kt", perm=[0, 1, 3, 2]),
            step("Mul", ["kt", "scale"], "k"),
            step("MatMul", ["q", "k"], "scores"),
            step("Softmax", ["scores"], "probs", axis=-1),
            step("MatMul", ["probs", "h"], "mix"),
            step("Transpose", ["mix"], "merge", perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [f"{name}/merge", "tokens"], [name], name=name)]


def patch_tokens(seed: int = 0) -> onnx.ModelProto:
    """MobileViT's unfolded patches: one sequence of tokens per position inside a 2x2 patch, so
    the tokens' leading axis is 4, read by attention (pnnx makes that axis ncnn's batch: four
    Mats of 4x8)::

        input 1x8x4x4 -> Conv embed -> Reshape rows (16x2x2x2) -> Transpose swap (16x2x2x2)
          -> Reshape patches (1x8x4x4) -> Transpose spread (1x4x4x8) -> Reshape tokens (4x4x8)
          -> attention attend (4x4x8) -> Add residual (tokens + attend)
          -> attention attend2 (4x4x8) -> Add residual2 (residual + attend2)
          -> Reshape gather (1x4x4x8) -> Transpose fold (1x8x4x4) -> Reshape unrows (16x2x2x2)
          -> Transpose unswap (16x2x2x2) -> Reshape image (1x8x4x4) -> Conv out -> output
    """
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (8, 8, 1, 1)), ("w2", (8, 8, 1, 1)))]
    inits += [numpy_helper.from_array(np.array(s, np.int64), n)
              for n, s in (("rows", [16, 2, 2, 2]), ("patches", [1, 8, 4, 4]),
                           ("tokens", [4, 4, 8]), ("heads", [4, 4, 2, 4]),
                           ("gather", [1, 4, 4, 8]))]
    inits.append(numpy_helper.from_array(np.array(4 ** -0.5, np.float32), "scale"))
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["c"], name="embed"),
        helper.make_node("Reshape", ["c", "rows"], ["r"], name="rows"),
        helper.make_node("Transpose", ["r"], ["s"], name="swap", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["s", "patches"], ["p"], name="patches"),
        helper.make_node("Transpose", ["p"], ["q"], name="spread", perm=[0, 3, 2, 1]),
        helper.make_node("Reshape", ["q", "tokens"], ["t"], name="tokens"),
        *_attention("t", "attend"),
        helper.make_node("Add", ["t", "attend"], ["residual"], name="residual"),
        *_attention("residual", "attend2"),
        helper.make_node("Add", ["residual", "attend2"], ["residual2"], name="residual2"),
        helper.make_node("Reshape", ["residual2", "gather"], ["g"], name="gather"),
        helper.make_node("Transpose", ["g"], ["f"], name="fold", perm=[0, 3, 2, 1]),
        helper.make_node("Reshape", ["f", "rows"], ["u"], name="unrows"),
        helper.make_node("Transpose", ["u"], ["v"], name="unswap", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["v", "patches"], ["i"], name="image"),
        helper.make_node("Conv", ["i", "w2"], ["output"], name="out"),
    ]
    return _model(nodes, "patch_tokens", ("input", [1, 8, 4, 4]), ("output", [1, 8, 4, 4]),
                  inits, opset=17, ir=8)


def normalized(shape: list[int], axis: int) -> onnx.ModelProto:
    """``F.normalize(x, dim=axis)`` as the exporters write it, after a Mul so that the input is
    no bare model input::

        input -> Mul scaled (x 2) -> ReduceL2 norm (axis, keepdims) -> Clip floor (eps)
          -> Expand spread -> Div output (scaled / spread)
    """
    inits = [numpy_helper.from_array(np.array(2, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-12, np.float32), "eps"),
             numpy_helper.from_array(np.array(shape, np.int64), "shape")]
    nodes = [helper.make_node("Mul", ["input", "two"], ["x"], name="scaled"),
             helper.make_node("ReduceL2", ["x"], ["n"], name="norm", axes=[axis], keepdims=1),
             helper.make_node("Clip", ["n", "eps"], ["c"], name="floor"),
             helper.make_node("Expand", ["c", "shape"], ["e"], name="spread"),
             helper.make_node("Div", ["x", "e"], ["output"], name="output")]
    return _model(nodes, "normalized", ("input", shape), ("output", shape), inits, opset=17,
                  ir=8)
