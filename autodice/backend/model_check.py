"""``autodice layers MODEL --check``: will ncnn run this model? Said before any mapping is written.

The whole model is one key: split (legalized as every key is), converted by pnnx, loaded and run
by ncnn against onnxruntime on one seeded random frame (or ``--verify-with``'s), as ``gen``
checks each key. Where that fails, its layers are cut into up to ``PIECES`` keys in a row, and
every key is checked on onnxruntime's own values at its inputs: a key fails only if its own
layers do. The first failing key is cut again, with the layers before and after it as one key
each, until it holds one layer: the first layer ncnn cannot load or computes wrong.

The answer is cached by the model's bytes, the input shapes, the frame, the ncnn build and
the code that spells the sub-models (front end and core; ``~/.cache/autodice/model-checks/``): asked
again, it is a file read; a new legalization rule asks afresh.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core.errors import AutodiceError
from ..core.mapping import mapping_json
from ..core.model import load_model
from ..core.outdir import write_atomic
from ..frontend.check import chain_values
from ..frontend.split import split
from .convert import PNNX_VERSION, RECIPE, convert_all
from .engine import cache_key, cache_root, ncnn_flags
from .gen import verify_feeds
from .verify import verify_ranks

PIECES = 8  # keys a failing range is cut into: 900 layers take four rounds
HOST = "here"


@dataclass(frozen=True)
class ModelCheck:
    layers: int
    worst: float | None  # every layer ran: the largest error of an output, of its scale
    layer: str | None  # the first layer that fails, where narrowed to one
    problem: str | None  # what the check said of it
    cached: bool = False

    @property
    def runs(self) -> bool:
        return self.problem is None


def _key(k: int) -> str:
    return f"{HOST}_cpu{k}"


def _said(problem: str) -> str:
    """A key's problem as gen words it, of the model instead: no rank, key or sub-model of the
    check's own (they name nothing the user has)."""
    problem = problem.split(": ", 1)[-1]
    problem = re.sub(rf"models/{HOST}_cpu\d+\.onnx", "the model", problem)
    return re.sub(rf"{HOST}_cpu\d+\.ncnn\.param", "its conversion", problem)


def _check(model: Path, shapes, names: list[str], pieces: list[list[str]], work: Path,
           feeds, on_noise: bool = False, console=None) -> list[tuple[list[str], list[str], float]]:
    """Each piece of ``names`` (the rest of the layers as a key before and one after) checked
    as gen checks keys; returns the pieces' (layers, problems, largest error)."""
    first = names.index(pieces[0][0])
    last = names.index(pieces[-1][-1]) + 1
    keys = ([names[:first]] if first else []) + pieces + ([names[last:]] if last < len(names)
                                                        else [])
    work.mkdir()
    (work / "mapping.json").write_text(mapping_json({_key(k): ls for k, ls in enumerate(keys)}))
    (work / "platform.txt").write_text(f"{HOST}, cpu, slots=0-{len(keys) - 1}\n")
    out = work / "out"
    plan = split(model, work / "mapping.json", work / "platform.txt", out, shapes)
    convert_all(plan, out, out / "ncnn")
    values = chain_values(plan, out, feeds(plan))
    found = verify_ranks(plan, out, out / "ncnn", values, console=console, on_noise=on_noise)
    offset = 1 if first else 0
    return [(piece, *found[offset + k]) for k, piece in enumerate(pieces)]


def _spelling_digest() -> str:
    """A digest of the sources that decide what pnnx is given: the front end's rewrites and
    the core's shapes, which say where a model can be cut."""
    digest = hashlib.sha256()
    root = Path(__file__).parents[1]
    for source in sorted([*(root / "frontend").rglob("*.py"), *(root / "core").rglob("*.py")]):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def check_model(model: str | Path, input_shapes=None, verify_with: str | Path | None = None,
                preprocess: str | None = None, console=None) -> ModelCheck:
    """Whether ncnn runs ``model`` as onnxruntime does (see the module docstring).

    Raises:
        AutodiceError: a model that cannot be read or split (its shapes not static: the
            --input-shape to give), or a frame that cannot be used.
    """
    model = Path(model)
    shapes = dict(input_shapes or {})
    digest = hashlib.sha256(model.read_bytes())
    digest.update(json.dumps({"shapes": {k: list(v) for k, v in sorted(shapes.items())},
                              "ncnn": cache_key(ncnn_flags(vulkan=True)), "pnnx": PNNX_VERSION,
                              "recipe": RECIPE, "preprocess": preprocess,
                              "spelling": _spelling_digest(),
                              "frame": hashlib.sha256(Path(verify_with).read_bytes()).hexdigest()
                              if verify_with and Path(verify_with).is_file() else
                              str(verify_with)}).encode())
    cached = cache_root() / "model-checks" / f"{digest.hexdigest()[:32]}.json"
    if cached.is_file():
        return ModelCheck(**{**json.loads(cached.read_text()), "cached": True})
    graph = load_model(model, shapes)
    names = [graph.names[i] for i in range(len(graph.nodes)) if i not in graph.followers]

    def feeds(plan):
        return verify_feeds(plan, verify_with, preprocess)

    with tempfile.TemporaryDirectory(prefix="autodice-model-check-") as tmp:
        [(_, said, worst)] = _check(model, shapes, names, [names], Path(tmp) / "whole", feeds,
                                    on_noise=verify_with is None, console=console)
        result = (_narrow(model, shapes, names, said, Path(tmp), feeds) if said
                  else ModelCheck(len(names), worst, None, None))
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(cached, json.dumps({k: v for k, v in asdict(result).items() if k != "cached"},
                                    indent=1).encode())
    return result


def _narrow(model: Path, shapes, names: list[str], said: list[str], tmp: Path,
            feeds) -> ModelCheck:
    """Cut the failing layers down to the first one that fails alone (or as far as cuts go)."""
    lo, hi, problem, rounds = 0, len(names), _said(said[0]), 0
    while hi - lo > 1:
        rounds += 1
        span = names[lo:hi]
        step = -(-len(span) // PIECES)
        pieces = [span[k:k + step] for k in range(0, len(span), step)]
        try:
            found = _check(model, shapes, names, pieces, tmp / f"round{rounds}", feeds)
        except AutodiceError as e:  # a cut split cannot make (an int64 tensor across keys...)
            problem += f" (narrowed to {len(span)} layers from {span[0]}: {e.args[0]})"
            break
        failing = next(((piece, p) for piece, p, _ in found if p), None)
        if failing is None:  # each part passes alone: what fails lies across the cuts
            problem += f" (each part of the {len(span)} layers from {span[0]} passes alone)"
            break
        lo = names.index(failing[0][0])
        hi = names.index(failing[0][-1]) + 1
        problem = _said(failing[1][0])
    layer = names[lo] if hi - lo == 1 else None
    return ModelCheck(len(names), None, layer, problem)
