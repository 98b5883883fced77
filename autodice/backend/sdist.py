"""Fetching one pinned source package from the package index, configured the way pip is.

Why not ``pip download``: ncnn's setup.py stamps today's date as its version, so pip's resolver
rejects the pinned file as inconsistent, and the legacy resolver that used to get round that is
gone from pip 26. Asking the index's simple API (PEP 503 / PEP 691) for one file by name and
checking its sha256 needs no resolver, no setup.py run and no pip at all, and it behaves the same
under every pip version. What we keep from pip is its *configuration* (``index-url``,
``extra-index-url``, ``find-links``, ``no-index``, ``cert``, ``client-cert``, ``trusted-host``,
``timeout``, ``retries``, ``proxy``; files and ``PIP_*`` variables in pip's own order), so a user
behind a mirror or a proxy who can ``pip install`` can also fetch the engine.
"""

from __future__ import annotations

import base64
import configparser
import hashlib
import json
import os
import shutil
import socket
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from ..core.errors import AutodiceError

PYPI_SIMPLE = "https://pypi.org/simple"
SYSTEM_CONF = Path("/etc/pip.conf")
_ALIASES = {"default-timeout": "timeout"}  # one pip option, two spellings
_ACCEPT = ("application/vnd.pypi.simple.v1+json, "
           "application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01")
_JSON = "application/vnd.pypi.simple.v1+json"


@dataclass(frozen=True)
class PipConfig:
    """The part of pip's configuration that decides where and how a file is fetched."""

    index_url: str = PYPI_SIMPLE
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    cert: str | None = None
    client_cert: str | None = None
    trusted_hosts: tuple[str, ...] = ()
    timeout: float = 15.0
    retries: int = 5
    proxy: str | None = None
    sources: tuple[str, ...] = field(default=(), compare=False)  # the files that were read

    def locations(self) -> list[str]:
        """Where to look, in order: find-links first (often local), then the indexes."""
        indexes = [] if self.no_index else [self.index_url, *self.extra_index_urls]
        return [*self.find_links, *indexes]


