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
