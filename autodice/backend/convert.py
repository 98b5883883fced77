"""ONNX sub-models -> ncnn ``.param``/``.bin`` with the ``pnnx`` binary.

pnnx renames graph inputs to ``in0, in1...`` and outputs to ``out0, out1...`` in graph order; the
plan keeps each sub-model's input/output order, so the generated program addresses blobs by
position. Conversions are cached by content hash (model bytes + options + pnnx version) under
``~/.cache/autodice/pnnx`` and run two at a time; each net's edges then take the runtime's Mat
form (:mod:`.net_edges`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnx

from ..core.errors import AutodiceError
from ..core.plan import Plan, Rank
from .engine import cache_root
from .net_edges import batch_axes, keep_inputs, passed_on, plain_edges
from .verify import missing_rewrites, model_ops

PNNX_VERSION = "20261020"
# Part of the cache key: bumped when the way pnnx is called changes what it writes (2: external
# weights read from the sub-model's own data file; before, pnnx read zeros and garbage; 3: its
# .ncnn.py kept, which names each edge's batch axis).
RECIPE = 3


def pnnx_binary() -> Path:
    """The static pnnx binary inside the ``pnnx`` wheel (its console script imports torch)."""
    spec = importlib.util.find_spec("pnnx")
    if spec is None or not spec.submodule_search_locations:
        raise AutodiceError(f"pnnx is not installed: pip install --no-deps pnnx=={PNNX_VERSION}")
    binary = Path(list(spec.submodule_search_locations)[0]) / "pnnx"
    if not binary.exists():
        raise AutodiceError(f"{binary}: the pnnx wheel has no binary for this platform")
    return binary


def _digest(path: Path, fp16: bool) -> str:
    h = hashlib.sha256(f"pnnx {PNNX_VERSION} recipe {RECIPE} fp16={int(fp16)}\n".encode())
    for p in (path, Path(str(path) + ".data")):
        if p.exists():
            with open(p, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
    return h.hexdigest()[:24]


def convert(onnx_path: Path, dest: Path, rank: Rank, fp16: bool = False) -> None:
    """Write ``dest.param`` and ``dest.bin`` for the sub-model at ``onnx_path``.

    Raises:
        AutodiceError: pnnx failed or produced a net whose inputs/outputs do not match the plan;
            the message names the rank, its key and its layers.
    """
    entry = cache_root() / "pnnx" / _digest(onnx_path, fp16)
    if not (entry / "model.ncnn.param").exists():
        with tempfile.TemporaryDirectory(prefix="pnnx-") as tmp:
            work = Path(tmp)
            os.symlink(onnx_path.resolve(), work / onnx_path.name)
            proc = _pnnx(onnx_path, work, fp16)
            if proc.returncode != 0 or not (work / "out.ncnn.param").exists():
                tail = " | ".join(pnnx_said(proc.stdout + proc.stderr))
                more = "..." if len(rank.layers) > 6 else ""
                model = onnx.load(str(onnx_path), load_external_data=False)
                why, ops = missing_rewrites(model), model_ops(model)
                raise AutodiceError(f'rank {rank.rank} (key "{rank.key}", layers '
                                    f'{", ".join(rank.layers[:6])}{more}; ONNX ops '
                                    f'{", ".join(ops[:8])}): pnnx could not convert '
                                    f"{onnx_path.name}" + (f" ({why})" if why else "")
                                    + f": {tail}")
            axes = _batch_axes(onnx_path, work, fp16)
            (work / "out.axes.json").write_text(json.dumps(axes))
            staging = Path(tempfile.mkdtemp(dir=_ensure(entry.parent)))
            try:
                for part in ("ncnn.param", "ncnn.bin", "axes.json"):
                    shutil.move(work / f"out.{part}", staging / f"model.{part}")
                    (staging / f"model.{part}").chmod(0o444)  # shared: nobody writes it
                try:
                    staging.rename(entry)
                except OSError:  # another process cached it first
                    pass
            finally:  # renamed, or half moved when Ctrl-C came: nothing left in the cache
                shutil.rmtree(staging, ignore_errors=True)
    param = keep_inputs((entry / "model.ncnn.param").read_text())
    _check_interface(param, rank)
    in_axes, out_axes = json.loads((entry / "model.axes.json").read_text())
    param = plain_edges(param, [t.shape for t in rank.submodel_inputs], in_axes,
                        [t.shape for t in rank.submodel_outputs], out_axes)
    # Copies, not hard links: a link would let anything that edits the output (a user, a test
    # corrupting a model on purpose) poison the cache for every later conversion.
    for suffix in ("param", "bin"):
        Path(f"{dest}.{suffix}").unlink(missing_ok=True)
    Path(f"{dest}.param").write_text(param)
    shutil.copyfile(entry / "model.ncnn.bin", f"{dest}.bin")


def _pnnx(onnx_path: Path, work: Path, fp16: bool) -> subprocess.CompletedProcess:
    """pnnx on the model named as ``onnx_path`` in ``work`` (put there by the caller), writing
    ``work/out.*``."""
    # pnnx reads external weights from "<model path>.data" whatever the tensors' location
    # says, and its onnxruntime from that location: both names must agree, so the model keeps
    # its own name (sub-models' data is "<key>.onnx.data").
    data = Path(str(onnx_path) + ".data")
    if data.exists():
        _place(data, work / data.name)
    # Every output named here: pnnx derives its own names from the model's, with characters a
    # key may hold (edge01_arm0-3) changed, so those files would not be found.
    outputs = {f"{kind}{part}": f"out.{kind}.{part}" for kind in ("pnnx", "ncnn")
               for part in ("param", "bin", "py")} | {"pnnxonnx": "out.pnnx.onnx"}
    return subprocess.run([str(pnnx_binary()), onnx_path.name, f"fp16={int(fp16)}",
                           *(f"{k}={v}" for k, v in outputs.items())],
                          cwd=work, capture_output=True, text=True)


def _batch_axes(onnx_path: Path, work: Path, fp16: bool) -> tuple[list, list]:
    """The batch axis of each input and output of pnnx's net in ``work`` (``net_edges``), None
    where pnnx names none.

    pnnx's ``.ncnn.py`` lists the inputs only up to the first one it passes straight on as an
    output (``Input in3 0 1 out2``: no operand is named in3). Where more come after, pnnx runs
    again on the model with those inputs last, for the axes of the rest. The ones passed on,
    and the outputs they become, need none: nothing in the net reads them."""
    param = (work / "out.ncnn.param").read_text()
    in_axes, out_axes = batch_axes((work / "out.ncnn.py").read_text())
    model = onnx.load(str(onnx_path), load_external_data=False)
    passed = passed_on(param)
    if any(k not in in_axes and k not in passed for k in range(len(model.graph.input))):
        order = [k for k in range(len(model.graph.input)) if k not in passed] + sorted(passed)
        inputs = [model.graph.input[k] for k in order]
        del model.graph.input[:]
        model.graph.input.extend(inputs)
        again = work / "inputs-reordered"
        again.mkdir()
        onnx.save(model, str(again / onnx_path.name))
        proc = _pnnx(onnx_path, again, fp16)
        if proc.returncode == 0:
            in_axes = {order[j]: axis for j, axis
                       in batch_axes((again / "out.ncnn.py").read_text())[0].items()}
    return ([in_axes.get(k) for k in range(len(model.graph.input))],
            [None if k in passed.values() else out_axes.get(k)
             for k in range(len(model.graph.output))])


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def pnnx_said(output: str, lines: int = 3) -> list[str]:
    """What pnnx said last that explains a failure: its text without terminal colours,
    onnxruntime's warnings, or the tables pnnx draws (box-drawing lines)."""
    said = []
    for line in _ANSI.sub("", output).splitlines():
        line = line.strip()
        if not line or "[W:onnxruntime" in line or line[0] in "┌│├└─┏┃┡┗━╭╰":
            continue
        said.append(line[:300])
    return said[-lines:]


