"""Where a host's sensors are read: its sysfs folder and its firmware's ``vcgencmd``.

The readers (:mod:`.power`, :mod:`.thermal`) take a :class:`HostFiles`, so one reader serves
this machine and a deployed board alike: here, ``/sys`` and the ``vcgencmd`` on PATH; a board,
a copy of its sysfs files and of vcgencmd's answers fetched over ssh
(:mod:`autodice.deploy.board_figures`).

``AUTODICE_SYSFS`` names another sysfs folder, here and on every board, as node_exporter's
``--path.sysfs`` does: a container that sees the host's sysfs at ``/host/sys``, or a test's
tree in a real board's layout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def sysfs_folder() -> str:
    """The sysfs folder to read (``/sys`` unless ``AUTODICE_SYSFS`` says otherwise)."""
    return os.environ.get("AUTODICE_SYSFS") or "/sys"


def local_vcgencmd(command: str) -> str | None:
    """What this machine's ``vcgencmd COMMAND`` prints (a Raspberry Pi's firmware); None where
    there is none or it does not answer."""
    if shutil.which("vcgencmd") is None:
        return None
    try:
        out = subprocess.run(["vcgencmd", command], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def no_vcgencmd(command: str) -> str | None:
    return None


@dataclass(frozen=True)
class HostFiles:
    """A host's sensor files: ``sys`` is its sysfs folder (``class/hwmon``, ...), ``vcgencmd``
    answers a firmware command (None: none)."""

    sys: Path
    vcgencmd: Callable[[str], str | None] = no_vcgencmd


def here() -> HostFiles:
    """This machine's."""
    return HostFiles(Path(sysfs_folder()), local_vcgencmd)
