"""The one error type users see.

Every check collects *all* offenders before failing, so a user fixes a mapping in one pass
instead of one error per run. The CLI turns an :class:`AutodiceError` into one line per problem
and exit code 2; library callers get the list in ``.problems``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path


class AutodiceError(Exception):
    """Bad input or an unusable environment: each problem is one line naming file, key, node."""

    def __init__(self, *problems: str):
        self.problems = [p for p in problems if p]
        super().__init__("\n".join(self.problems))


class JobError(AutodiceError):
    """A job that started and then failed (a rank died, a board was lost): not the input's
    fault, so the CLI exits with its own code (4), not 2."""


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C raises KeyboardInterrupt, so that every path that
    stops cleanly on Ctrl-C (a job stopped in order, the frames delivered so far written) does so
    on them too. ``signum``: which signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


SHOWN = 20  # problems of one kind listed one by one before a count


class Problems:
    """Collects problems so a pass can report every offender at once, then fail.

    A problem may belong to a ``group`` (a line with ``{n}`` in it, such as ``"mapping.json: and
    {n} more keys whose host is not in platform.txt"``): a mapping for another platform can have
    10,000 keys with the same fault, and 10,000 lines hide the one that differs. The first
    ``SHOWN`` of a group are listed; the group's line, with the count of the rest, follows them.
    """

    def __init__(self) -> None:
        self.items: list[str] = []
        self._groups: dict[str, list[int]] = {}  # group -> [problems in it, index of its last]

    def add(self, message: str, group: str | None = None) -> None:
        if group is not None:
            seen = self._groups.setdefault(group, [0, 0])
            seen[0] += 1
            if seen[0] > SHOWN:
                return
            seen[1] = len(self.items)
        self.items.append(message)

    def __bool__(self) -> bool:
        return bool(self.items)

    def lines(self) -> list[str]:
        """The problems, each overfull group's count after its last listed problem."""
        after = {last: group.format(n=count - SHOWN)
                 for group, (count, last) in self._groups.items() if count > SHOWN}
        out = []
        for i, item in enumerate(self.items):
            out.append(item)
            if i in after:
                out.append(after[i])
        return out

    def attempt(self, fn, *args):
        """``fn(*args)``, or None with its AutodiceError's lines kept here: several files read
        one after another, each one's problems said, not only the first file's."""
        try:
            return fn(*args)
        except AutodiceError as e:
            self.items.extend(e.problems)
            return None

    def raise_if_any(self) -> None:
        if self.items:
            raise AutodiceError(*self.lines())


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean "x"?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


# The largest spec file read: a plan for 100,000 layers is a few MB; /dev/zero never ends.
MAX_TEXT_BYTES = 64 * 2**20


def read_text(path: str | Path) -> str:
    """The text of a file the user named; one line naming the file when it cannot be read.

    A UTF-8 byte-order mark (Windows editors write one) is dropped, not taken for part of the
    first name.

    Raises:
        AutodiceError: ``PATH: cannot read (REASON)``, ``PATH: not UTF-8 text`` (a binary
            file given for a text one, or text saved in another encoding), or a file past
            :data:`MAX_TEXT_BYTES`.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TEXT_BYTES + 1)
    except OSError as e:
        raise AutodiceError(f"{path}: cannot read ({e.strerror})") from None
    if len(data) > MAX_TEXT_BYTES:
        raise AutodiceError(f"{path}: larger than {MAX_TEXT_BYTES >> 20} MiB; not a file "
                            "autodice reads")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise AutodiceError(f"{path}: not UTF-8 text (byte {e.start} is "
                            f"0x{e.object[e.start]:02x}); save it as UTF-8") from None


def parse_nested(parse, text: str, path: str | Path):
    """``parse(text)`` for a JSON or TOML parser, which recurse once per level of nesting: a
    file nested thousands deep would end in RecursionError instead of a line naming it (and a
    number of thousands of digits in ValueError).

    Raises:
        AutodiceError: ``PATH: nested too deeply``, ``PATH: holds a number too long to read``.
    """
    try:
        return parse(text)
    except RecursionError:
        raise AutodiceError(f"{path}: nested too deeply to be a file autodice reads") from None
    except ValueError as e:  # Python refuses to read integers of more than 4300 digits
        if "digits" not in str(e) or type(e).__name__.endswith("DecodeError"):
            raise
        raise AutodiceError(f"{path}: holds a number too long to read") from None