def _config_files(environ: dict[str, str]) -> list[Path]:
    """pip's configuration files, lowest priority first (global, user, site, PIP_CONFIG_FILE)."""
    explicit = environ.get("PIP_CONFIG_FILE")
    if explicit == os.devnull:
        return []
    xdg_dirs = environ.get("XDG_CONFIG_DIRS") or "/etc/xdg"
    files = [Path(d) / "pip" / "pip.conf" for d in xdg_dirs.split(os.pathsep) if d]
    files.append(SYSTEM_CONF)
    if not (explicit and Path(explicit).exists()):  # pip skips user files then
        home = Path(environ.get("HOME") or Path.home())
        files.append(home / ".pip" / "pip.conf")
        files.append(Path(environ.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf")
    files.append(Path(sys.prefix) / "pip.conf")
    if explicit:
        files.append(Path(explicit))
    return files


def _option(name: str) -> str:
    """A config key or PIP_* suffix as pip's long option name (``EXTRA_INDEX_URL`` ->
    ``extra-index-url``)."""
    key = name.lower().replace("_", "-")
    return _ALIASES.get(key, key)


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def pip_config(environ: dict[str, str] | None = None) -> PipConfig:
    """Read pip's configuration as ``pip install`` / ``pip download`` would see it.

    Files in pip's order (``$XDG_CONFIG_DIRS/pip/pip.conf``, ``/etc/pip.conf``,
    ``~/.pip/pip.conf``, ``~/.config/pip/pip.conf``, ``<sys.prefix>/pip.conf``,
    ``$PIP_CONFIG_FILE``), each file's ``[global]`` then ``[install]`` then ``[download]``
    section, later overriding earlier; then ``PIP_*`` environment variables over all of them.
    """
    environ = dict(os.environ if environ is None else environ)
    values: dict[str, str] = {}
    read: list[str] = []
    for path in _config_files(environ):
        parser = configparser.RawConfigParser()
        try:
            if not parser.read(path, encoding="utf-8"):
                continue
        except (configparser.Error, UnicodeDecodeError) as e:
            raise AutodiceError(f"{path}: pip configuration cannot be read ({e})") from None
        read.append(str(path))
        for section in ("global", "install", "download"):
            if parser.has_section(section):
                for key, value in parser.items(section):
                    values[_option(key)] = value
    for name, value in environ.items():
        if name.startswith("PIP_") and name != "PIP_CONFIG_FILE":
            values[_option(name[4:])] = value

    def words(key: str) -> tuple[str, ...]:
        return tuple(values.get(key, "").split())

    timeout = values.get("timeout") or "15"
    try:
        seconds, retries = float(timeout), int(values.get("retries", "5"))
    except ValueError:
        raise AutodiceError(f"pip configuration: timeout {timeout!r} or retries "
                            f"{values.get('retries')!r} is not a number") from None
    return PipConfig(
        index_url=(values.get("index-url") or PYPI_SIMPLE).strip(),
        extra_index_urls=words("extra-index-url"),
        find_links=words("find-links"),
        no_index=_truthy(values.get("no-index", "")),
        cert=values.get("cert") or None,
        client_cert=values.get("client-cert") or None,
        trusted_hosts=words("trusted-host"),
        timeout=seconds, retries=max(0, retries),
        proxy=values.get("proxy") or None,
        sources=tuple(read))


# --- reading an index -------------------------------------------------------------------------


class _Anchors(HTMLParser):
    """The ``<a href>`` targets of a simple-API HTML page (or a find-links page)."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)


@dataclass(frozen=True)
class _Link:
    url: str
    sha256: str | None  # what the index says, if it says
    filename: str = ""  # the JSON API's own field; else the URL's last part

    @property
    def name(self) -> str:
        return self.filename or urllib.parse.unquote(
            urllib.parse.urlsplit(self.url).path.rsplit("/", 1)[-1])


def _links_from_html(text: str, base: str) -> list[_Link]:
    parser = _Anchors()
    parser.feed(text)
    links = []
    for href in parser.hrefs:
        url = urllib.parse.urljoin(base, href)
        frag = urllib.parse.urlsplit(url).fragment
        digest = frag.partition("=")[2] if frag.startswith("sha256=") else None
        links.append(_Link(url.split("#", 1)[0], digest))
    return links


def _links_from_json(text: str, base: str) -> list[_Link]:
    files = json.loads(text).get("files", [])
    return [_Link(urllib.parse.urljoin(base, f["url"]), (f.get("hashes") or {}).get("sha256"),
                  str(f.get("filename", "")))
            for f in files if isinstance(f, dict) and "url" in f]


class _Client:
    """urllib with pip's certificate, trusted hosts, proxy, timeout and retries."""

    def __init__(self, config: PipConfig):
        self.config = config
        context = ssl.create_default_context(cafile=config.cert) if config.cert \
            else ssl.create_default_context()
        if config.client_cert:
            context.load_cert_chain(config.client_cert)
        loose = ssl.create_default_context()
        loose.check_hostname, loose.verify_mode = False, ssl.CERT_NONE
        self.trusted = {h.split(":")[0] for h in config.trusted_hosts}
        self.credentials: dict[str | None, str] = {}
        proxies = ({"http": config.proxy, "https": config.proxy} if config.proxy
                   else urllib.request.getproxies())  # http(s)_proxy / no_proxy, as pip
        self.openers = {
            verify: urllib.request.build_opener(
                urllib.request.ProxyHandler(proxies),
                urllib.request.HTTPSHandler(context=context if verify else loose))
            for verify in (True, False)}

    def open(self, url: str, accept: str | None = None):
        """An open response; retries connection resets, time-outs and 5xx like pip does.

        Credentials in an index URL (``user:password@host``) are kept for that host, so the
        file links its pages give are fetched with them too, as pip does.
        """
        parts = urllib.parse.urlsplit(url)
        headers = {"User-Agent": "autodice (simple-api fetch)"}
        if accept:
            headers["Accept"] = accept
        if parts.username is not None:
            token = f"{urllib.parse.unquote(parts.username)}:" \
                    f"{urllib.parse.unquote(parts.password or '')}"
            self.credentials[parts.hostname] = base64.b64encode(token.encode()).decode()
            url = urllib.parse.urlunsplit(parts._replace(
                netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))
        if parts.hostname in self.credentials:
            headers["Authorization"] = "Basic " + self.credentials[parts.hostname]
        opener = self.openers[parts.hostname not in self.trusted]
        for attempt in range(self.config.retries + 1):
            try:
                return opener.open(urllib.request.Request(url, headers=headers),
                                   timeout=self.config.timeout)
            except urllib.error.HTTPError as e:
                if e.code < 500 or attempt == self.config.retries:
                    raise
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                reason = getattr(e, "reason", e)
                if isinstance(reason, (socket.gaierror, ConnectionRefusedError)) \
                        or attempt == self.config.retries:
                    raise  # no network or nothing listening: retrying will not help
            time.sleep(min(0.25 * 2 ** attempt, 4))
        raise AssertionError("unreachable")


def _file_path(location: str) -> Path | None:
    """A find-links/index entry that names a local path (plain or ``file:``), else None."""
    if location.startswith("file:"):
        return Path(urllib.request.url2pathname(urllib.parse.urlsplit(location).path))
    if "://" not in location:
        return Path(location).expanduser()
    return None


def _candidates(client: _Client, location: str, project: str, is_index: bool) -> list[_Link]:
    """The links a find-links entry or an index's project page offers."""
    local = _file_path(location)
    if local is not None:
        if is_index:  # a file: index is a tree of project folders, each with an index.html
            page = local / project / "index.html"
            return (_links_from_html(page.read_text(errors="replace"), page.as_uri())
                    if page.is_file() else [])
        if local.is_dir():  # a find-links folder: the files in it
            return [_Link(p.as_uri(), None) for p in sorted(local.iterdir()) if p.is_file()]
        if local.suffix in (".html", ".htm") and local.is_file():
            return _links_from_html(local.read_text(errors="replace"), local.as_uri())
        return [_Link(local.as_uri(), None)] if local.is_file() else []
    url = location.rstrip("/") + f"/{project}/" if is_index else location
    with client.open(url, accept=_ACCEPT if is_index else None) as response:
        kind = response.headers.get("Content-Type", "").split(";")[0].strip()
        body = response.read().decode("utf-8", errors="replace")
        final = response.geturl()
    return _links_from_json(body, final) if kind == _JSON else _links_from_html(body, final)


# --- fetching ---------------------------------------------------------------------------------


def _describe(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code}"
    reason = getattr(e, "reason", None)
    return str(reason or e) or type(e).__name__


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(project: str, filename: str, sha256: str, folder: Path, console=None,
          config: PipConfig | None = None, offline_hint: str = "") -> Path:
    """``folder/filename``, fetched once from pip's find-links and indexes, sha256-verified.

    A file already in ``folder`` with the right hash is used as it is. A download goes to a
    temporary file beside the target, is hashed while it streams, and is renamed into place only
    when the hash matches: an interrupted or tampered download never becomes the cached file.

    Args:
        project: the index's project name (``ncnn``).
        filename: the exact file to take (``ncnn-1.0.20261020.tar.gz``).
        sha256: the pinned hash; a file with any other hash is refused.
        folder: the download cache.
        console: a ``rich.console.Console`` for the progress bar (stderr by default).
        config: pip's configuration (read with :func:`pip_config` by default).
        offline_hint: appended to the failure message (what to do without a network).

    Raises:
        AutodiceError: no location has the file (each location and what it answered is named),
            or a location's file does not match the pinned hash.
    """
    target = folder / filename
    if target.is_file() and sha256_of(target) == sha256:
        return target
    config = config or pip_config()
    client = _Client(config)
    tried: list[str] = []
    for location in config.locations():
        is_index = location not in config.find_links
        try:
            links = _candidates(client, location, project, is_index)
        except (OSError, ValueError, urllib.error.URLError) as e:
            tried.append(f"{location} ({_describe(e)})")
            continue
        link = next((ln for ln in links if ln.name == filename), None)
        if link is None:
            tried.append(f"{location} (no {filename})")
            continue
        if link.sha256 and link.sha256 != sha256:
            raise AutodiceError(f"{link.url}: the index lists sha256 {link.sha256}, not the pinned "
                                f"{sha256}; refusing it")
        try:
            return _download(client, link.url, sha256, target, console)
        except (OSError, urllib.error.URLError) as e:
            tried.append(f"{link.url} ({_describe(e)})")
    where = "; ".join(tried) if tried else "no location (pip's no-index is set and no find-links)"
    raise AutodiceError(f"cannot fetch {filename} (sha256 {sha256[:12]}...): tried {where}"
                        + (f". {offline_hint}" if offline_hint else ""))


def _download(client: _Client, url: str, sha256: str, target: Path, console) -> Path:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    if console is None:
        from rich.console import Console
        console = Console(stderr=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, client.open(url) as response, Progress(
                TextColumn(f"downloading {target.name}"), BarColumn(), DownloadColumn(),
                TransferSpeedColumn(), console=console, transient=True) as progress:
            size = response.headers.get("Content-Length")
            task = progress.add_task("get", total=int(size) if size else None)
            for block in iter(lambda: response.read(1 << 16), b""):
                digest.update(block)
                out.write(block)
                progress.advance(task, len(block))
        got = digest.hexdigest()
        if got != sha256:
            raise AutodiceError(f"{url}: sha256 {got} does not match the pinned {sha256}; "
                                "refusing it (nothing was kept)")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def use_local(path: str | Path, filename: str, sha256: str, folder: Path, what: str) -> Path:
    """A file the user supplied (``AUTODICE_NCNN_SDIST``), hash-checked, copied in as ``filename``.

    Raises:
        AutodiceError: no such file, or its sha256 is not the pinned one.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise AutodiceError(f"{what}={path}: no such file")
    got = sha256_of(path)
    if got != sha256:
        raise AutodiceError(f"{what}={path}: sha256 {got} does not match the pinned {sha256}")
    target = folder / filename
    if not (target.is_file() and target.samefile(path)):
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{filename}.", dir=folder)
        os.close(fd)
        shutil.copyfile(path, tmp)
        os.replace(tmp, target)
    return target
