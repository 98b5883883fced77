"""The output directory: how autodice writes one, and how its files are named.

Every command that writes an output (``split``, ``dse``) stages it in a temporary sibling and
renames it into place, so a failed run never leaves a half-written directory. An output carries
a manifest, ``.autodice-output``: the files autodice wrote there, and the folders later verbs
claimed inside it (``gen``'s ``packages/`` and ``ncnn/``, ``build/``, ``results/``...). A run
replaces a directory only when the manifest covers everything in it, so a typo in ``-o``, a
folder that merely holds a ``plan.json``, or a note a user saved inside an output is never
deleted. The naming contract for files that carry a tensor (``run``'s inputs and outputs)
lives here too, because ``gen``, ``run`` and ``deploy`` must agree on it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from .errors import AutodiceError
from .names import unique_slugs
from .plan import Plan

MARKER = ".autodice-output"
_HEADER = ("# autodice output: the files autodice wrote here and the folders it owns (ending in "
           "/);\n# the next run that writes here replaces exactly these, and refuses to if there "
           "is anything else.\n")


def read_manifest(out: Path) -> tuple[frozenset[str], frozenset[str]] | None:
    """(files, folders) the manifest of ``out`` lists, relative POSIX paths; None when ``out``
    has no manifest or one autodice did not write (an entry that leaves the directory)."""
    try:
        text = (out / MARKER).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    files, folders = set(), set()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        entry = PurePosixPath(line)
        if entry.is_absolute() or ".." in entry.parts or "\\" in line or str(entry) == ".":
            return None
        (folders if line.endswith("/") else files).add(str(entry))
    return frozenset(files), frozenset(folders)


def _write_manifest(out: Path, files, folders) -> None:
    lines = sorted(set(files)) + sorted(f"{f}/" for f in set(folders))
    tmp = out / f"{MARKER}.tmp"
    tmp.write_text(_HEADER + "".join(f"{line}\n" for line in lines), encoding="utf-8")
    tmp.replace(out / MARKER)


def _contents(out: Path) -> Iterator[str]:
    """Every file and link under ``out`` (not followed), as relative POSIX paths."""
    for root, dirs, files in os.walk(out):
        base = Path(root)
        for name in [*files, *(d for d in dirs if (base / d).is_symlink())]:
            yield (base / name).relative_to(out).as_posix()


def foreign_files(out: Path) -> list[str] | None:
    """Files in ``out`` that its manifest does not cover; None when ``out`` has no manifest."""
    manifest = read_manifest(out)
    if manifest is None:
        return None
    files, folders = manifest
    return sorted(rel for rel in _contents(out) if rel != MARKER and rel not in files
                  and not any(rel == f or rel.startswith(f + "/") for f in folders))


def check_replaceable(out: Path) -> None:
    """Raise unless ``out`` is absent, an empty directory, or an autodice output holding only
    what its manifest lists.

    Raises:
        AutodiceError: one line naming ``out`` (and the first files that are not autodice's).
    """
    if not out.exists() and not out.is_symlink():
        return
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return
    foreign = foreign_files(out) if out.is_dir() and not out.is_symlink() else None
    if foreign is None:
        raise AutodiceError(f"{out}: exists and is not an autodice output directory; "
                            f"choose another -o or remove it")
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5
                                         else "")
        raise AutodiceError(f"{out}: holds files autodice did not write ({shown}); move them "
                            f"out or choose another -o")


def check_writable_file(path: Path) -> None:
    """Raise unless ``path`` can be written as a file: its folder exists (checked before a
    long measurement, not after it).

    Raises:
        AutodiceError: ``PATH: cannot write (...)``.
    """
    path = Path(path)
    if path.is_dir():
        raise AutodiceError(f"{path}: cannot write (it is a directory)")
    if not path.parent.is_dir():
        raise AutodiceError(f"{path}: cannot write ({path.parent} is not a directory)")
    if not os.access(path.parent, os.W_OK):
        raise AutodiceError(f"{path}: cannot write (no permission in {path.parent})")


def claim(out: Path, *entries: str) -> None:
    """Record in the manifest of the autodice output ``out`` that autodice writes ``entries``
    inside it (``"packages/"``: a folder, ``"measure.json"``: a file), so the next run may
    replace them with the rest. With no entries, only checks that ``out`` is an output.

    Raises:
        AutodiceError: ``out`` is not an autodice output (writing there would mix autodice's
            files with someone else's), or its manifest cannot be written.
    """
    out = Path(out)
    manifest = read_manifest(out)
    if manifest is None:
        raise AutodiceError(f"{out}: not an autodice output directory (no {MARKER}); "
                            f"`autodice split` writes one")
    files, folders = manifest
    more_files = {e for e in entries if not e.endswith("/")}
    more_folders = {e.rstrip("/") for e in entries if e.endswith("/")}
    if more_files <= files and more_folders <= folders:
        return
    try:
        _write_manifest(out, files | more_files, folders | more_folders)
    except OSError as e:
        raise AutodiceError(f"{out}: cannot write ({e.strerror})") from None


@contextlib.contextmanager
def staged(out: Path, owned: bool = False) -> Iterator[Path]:
    """A temporary directory that replaces ``out`` when the block succeeds.

    Unless the caller ``owned`` it (a folder it claimed inside an autodice output), refuses to
    replace anything :func:`check_replaceable` refuses, and gives the new output its manifest.
    A machine that cannot write there (a parent that is a file, /proc, a read-only or full disk)
    is one line naming ``out``; whatever was made for the attempt is removed again.

    Raises:
        AutodiceError: ``out`` is not autodice's to replace, or cannot be written.
    """
    out = Path(out)
    here = Path.cwd().resolve()
    if out.resolve() in (here, *here.parents):  # replaced whole, it would take the shell's folder
        raise AutodiceError(f"{out}: the current folder (or one holding it) cannot be an output; "
                            "name a folder of its own, such as out")
    if not owned:
        check_replaceable(out)
    made = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result should not be
        yield tmp
        if not owned:
            _write_manifest(tmp, _contents(tmp), ())
        _replace(out, tmp)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for p in made:  # nearest first
            with contextlib.suppress(OSError):
                p.rmdir()
        if isinstance(e, OSError):
            if tmp is None:  # no folder could be made beside it
                raise AutodiceError(f"{out}: cannot write in {out.parent} "
                                    f"({e.strerror or e})") from None
            name = str(e.filename or "").replace(str(tmp), str(out))
            where = f": {name}" if name and name != str(out) else ""
            raise AutodiceError(f"{out}: cannot write ({e.strerror or e}{where})") from None
        raise


def _replace(out: Path, tmp: Path) -> None:
    """Rename ``tmp`` to ``out``; an old ``out`` is moved aside first and put back if the
    rename fails, then removed."""
    if not out.exists():
        tmp.rename(out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
    try:
        out.rename(old / out.name)
    except OSError:
        old.rmdir()
        raise
    try:
        tmp.rename(out)
    except OSError:
        (old / out.name).rename(out)
        old.rmdir()
        raise
    shutil.rmtree(old)


def tensor_files(plan: Plan) -> dict[str, str]:
    """Model input and output name -> the .npy file that carries it (``run``'s inputs and
    results): ``gpu_0/softmax_1`` -> ``gpu_0_softmax_1.npy``. Names that would share a file
    (``a/b`` and ``a_b``) get ``-2``, ``-3``... in plan order, so every name has its own."""
    names = [t.name for t in (*plan.model_inputs, *plan.model_outputs)]
    return unique_slugs(list(dict.fromkeys(names)), ".npy")


def write_atomic(path: Path, data: bytes) -> None:
    """Write one file whole or not at all: a temporary sibling, then a rename over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:  # mkstemp's file is the owner's alone; the file it becomes is as open() would make it
        mask = os.umask(0)
        os.umask(mask)
        os.fchmod(fd, 0o666 & ~mask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