def _place(src: Path, dest: Path) -> None:
    """``src`` at ``dest`` as a real file (a hard link, else a copy), never a symlink: pnnx's
    onnxruntime resolves a symlinked external-data file to its target and refuses it as a path
    that escapes the model's directory (every dynamo export keeps its weights external)."""
    try:
        os.link(src, dest)
    except OSError:  # another file system
        shutil.copyfile(src, dest)


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _check_interface(param: str, rank: Rank) -> None:
    """pnnx must expose in0..inN and out0..outM exactly as the plan's sub-model interface."""
    blobs = set()
    for line in param.splitlines()[2:]:
        parts = line.split()
        if len(parts) >= 4:
            n_in, n_out = int(parts[2]), int(parts[3])
            blobs.update(parts[4:4 + n_in + n_out])
    want = {f"in{k}" for k in range(len(rank.submodel_inputs))} | \
           {f"out{k}" for k in range(len(rank.submodel_outputs))}
    missing = sorted(want - blobs)
    if missing:
        raise AutodiceError(f'rank {rank.rank} (key "{rank.key}"): the converted ncnn net lacks '
                            f"blobs {', '.join(missing)}; pnnx dropped part of the sub-model")


def convert_all(plan: Plan, out_dir: Path, dest_dir: Path, fp16_ranks: Collection[int] = (),
                progress=None) -> None:
    """Convert every rank's sub-model into ``dest_dir/<key>.ncnn.{param,bin}`` (the weights of
    ``fp16_ranks`` in fp16)."""
    dest_dir.mkdir(parents=True, exist_ok=True)

    def one(rank: Rank) -> None:
        convert(out_dir / rank.submodel, dest_dir / f"{rank.key}.ncnn", rank,
                rank.rank in fp16_ranks)
        if progress:
            progress(rank)

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(one, plan.ranks))
