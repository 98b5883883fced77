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
import json
import os
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from ..core.errors import AutodiceError
from .ssh import PROGRAM, Build, Host, Progress, Ssh, must, parallel

# All inside remote_dir; "job" holds the running mpirun's pid and log, out of the stamped
# "launch" (whose fingerprint they would change, making every deploy after a run resend it).
REMOTE_FOLDERS = ("package", "build", "inputs", "results", "launch", "job")
SYNCED = ("package", "launch")  # folders deploy sends with a stamp
RACY_NS = 2_000_000_000  # files younger than this are hashed again by the next deploy

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
  return 0
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
                 folders: tuple[str, ...] = REMOTE_FOLDERS, digests: Digests | None = None,
                 ) -> None:
    """One host's part of :func:`sync_all`."""
    sync_folder(ssh, h, local, build.root(h), "package", folders, digests=digests)


def sync_folder(ssh: Ssh, h: Host, local: Path, root: str, folder: str,
                make: tuple[str, ...] = (), what: str = "rsync failed",
                digests: Digests | None = None) -> None:
    """Make ``local`` the contents of ``root/folder`` on ``h`` unless the check found it there
    (``h.facts["synced_FOLDER"]``); sets ``h.sent``. ``make``: folders of ``root`` to create;
    ``digests``: where local files' digests are remembered.

    Raises:
        AutodiceError: ``what: <rsync's last line>``.
    """
    digest = folder_digest(local, digests)
    if h.facts.get(f"synced_{folder}") == digest:
        h.sent = (0, 0, ())
        return
    t = h.target
    proc = must(["rsync", "-rpc", "--delete", "--exclude=/build/", "--stats",
                 "--out-format=%n", "-e", ssh.rsh(),
                 f"--rsync-path={rsync_path(root, folder, make, digest)}",
                 f"{local}/", f"{t.host}:{root}/{folder}/"], what)
    h.sent = _rsync_stats(proc.stdout)
    h.facts[f"synced_{folder}"] = digest


def rsync_path(root: str, folder: str, make: tuple[str, ...], digest: str) -> str:
    """The remote end of rsync for ``root/folder``: rsync starts it through the remote shell,
    which appends the server's arguments (``$@`` here), so the folders are made first, and the
    folder is stamped once the transfer succeeded (nothing on stdout: that is rsync's channel).
    The exit status is rsync's: a host whose find cannot fingerprint gets no stamp, and syncs
    each time.
    """
    q = shlex.quote
    made = " ".join(q(f"{root}/{d}") for d in dict.fromkeys((*make, folder)))
    stamp = q(f"{root}/{folder}.synced")
    script = (f"{_FINGERPRINT}; mkdir -p {made} && rm -f {stamp} && rsync \"$@\" || exit; "
              f"p=$(fp {q(f'{root}/{folder}')}) && echo {q(digest)} \"$p\" > {stamp}; exit 0")
    # Through sh: the user's login shell (fish, tcsh...) only has to run one quoted command.
    return f"sh -c {q(script)} sh"


def folder_digest(folder: Path, digests: Digests | None = None) -> str:
    """What rsync would make of ``folder``: every file's path, mode and contents."""
    digests = digests or Digests()
    digest = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        info = f.stat()
        digest.update(f"{f.relative_to(folder)}\0{info.st_mode & 0o7777:o}\0".encode())
        digest.update(digests.file(f, info))
    return digest.hexdigest()[:32]


class Digests:
    """Contents digests of local files, remembered in ``path`` (JSON) by size, times and inode,
    so that a redeploy reads again only the files written since (a model's weights are most of
    a package). Thread-safe: one deploy step asks from one thread per host."""

    def __init__(self, path: Path | None = None):
        self.path = path
        self.known: dict[str, list] = {}
        self.used: dict[str, list] = {}
        if path is not None:
            try:
                known = json.loads(path.read_text())
            except (OSError, ValueError):
                known = None
            self.known = known if isinstance(known, dict) else {}  # damaged: read files again

    def file(self, f: Path, info: os.stat_result) -> bytes:
        stamp = [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
        seen = self.known.get(str(f))
        if isinstance(seen, list) and len(seen) == 5 and seen[:4] == stamp:
            try:
                digest = bytes.fromhex(seen[4])
                self.used[str(f)] = seen
                return digest
            except (TypeError, ValueError):
                pass
        started = time.time_ns()
        digest = hashlib.sha256()
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
        # A file written within a timestamp tick of being read could change again without its
        # times changing (1 s clocks on some filesystems): such a digest is not remembered.
        if started - max(info.st_mtime_ns, info.st_ctime_ns) > RACY_NS:
            self.used[str(f)] = [*stamp, digest.hexdigest()]
        return digest.digest()

    def save(self) -> None:
        """Write what this deploy used (files no longer asked about are forgotten)."""
        if self.path is not None:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(self.used, sort_keys=True))
            tmp.replace(self.path)


def _rsync_stats(out: str) -> tuple[int, int, tuple[str, ...]]:
    def number(label: str) -> int:
        m = re.search(rf"^{label}: ([\d,.]+)", out, re.MULTILINE)
        return int(m.group(1).replace(",", "").replace(".", "")) if m else 0

    listing = out.split("\nNumber of files:")[0] if "Number of files:" in out else ""
    files = tuple(ln for ln in listing.splitlines() if ln and not ln.endswith("/"))
    return number("Total bytes sent"), number("Literal data"), files
