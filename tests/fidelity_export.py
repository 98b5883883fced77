"""Export a torchvision or timm model to ONNX, as a user would: seeded random weights, eval mode,
one image of the model's own input size (224x224 for torchvision, timm's ``pretrained_cfg``).

Run by tests/test_fidelity.py in a Python that has torch and torchvision (the test's own, or the
one ``AUTODICE_TORCH_PYTHON`` names), in a process of its own: the exporters are heavy and the
test process stays free of torch.

    python tests/fidelity_export.py convnext_tiny dynamo out.onnx
    python tests/fidelity_export.py mobilevit_xs torchscript out.onnx   # a timm model
    python tests/fidelity_export.py --versions      # torch, torchvision, onnx and timm versions

``dynamo`` is ``torch.onnx.export(..., dynamo=True)`` at opset 18 (weights in ``out.onnx.data``
beside it when large), ``torchscript`` the legacy exporter (``dynamo=False``) at opset 17.
"""

from __future__ import annotations

import sys

MODELS = ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "regnet_x_400mf",
          "shufflenet_v2_x1_0", "googlenet", "densenet121", "convnext_tiny", "swin_t", "maxvit_t",
          "efficientnet_v2_s", "regnet_y_400mf", "resnext50_32x4d")
# timm's edge backbones, built offline (pretrained=False): mobile CNNs, hybrids whose attention
# works on unfolded patches or flattened tokens, pure ViTs, and re-parameterizable nets (exported
# as trained, unfused). MobileViT and LeViT are the two issue 53 found pnnx mis-converting.
TIMM_MODELS = ("mobilevit_xs", "levit_128s", "mobilevitv2_050", "efficientvit_b0", "fastvit_t8",
               "edgenext_xx_small", "efficientformerv2_s0", "deit_tiny_patch16_224",
               "mobilenetv4_conv_small", "ghostnetv2_100", "repvgg_a0", "mobileone_s0",
               "repghostnet_050", "lcnet_050", "convnextv2_atto")
OPSETS = {"dynamo": 18, "torchscript": 17}


def import_torchvision():
    """torchvision, even where its compiled ops cannot load: PyPI's torchvision wheel is built
    against the CUDA torch of its release, and beside the CPU build of that torch (what
    ``/opt/wheels`` holds of the previous minor) its ops library fails to load and the import
    fails registering them. The classification models need none of those ops."""
    import importlib.util
    import types
    from pathlib import Path

    import torch

    ops = Path(importlib.util.find_spec("torchvision").origin).parent / "_C.so"
    try:
        torch.ops.load_library(str(ops))
    except (OSError, RuntimeError):
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("no registrations")
    import torchvision

    return torchvision


def build(name: str, seed: int = 0):
    """The torchvision or timm model ``name`` with seeded random weights and batch-norm
    statistics (not the trivial mean 0 / variance 1 of a fresh model, so folding them is tested
    too)."""
    import torch

    torchvision = import_torchvision()
    torch.manual_seed(seed)
    if name in TIMM_MODELS:
        import timm

        model = timm.create_model(name, pretrained=False)
    else:
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
    size = model.pretrained_cfg["input_size"] if name in TIMM_MODELS else (3, 224, 224)
    x = torch.randn(1, *size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        torch.onnx.export(model, (x,), path, dynamo=exporter == "dynamo",
                          opset_version=OPSETS[exporter], input_names=["input"],
                          output_names=["logits"])


if __name__ == "__main__":
    if sys.argv[1:] == ["--versions"]:
        import onnx
        import torch

        vision = import_torchvision()  # before timm, which imports torchvision
        import timm

        print(torch.__version__, vision.__version__, onnx.__version__, timm.__version__)
    else:
        export(*sys.argv[1:4])
