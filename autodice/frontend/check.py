"""``autodice check``: do the sub-models, chained as the plan says, compute the whole model?

Runs every rank's sub-model in onnxruntime in one process, following the plan's steps exactly as
the distributed program will (so a wrong step order or a missing edge shows up here, too), on
seeded random inputs, and compares each model output with onnxruntime on the whole model.

The error measure is scale-aware: ``rel = max|a - b| / max|b|``. Element-wise relative error is
meaningless next to zeros, and random-weight zoo models produce outputs of any magnitude.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import AutodiceError
from ..core.plan import Plan, load_plan

# What "equal to onnxruntime" means, everywhere it is checked (split --check, check, gen's
# check of each conversion, run --check): max|diff| / max|reference| per output. fp32 on both
# sides agrees to ~1e-6; a rank in fp16 (GPU ranks by default, gen --precision fp16) to ~1e-3
# (measured on lavapipe: SqueezeNet's logits 6e-4, a mid-network cut 3e-3).
RTOL = 1e-4
RTOL_FP16 = 1e-2
# int8 keys and int8 cut tensors: PP-OCR's detector in int8 moved its map by ~1e-2 of its scale
# (tests/test_trained_ocr.py); a wrong scale moves it by its whole scale.
RTOL_INT8 = 1e-1


@dataclass(frozen=True)
class OutputDiff:
    name: str
    max_abs: float
    rel: float


def session(path: Path, also: Sequence[str] = ()):
    """An onnxruntime CPU session of the model at ``path``; ``also``: inner tensors it returns
    too (a session returns only graph outputs, so they become outputs of a copy).

    A model stamped with an IR version this onnxruntime does not read yet (onnx 1.23's
    make_model writes IR 14) is loaded with the lowest IR its opsets allow instead: the IR
    version is a file-format stamp, not the model's meaning.

    Raises:
        AutodiceError: onnxruntime cannot load it (its first line of complaint).
    """
    import onnx

    model = None
    if also:
        model = onnx.load(str(path), load_external_data=False)
        have = {o.name for o in model.graph.output}
        model.graph.output.extend(onnx.ValueInfoProto(name=t) for t in also if t not in have)
    try:
        return _open(path, model)
    except Exception as e:  # onnxruntime raises its own exception types
        said = str(e).splitlines()[0]
        if "IR version" in said:
            from .legalize import ir_version

            model = model or onnx.load(str(path), load_external_data=False)
            model.ir_version = ir_version(model)
            try:
                return _open(path, model)
            except Exception:
                pass
        raise AutodiceError(f"{path}: onnxruntime cannot load it: {said}") from None


def _open(path: Path, model=None):
    """A CPU session of the file at ``path``, or of ``model``, an edited copy of it. A copy of a
    model whose weights lie in a file beside it (past protobuf's 2 GB) is saved beside them for
    as long as onnxruntime loads it."""
    import tempfile

    import onnx
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    cpu = ["CPUExecutionProvider"]
    if model is None:
        return ort.InferenceSession(str(path), opts, providers=cpu)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".copy-", suffix=".onnx") as f:
            onnx.save(model, f.name)
            return ort.InferenceSession(f.name, opts, providers=cpu)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=cpu)


def every_value(path: Path, feeds: dict[str, np.ndarray],
                tensors: Sequence[str]) -> dict[str, np.ndarray]:
    """What onnxruntime computes for ``tensors`` of the model at ``path``, inner tensors
    included, fed ``feeds``."""
    return dict(zip(tensors, session(path, tensors).run(list(tensors), feeds)))


def random_inputs(plan: Plan, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs: floats from N(0, 1), integers from 0..9."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for t in plan.model_inputs:
        if np.issubdtype(np.dtype(t.dtype), np.floating):
            feeds[t.name] = rng.standard_normal(t.shape).astype(t.dtype)
        else:
            feeds[t.name] = rng.integers(0, 10, t.shape).astype(t.dtype)
    return feeds


def run_chain(plan: Plan, out_dir: Path, feeds: dict[str, np.ndarray],
              sessions: dict | None = None) -> dict[str, np.ndarray]:
    """The model outputs computed by the sub-models, step by step as the ranks would."""
    values = chain_values(plan, out_dir, feeds, sessions)
    return {t.name: values[t.name].reshape(t.onnx_shape) for t in plan.model_outputs}


def chain_values(plan: Plan, out_dir: Path, feeds: dict[str, np.ndarray],
                 sessions: dict | None = None, arrive=None) -> dict[str, np.ndarray]:
    """Every tensor the sub-models exchange or output (and the model inputs), computed step by
    step as the ranks would; ``arrive(rank, name, value)``, where given, is a tensor as it
    reaches a rank (after a smaller wire format: :meth:`~autodice.backend.wire.Wire.arrival`)."""
    sessions = sessions if sessions is not None else {}
    values = {name: feeds[name] for name in feeds}
    pos = [0] * len(plan.ranks)
    while any(pos[r.rank] < len(r.steps) for r in plan.ranks):
        moved = False
        for r in plan.ranks:
            if pos[r.rank] >= len(r.steps):
                continue
            if r.rank not in sessions:
                sessions[r.rank] = rank_session(out_dir, r)
            sess = sessions[r.rank]
            steps = r.steps
            while pos[r.rank] < len(steps) and all(t in values for t in steps[pos[r.rank]].wait):
                step = steps[pos[r.rank]]
                # Inputs this step does not depend on may not exist yet: zeros stand in for them
                # and cannot change the outputs asked for.
                inputs = {t.name: values[t.name] if t.name in values
                          else np.zeros(t.shape, t.dtype) for t in r.submodel_inputs}
                if arrive is not None:
                    inputs = {name: arrive(r, name, value) for name, value in inputs.items()}
                for name, value in zip(step.extract, sess.run(list(step.extract), inputs)):
                    values[name] = value
                pos[r.rank] += 1
                moved = True
        if not moved:
            raise AutodiceError("internal error: the plan's steps cannot all run")
    return values


def rank_session(out_dir: Path, r) -> object:
    """onnxruntime's session of rank ``r``'s sub-model, checked to be the one plan.json
    describes (its inputs, and the outputs its steps extract): a hand-edited plan must not
    reach onnxruntime's own complaint.

    Raises:
        AutodiceError: the file cannot be loaded, or reads or makes other tensors.
    """
    path = out_dir / r.submodel
    sess = session(path)
    reads = sorted(i.name for i in sess.get_inputs())
    makes = {o.name for o in sess.get_outputs()}
    want_reads = sorted(t.name for t in r.submodel_inputs)
    want_makes = {t for step in r.steps for t in step.extract}
    if reads != want_reads or not want_makes <= makes:
        raise AutodiceError(f"{path}: not rank {r.rank}'s sub-model as plan.json says: it reads "
                            f"{', '.join(reads) or 'nothing'} and makes "
                            f"{', '.join(sorted(makes))}; the plan's reads "
                            f"{', '.join(want_reads) or 'nothing'} and makes "
                            f"{', '.join(sorted(want_makes))}")
    return sess


def compare(got: np.ndarray, want: np.ndarray, name: str = "") -> tuple[float, float]:
    """(max |got - want|, that over max |want|) of one output.

    Raises:
        AutodiceError: the two are not of one shape (one line naming both), rather than
            numpy's broadcast of two shapes that differ.
    """
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise AutodiceError(f'output "{name}": the distributed program gives '
                            f"{'x'.join(map(str, got.shape)) or 'a scalar'}, onnxruntime "
                            f"{'x'.join(map(str, want.shape)) or 'a scalar'}")
    return difference(got, want)


def difference(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(max |got - want|, that over max |want|) of two arrays of one size, where NaN where
    both have NaN, or the same infinity, is no difference (the square root of a negative is
    NaN in ncnn as in onnxruntime), and either alone is an infinite one."""
    got = np.asarray(got, np.float64).ravel()
    want = np.asarray(want, np.float64).ravel()
    if not want.size:
        return 0.0, 0.0
    same = (np.isnan(got) & np.isnan(want)) | ((got == want) & np.isinf(want))
    with np.errstate(invalid="ignore"):
        gap = np.where(same, 0.0, np.abs(got - want))
    diff = float(np.max(np.where(np.isnan(gap), np.inf, gap)))
    finite = np.abs(want[np.isfinite(want)])
    scale = float(finite.max()) if finite.size else 0.0
    return diff, diff / scale if scale > 0 else diff


def compare_with_model(plan: Plan, out_dir: Path, feeds: dict[str, np.ndarray],
                       outputs: dict[str, np.ndarray], model: str | Path | None = None,
                       ) -> list[OutputDiff]:
    """Differences between ``outputs`` and onnxruntime's whole model on ``feeds``."""
    whole = whole_session(plan, out_dir, model)
    names = [t.name for t in plan.model_outputs]
    return [OutputDiff(n, *compare(outputs[n], want, n))
            for n, want in zip(names, whole.run(names, feeds))]


def whole_session(plan: Plan, out_dir: Path, model: str | Path | None):
    """onnxruntime's session of the model that was split, checked to be that model by its
    interface (``--model`` may name another one)."""
    path = Path(model) if model else out_dir / plan.model
    if not path.exists():
        raise AutodiceError(f"{path}: the whole model is not there (moved?); pass --model PATH")
    whole = session(path)
    have = ({i.name for i in whole.get_inputs()}, {o.name for o in whole.get_outputs()})
    want = ({t.name for t in plan.model_inputs}, {t.name for t in plan.model_outputs})
    if have[0] != want[0] or not want[1] <= have[1]:
        raise AutodiceError(f"{path}: not the model that was split: it reads "
                            f"{', '.join(sorted(have[0]))} and makes {', '.join(sorted(have[1]))}"
                            f"; the plan's reads {', '.join(sorted(want[0]))} and makes "
                            f"{', '.join(sorted(want[1]))}")
    return whole


def check(out_dir: str | Path, samples: int = 1, seed: int = 0, model: str | Path | None = None,
          ) -> list[OutputDiff]:
    """Compare the chained sub-models with the whole model on ``samples`` random inputs.

    Returns:
        Per model output, the worst max-abs and relative difference over all samples.
    Raises:
        AutodiceError: fewer than one sample, no plan, or a model onnxruntime cannot load.
    """
    if samples < 1:
        raise AutodiceError(f"--samples {samples}: need at least 1")
    out_dir = Path(out_dir)
    plan = load_plan(out_dir)
    whole = whole_session(plan, out_dir, model)
    names = [t.name for t in plan.model_outputs]
    worst = {n: (0.0, 0.0) for n in names}
    sessions: dict = {}
    for k in range(samples):
        feeds = random_inputs(plan, seed + k)
        want = dict(zip(names, whole.run(names, feeds)))
        got = run_chain(plan, out_dir, feeds, sessions)
        for n in names:
            a, r = compare(got[n], want[n], n)
            worst[n] = (max(worst[n][0], a), max(worst[n][1], r))
    return [OutputDiff(n, *worst[n]) for n in names]
