"""Step 2 of deploy, ``sync``: each host's package into its remote directory, by content.

rsync compares checksums (``-c``) and keeps no times, so only changed files move and unchanged
sources keep their remote mtimes (make then rebuilds nothing it need not). Bytes sent and the
files that moved come from ``rsync --stats``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

from ..core.errors import AutodiceError
from .ssh import PROGRAM, Build, Host, Progress, Ssh, must, parallel

REMOTE_FOLDERS = ("package", "build", "inputs", "results", "launch")  # all inside remote_dir


def sync_all(ssh: Ssh, hosts: list[Host], local: Callable[[str], Path], progress: Progress,
             build: Build = PROGRAM, folders: tuple[str, ...] = REMOTE_FOLDERS) -> None:
    """rsync each host's package (``local(host)``) into ``build``'s package folder there, after
    making ``folders`` inside ``build``'s root."""
    def sync(h: Host) -> None:
        t = h.target
        root = build.root(h)
        # rsync starts its remote end through the remote shell: make the folders first.
        made = " ".join(shlex.quote(f"{root}/{d}") for d in folders)
        proc = must(["rsync", "-rpc", "--delete", "--exclude=/build/", "--stats",
                     "--out-format=%n", "-e", ssh.rsh(),
                     f"--rsync-path=mkdir -p {made} && rsync",
                     f"{local(t.host)}/", f"{t.host}:{root}/package/"],
                    "rsync failed")
        h.sent = _rsync_stats(proc.stdout)

    problems = parallel(hosts, "sync", sync, progress)
    if problems:
        raise AutodiceError(*problems)


def _rsync_stats(out: str) -> tuple[int, int, tuple[str, ...]]:
    def number(label: str) -> int:
        m = re.search(rf"^{label}: ([\d,.]+)", out, re.MULTILINE)
        return int(m.group(1).replace(",", "").replace(".", "")) if m else 0

    listing = out.split("\nNumber of files:")[0] if "Number of files:" in out else ""
    files = tuple(ln for ln in listing.splitlines() if ln and not ln.endswith("/"))
    return number("Total bytes sent"), number("Literal data"), files
