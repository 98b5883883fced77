"""The output directory: how autodice writes one, and how its files are named.

Every command that writes an output (``split``, ``gen``, ``dse``) stages it in a temporary
sibling and renames it into place, so a failed run never leaves a half-written directory. The
naming contract for files that carry a tensor (``run``'s inputs and outputs) lives here too,
because ``gen``, ``run`` and ``deploy`` must agree on it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import AutodiceError
from .names import unique_slugs
from .plan import Plan


@contextlib.contextmanager
def staged(out: Path, owned: bool = False) -> Iterator[Path]:
    """A temporary directory that replaces ``out`` when the block succeeds.

    Unless the caller ``owned`` it (a folder inside an autodice output), refuses to replace a
    non-empty directory that is not an earlier autodice output, so a typo in ``-o`` cannot delete
    someone's files.
    """
    if out.exists() and not owned and (not out.is_dir() or (
            any(out.iterdir()) and not (out / "plan.json").exists())):
        raise AutodiceError(f"{out}: exists and is not an autodice output directory; "
                            f"choose another -o or remove it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result should not be
    try:
        yield tmp
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            out.rename(old / out.name)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def tensor_files(plan: Plan) -> dict[str, str]:
    """Model input and output name -> the .npy file that carries it (``run``'s inputs and
    results): ``gpu_0/softmax_1`` -> ``gpu_0_softmax_1.npy``. Names that would share a file
    (``a/b`` and ``a_b``) get ``-2``, ``-3``... in plan order, so every name has its own."""
    names = [t.name for t in (*plan.model_inputs, *plan.model_outputs)]
    return unique_slugs(list(dict.fromkeys(names)), ".npy")
