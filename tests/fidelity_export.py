"""Export a torchvision, timm or Ultralytics model to ONNX, as a user would: seeded random
weights, eval mode, one image of the model's own input size (224x224 for torchvision's
classifiers, timm's ``pretrained_cfg``, 320x320 for the detectors and segmenters).

Run by tests/test_fidelity.py in a Python that has torch, torchvision, timm and ultralytics (the
test's own, or the one ``AUTODICE_TORCH_PYTHON`` names), in a process of its own: the exporters
are heavy and the test process stays free of torch.

    python tests/fidelity_export.py convnext_tiny dynamo out.onnx
    python tests/fidelity_export.py mobilevit_xs torchscript out.onnx   # a timm model
    python tests/fidelity_export.py yolo11n dynamo out.onnx             # an Ultralytics YOLO
    python tests/fidelity_export.py yolo11n torchscript out.onnx 640    # ... at 640x640
    python tests/fidelity_export.py --versions   # torch, torchvision, onnx, timm, ultralytics

``dynamo`` is ``torch.onnx.export(..., dynamo=True)`` at opset 18 (weights in ``out.onnx.data``
beside it when large), ``torchscript`` the legacy exporter (``dynamo=False``) at opset 17.
"""

from __future__ import annotations

import os
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
# Detectors and segmenters, as people point them at video (issue 52): Ultralytics' YOLO built
# from its yaml (random weights, nothing downloaded) and made ready as Ultralytics' own ONNX
# export makes it, and torchvision's segmentation nets. "yolo26n-nms-free" is YOLO26 exported
# with its NMS-free head (Ultralytics' ``nms=False``), which ends in TopK and GatherElements.
DETECTORS = ("yolov8n", "yolo11n", "yolo26n", "yolov8n-seg", "yolo26n-seg")
NMS_FREE = "yolo26n-nms-free"
SEGMENTERS = ("lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large")
SIDE = 320  # the detectors' and segmenters' input: 320x320
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


def build(name: str, seed: int = 0, side: int = SIDE):
    """The model ``name`` with seeded random weights and batch-norm statistics (not the trivial
    mean 0 / variance 1 of a fresh model, so folding them is tested too), ready to export."""
    import torch

    torchvision = import_torchvision()
    torch.manual_seed(seed)
    if name in TIMM_MODELS:
        import timm

        model = timm.create_model(name, pretrained=False)
    elif name in (*DETECTORS, NMS_FREE):
        from ultralytics.nn.tasks import DetectionModel, SegmentationModel

        task = SegmentationModel if name.endswith("-seg") else DetectionModel
        model = task(f"{name.removesuffix('-nms-free')}.yaml", verbose=False)
    elif name in SEGMENTERS:
        model = torchvision.models.get_model(name, weights=None, weights_backbone=None)
    else:
        extra = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
        model = torchvision.models.get_model(name, weights=None, **extra)
    randomize_batch_norms(model, torch.Generator().manual_seed(seed + 1))
    if name in (*DETECTORS, NMS_FREE):
        return as_ultralytics_exports(model, side, nms_free=name == NMS_FREE)
    if name in SEGMENTERS:
        return main_output(model).eval()
    return model.eval()


def randomize_batch_norms(model, gen) -> None:
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            n = m.num_features
            m.running_mean.copy_(0.1 * torch.randn(n, generator=gen))
            m.running_var.copy_(0.5 + torch.rand(n, generator=gen))
            m.weight.data.copy_(0.75 + 0.5 * torch.rand(n, generator=gen))
            m.bias.data.copy_(0.1 * torch.randn(n, generator=gen))


def as_ultralytics_exports(model, side: int, nms_free: bool = False):
    """``model`` as ``YOLO(...).export(format="onnx")`` leaves it before it calls the exporter:
    batch norms folded, the head in export mode over a fixed shape (boxes as centre and size,
    NMS left to the user; with ``nms=False``, YOLO26's NMS-free head: its top 300 boxes as
    corners, score and class), C2f's split as a Split."""
    from ultralytics.nn.modules import C2f, Detect

    for p in model.parameters():
        p.requires_grad = False
    model = model.eval().float()
    model.end2end = nms_free  # only YOLO26's head has one
    model = model.fuse(verbose=False, imgsz=side)
    for m in model.modules():
        if isinstance(m, Detect):
            m.dynamic, m.export, m.format = False, True, "onnx"
            m.max_det = min(300, sum((side // int(s)) ** 2 for s in model.stride.tolist()))
            m.agnostic_nms, m.xyxy, m.shape = False, False, None
        elif isinstance(m, C2f):
            m.forward = m.forward_split
    return model


def main_output(model):
    """torchvision's segmenters return ``{"out": ...}``; users export the tensor."""
    import torch

    class Out(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x)["out"]

    return Out()


def export(name: str, exporter: str, path: str, seed: int = 0, side: int = SIDE) -> None:
    import torch

    model = build(name, seed, side)
    if name in TIMM_MODELS:
        size, inputs, outputs = model.pretrained_cfg["input_size"], ["input"], ["logits"]
    elif name in (*DETECTORS, NMS_FREE):
        size, inputs = (3, side, side), ["images"]
        outputs = ["output0", "output1"] if name.endswith("-seg") else ["output0"]
    elif name in SEGMENTERS:
        size, inputs, outputs = (3, side, side), ["input"], ["out"]
    else:
        size, inputs, outputs = (3, 224, 224), ["input"], ["logits"]
    draw = torch.rand if name in (*DETECTORS, NMS_FREE) else torch.randn  # YOLO: pixels/255
    x = draw(1, *size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        torch.onnx.export(model, (x,), path, dynamo=exporter == "dynamo",
                          opset_version=OPSETS[exporter], input_names=inputs,
                          output_names=outputs)


if __name__ == "__main__":
    os.environ.setdefault("YOLO_OFFLINE", "1")  # Ultralytics would probe the network on import
    if sys.argv[1:] == ["--versions"]:
        import onnx
        import torch

        vision = import_torchvision()  # before timm, which imports torchvision
        import timm
        import ultralytics

        print(torch.__version__, vision.__version__, onnx.__version__, timm.__version__,
              ultralytics.__version__)
    else:
        name, exporter, path, *side = sys.argv[1:]
        export(name, exporter, path, side=int(side[0]) if side else SIDE)
