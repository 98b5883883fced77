"""ONNX sub-models -> ncnn ``.param``/``.bin`` with the ``pnnx`` binary.

pnnx renames graph inputs to ``in0, in1...`` and outputs to ``out0, out1...`` in graph order; the
plan keeps each sub-model's input/output order, so the generated program addresses blobs by
position. Conversions are cached by content hash (model bytes + options + pnnx version) under
``~/.cache/autodice/pnnx`` and run two at a time.
"""

from __future__ import annotations

import hashlib
import importlib.util
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
from .verify import missing_rewrites, model_ops

PNNX_VERSION = "20261020"
# Part of the cache key: bumped when the way pnnx is called changes what it writes (2: external
# weights read from the sub-model's own data file; before, pnnx read zeros and garbage).
RECIPE = 2


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
            # pnnx reads external weights from "<model path>.data" whatever the tensors'
            # location says, and its onnxruntime from that location: both names must agree,
            # so the model keeps its own name (sub-models' data is "<key>.onnx.data").
            os.symlink(onnx_path.resolve(), work / onnx_path.name)
            data = Path(str(onnx_path) + ".data")
            if data.exists():
                _place(data, work / data.name)
            # Every output named here: pnnx derives its own names from the model's, with
            # characters a key may hold (edge01_arm0-3) changed, so those files would not be found.
            outputs = {f"{kind}{part}": f"out.{kind}.{part}" for kind in ("pnnx", "ncnn")
                       for part in ("param", "bin", "py")} | {"pnnxonnx": "out.pnnx.onnx"}
            proc = subprocess.run([str(pnnx_binary()), onnx_path.name, f"fp16={int(fp16)}",
                                   *(f"{k}={v}" for k, v in outputs.items())],
                                  cwd=work, capture_output=True, text=True)
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
            staging = Path(tempfile.mkdtemp(dir=_ensure(entry.parent)))
            try:
                for suffix in ("param", "bin"):
                    shutil.move(work / f"out.ncnn.{suffix}", staging / f"model.ncnn.{suffix}")
                    (staging / f"model.ncnn.{suffix}").chmod(0o444)  # shared: nobody writes it
                try:
                    staging.rename(entry)
                except OSError:  # another process cached it first
                    pass
            finally:  # renamed, or half moved when Ctrl-C came: nothing left in the cache
                shutil.rmtree(staging, ignore_errors=True)
    param = _keep_inputs((entry / "model.ncnn.param").read_text())
    _check_interface(param, rank)
    # Copies, not hard links: a link would let anything that edits the output (a user, a test
    # corrupting a model on purpose) poison the cache for every later conversion.
    for suffix in ("param", "bin"):
        Path(f"{dest}.{suffix}").unlink(missing_ok=True)
    Path(f"{dest}.param").write_text(param)
    shutil.copyfile(entry / "model.ncnn.bin", f"{dest}.bin")


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


def _keep_inputs(param: str) -> str:
    """The ncnn param with every input blob under its own name.

    Where a sub-model sends on what it received with nothing but a no-op between (a reshape
    between two alike Mat forms, a bias of zeros that an exporter shared between layers),
    pnnx folds the no-op away and names the input's blob after the output:
    ``Input in3 0 1 out2``. The runtime feeds in3 and extracts out2, so the input keeps its name
    and a Noop layer hands it on as out2.
    """
    lines = param.splitlines()
    passed = []
    for k, line in enumerate(lines[2:], 2):
        parts = line.split()
        if parts[:1] == ["Input"] and parts[2:4] == ["0", "1"] and parts[4] != parts[1]:
            name, top = parts[1], parts[4]
            lines[k] = " ".join([f"{'Input':<24}", f"{name:<24}", "0 1", name, *parts[5:]])
            passed.append(" ".join([f"{'Noop':<24}", f"{'noop_' + top:<24}", "1 1", name, top]))
    if not passed:
        return param
    layers, blobs = map(int, lines[1].split())
    lines[1] = f"{layers + len(passed)} {blobs + len(passed)}"
    return "\n".join([*lines, *passed]) + "\n"


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
