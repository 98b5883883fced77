"""Step 2 of deploy, ``sync``: each host's package into its remote directory, by content.

A folder that already holds what is to be sent is not touched at all: after each sync the host
keeps a stamp, ``FOLDER.synced`` beside the folder, naming the digest of what was sent and a
fingerprint of what the folder then held (every file's name, size, mode and modification time,
taken there). The check step reads the stamp back (:data:`STAMPS`) and reports the digest only
while the folder's fingerprint still matches, so a file changed, added or removed there since
makes the next deploy sync again. A host whose digest matches costs no rsync at all.

Otherwise rsync compares checksums (``-c``) and keeps no times, so only changed files move and
unchanged sources keep their remote mtimes (make then rebuilds nothing it need not). Bytes sent
and the files that moved come from ``rsync --stats``.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Callable
from pathlib import Path

from ..core.errors import AutodiceError
from .ssh import PROGRAM, Build, Host, Progress, Ssh, must, parallel

REMOTE_FOLDERS = ("package", "build", "inputs", "results", "launch")  # all inside remote_dir
SYNCED = ("package", "launch")  # folders deploy sends with a stamp

# Shell functions. fp: the fingerprint of folder $1 as one word (GNU find's -printf; where find
# cannot, it fails, and no stamp is written or believed: every deploy syncs). stamps: prints
# synced_FOLDER=DIGEST for each folder "$@" of root $1 whose stamp still matches.
_FINGERPRINT = (r"""fp() { l=$(find "$1" -type f -printf '%P %s %m %T@\n') && """
                r"""printf '%s\n' "$l" | LC_ALL=C sort | cksum | tr ' ' _; }""")
STAMPS = _FINGERPRINT + r"""
stamps() {
  r=$1; shift
  for f in "$@"; do
    [ -f "$r/$f.synced" ] && read -r s p < "$r/$f.synced" && [ "$p" = "$(fp "$r/$f")" ] \
      && echo "synced_$f=$s"
  done
}
"""


def sync_all(ssh: Ssh, hosts: list[Host], local: Callable[[str], Path], progress: Progress,
             build: Build = PROGRAM, folders: tuple[str, ...] = REMOTE_FOLDERS) -> None:
    """rsync each host's package (``local(host)``) into ``build``'s package folder there, after
    making ``folders`` inside ``build``'s root; hosts that hold it already are left alone."""
    problems = parallel(hosts, "sync", lambda h: sync_package(ssh, h, local(h.target.host),
                                                             build, folders), progress)
    if problems:
        raise AutodiceError(*problems)


def sync_package(ssh: Ssh, h: Host, local: Path, build: Build = PROGRAM,
                 folders: tuple[str, ...] = REMOTE_FOLDERS) -> None:
    """One host's part of :func:`sync_all`."""
    sync_folder(ssh, h, local, build.root(h), "package", folders)


def sync_folder(ssh: Ssh, h: Host, local: Path, root: str, folder: str,
                make: tuple[str, ...] = (), what: str = "rsync failed") -> None:
    """Make ``local`` the contents of ``root/folder`` on ``h`` unless the check found it there
    (``h.facts["synced_FOLDER"]``); sets ``h.sent``. ``make``: folders of ``root`` to create.

    Raises:
        AutodiceError: ``what: <rsync's last line>``.
    """
    digest = folder_digest(local)
    if h.facts.get(f"synced_{folder}") == digest:
        h.sent = (0, 0, ())
        return
    t = h.target
    stamp = f"{root}/{folder}.synced"
    # rsync starts its remote end through the remote shell, which appends the server's
    # arguments to --rsync-path: so the folders are made first, and the function stamps the
    # folder once the transfer succeeded (nothing on stdout: that is rsync's channel).
    made = " ".join(shlex.quote(f"{root}/{d}") for d in dict.fromkeys((*make, folder)))
    q = shlex.quote
    remote = (f"{_FINGERPRINT}; s() {{ mkdir -p {made} && rm -f {q(stamp)} && rsync \"$@\" "
              f"&& p=$(fp {q(f'{root}/{folder}')}) && echo {q(digest)} \"$p\" > {q(stamp)}; }}; s")
    proc = must(["rsync", "-rpc", "--delete", "--exclude=/build/", "--stats",
                 "--out-format=%n", "-e", ssh.rsh(), f"--rsync-path={remote}",
                 f"{local}/", f"{t.host}:{root}/{folder}/"], what)
    h.sent = _rsync_stats(proc.stdout)
    h.facts[f"synced_{folder}"] = digest


def folder_digest(folder: Path) -> str:
    """What rsync would make of ``folder``: every file's path, mode and contents."""
    digest = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{f.relative_to(folder)}\0{f.stat().st_mode & 0o7777:o}\0".encode())
        file = hashlib.sha256()
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 20):
                file.update(chunk)
        digest.update(file.digest())
    return digest.hexdigest()[:32]


def _rsync_stats(out: str) -> tuple[int, int, tuple[str, ...]]:
    def number(label: str) -> int:
        m = re.search(rf"^{label}: ([\d,.]+)", out, re.MULTILINE)
        return int(m.group(1).replace(",", "").replace(".", "")) if m else 0

    listing = out.split("\nNumber of files:")[0] if "Number of files:" in out else ""
    files = tuple(ln for ln in listing.splitlines() if ln and not ln.endswith("/"))
    return number("Total bytes sent"), number("Literal data"), files
