"""A frame into the session's shared slot, checked for NaN and infinity in the same pass.

The copy is ``runtime_cpp/frame_copy.c`` (why a C pass and not numpy's: its header), compiled
once per machine, compiler and source into autodice's cache and called through ctypes, which lets
go of the GIL as numpy's copy does. Where no C compiler runs (or it fails) the session copies with
numpy as before: the same bytes and the same check, only slower; :func:`prepare` says why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import numpy as np

from ..engine import cache_root

SOURCE = "frame_copy.c"


def copy_frame(dst: np.ndarray, part: memoryview, float32: bool) -> bool:
    """Copy ``part`` into ``dst`` (a uint8 slot view of the same size); with ``float32``, also
    whether every value is finite (the bytes are copied all the same)."""
    src = np.frombuffer(part, np.uint8)
    copy, _ = _helper()
    if copy is not None:
        return bool(copy(dst.ctypes.data, src.ctypes.data, src.nbytes, float32))
    ok = not float32 or bool(np.isfinite(src.view(np.float32)).all())
    np.copyto(dst, src)
    return ok


def prepare() -> str | None:
    """Build or load the helper now (at a session's start, not in its first frame's time); why
    frames are copied by numpy here (no compiler, or its error), or None."""
    return _helper()[1]


@functools.cache
def _helper() -> tuple[Callable | None, str | None]:
    """The helper's function, or None and why not."""
    try:
        fn = ctypes.CDLL(str(_build())).autodice_copy_frame
    except Exception as e:  # noqa: BLE001 - no cache folder, no compiler...: numpy copies
        return None, f"{type(e).__name__}: {e}"
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn, None


def _build() -> Path:
    """The helper's shared library, built if this machine has none for this source and compiler
    (it appears by rename: a concurrent or interrupted build never leaves half of one)."""
    source = resources.files("autodice.runtime_cpp").joinpath(SOURCE).read_bytes()
    cc = shlex.split(os.environ.get("CC") or "cc")
    if not cc or shutil.which(cc[0]) is None:
        raise OSError(f"no C compiler ({' '.join(cc)}) to build {SOURCE}")
    key = hashlib.sha256(b"\0".join([source, " ".join(cc).encode(), platform.machine().encode()]))
    lib = cache_root() / "frame_copy" / f"{key.hexdigest()[:16]}.so"
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib.parent, prefix=".tmp-") as tmp:
        (Path(tmp) / SOURCE).write_bytes(source)
        out = Path(tmp) / lib.name
        proc = subprocess.run([*cc, "-O3", "-shared", "-fPIC", "-o", str(out), SOURCE], cwd=tmp,
                              capture_output=True, text=True, errors="replace", timeout=120,
                              check=False)
        if proc.returncode != 0:
            raise OSError(f"{' '.join(cc)} failed on {SOURCE}: "
                          + " ".join(proc.stderr.split())[:300])
        os.replace(out, lib)
    return lib
