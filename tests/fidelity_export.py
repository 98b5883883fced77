"""Export a torchvision CNN to ONNX, as a user would: seeded random weights, eval mode, 1x3x224x224.

Run by tests/test_fidelity.py in a Python that has torch and torchvision (the test's own, or the
one ``AUTODICE_TORCH_PYTHON`` names), in a process of its own: the exporters are heavy and the
test process stays free of torch.

    python tests/fidelity_export.py convnext_tiny dynamo out.onnx

``dynamo`` is ``torch.onnx.export(..., dynamo=True)`` at opset 18 (weights in ``out.onnx.data``
beside it when large), ``torchscript`` the legacy exporter (``dynamo=False``) at opset 17.
"""

from __future__ import annotations

import sys

MODELS = ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "regnet_x_400mf",
          "shufflenet_v2_x1_0", "googlenet", "densenet121", "convnext_tiny")
OPSETS = {"dynamo": 18, "torchscript": 17}


def build(name: str, seed: int = 0):
    """The torchvision model ``name`` with seeded random weights and batch-norm statistics (not
    the trivial mean 0 / variance 1 of a fresh model, so folding them is tested too)."""
    import torch
    import torchvision

    torch.manual_seed(seed)
    extra = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    model = torchvision.models.get_model(name, weights=None, **extra)
    gen = torch.Generator().manual_seed(seed + 1)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            n = m.num_features
            m.running_mean.copy_(0.1 * torch.randn(n, generator=gen))
            m.running_var.copy_(0.5 + torch.rand(n, generator=gen))
            m.weight.data.copy_(0.75 + 0.5 * torch.rand(n, generator=gen))
            m.bias.data.copy_(0.1 * torch.randn(n, generator=gen))
    return model.eval()


def export(name: str, exporter: str, path: str, seed: int = 0) -> None:
    import torch

    model = build(name, seed)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        torch.onnx.export(model, (x,), path, dynamo=exporter == "dynamo",
                          opset_version=OPSETS[exporter], input_names=["input"],
                          output_names=["logits"])


if __name__ == "__main__":
    export(*sys.argv[1:4])
