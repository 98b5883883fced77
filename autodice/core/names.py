"""Names are data, never code: the one escaping function for each place a name can reach.

Tensor, node, file and host names come from a model or a spec, and an ONNX name may hold any
text: quotes, backslashes, newlines, ``*/``, trigraphs, NUL, Unicode direction overrides. Every
such name that enters generated text goes through exactly one function here for that target:

* :func:`cpp_string`: a C++ string literal holding the name's exact UTF-8 bytes;
* :func:`cpp_comment`: a one-line rendering for a ``//`` comment, which nothing can end early
  or continue onto the next line;
* :func:`file_slug`: a file name made of ``[A-Za-z0-9._-]`` only (see :func:`unique_slugs` for
  the collision check).

The templates cannot print a raw name by accident: the Jinja environment's ``finalize`` refuses
any ``str`` that did not come out of one of these (:class:`Escaped`).
"""

from __future__ import annotations

import re


class Escaped(str):
    """Text already made safe for its target; the only strings a template may print."""


def cpp_string(text: str) -> Escaped:
    """A C++ ``std::string`` literal (``"..."s``) of ``text``'s UTF-8 bytes.

    Printable ASCII stays as it is except ``"``, ``\\`` and ``?`` (no trigraph can form); every
    other byte, NUL included, becomes a three-digit octal escape, which never swallows the
    character after it. The ``s`` suffix keeps a NUL from ending the string early.
    """
    out = ['"']
    for b in text.encode("utf-8", "surrogatepass"):
        c = chr(b)
        if c in '"\\?':
            out.append("\\" + c)
        elif 0x20 <= b < 0x7F:
            out.append(c)
        else:
            out.append(f"\\{b:03o}")
    out.append('"s')
    return Escaped("".join(out))


_COMMENT_UNSAFE = re.compile(r"[\\?]")


def cpp_comment(text: str, limit: int = 120) -> Escaped:
    """``text`` for a ``//`` comment: printable characters only, on one line, never ending in a
    backslash (which would splice the next line into the comment).

    Backslashes and ``?`` (trigraph ``??/``) become ``_``, so do control and format characters
    (newlines, NUL, bidirectional overrides); long names are cut with ``...``.
    """
    safe = "".join(c if c.isprintable() else "_" for c in text)
    safe = _COMMENT_UNSAFE.sub("_", safe)
    if len(safe) > limit:
        safe = safe[:limit - 3] + "..."
    return Escaped(safe)


_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def file_slug(name: str, suffix: str = "") -> str:
    """``name`` as a file name: characters other than letters, digits, ``.``, ``_``, ``-``
    become ``_``; never empty, never ``.``/``..``, never hidden, at most 120 bytes (a hash
    keeps long names apart)."""
    slug = _SLUG_UNSAFE.sub("_", name)
    if not slug or slug.startswith("."):
        slug = "_" + slug
    if len(slug) > 120:
        import hashlib  # rarely needed; loading OpenSSL is ~10 ms of every command's start

        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        slug = f"{slug[:100]}-{digest}"
    return slug + suffix


def unique_slugs(names: list[str], suffix: str = "") -> dict[str, str]:
    """:func:`file_slug` of each name, made unique: ``a/b`` and ``a_b`` both slug to ``a_b``,
    so later ones get ``-2``, ``-3``... in the order given (stable for a given plan)."""
    taken: set[str] = set()
    out: dict[str, str] = {}
    for name in names:
        base = file_slug(name)
        slug, k = base, 1
        while slug.lower() + suffix in taken:  # case-insensitive file systems too
            k += 1
            slug = f"{base}-{k}"
        taken.add(slug.lower() + suffix)
        out[name] = slug + suffix
    return out


def finalize(value):
    """Jinja ``finalize``: numbers and escaped text print; a raw string is a bug in the template.

    Raises:
        TypeError: ``value`` is a ``str`` that no escaping function produced.
    """
    if isinstance(value, str) and not isinstance(value, Escaped):
        raise TypeError(f"template printed a raw string {value[:40]!r}: pass it through "
                        "|cpp, |comment or a number")
    return value
