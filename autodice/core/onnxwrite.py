"""Writing sub-models whose weights are byte ranges of the source file (:class:`TensorRef`).

Writing a sub-model concatenates its re-serialized small parts with the referenced byte ranges,
copied file to file by the kernel (``os.copy_file_range``). Each weight is written once and never
deep-copied.

The copy is the split's physical limit, so it is kept as cheap as ``cp``'s: initializers that lie
back to back in the source go as one range, small ranges are read and written with the bytes around
them, and each large range lands at the same offset modulo the page size as in the source — the
kernel then copies whole pages instead of stitching every page from two (measured: 40% less CPU on
VGG-19). The few bytes that shift it there are a ``doc_string`` of spaces in the tensor's message,
placed before the tensor's own fields so that a ``doc_string`` the tensor had still wins.

Tensors stored as external data have their bytes copied into a data file beside the sub-model.
Sub-models that would pass protobuf's 2 GB limit move all their weights to such a file.
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto

from .errors import AutodiceError
from .onnxio import (
    GRAPH_INITIALIZER,
    MODEL_GRAPH,
    TENSOR_DOC_STRING,
    TensorRef,
    len_field,
    payload_source,
)

# Protobuf refuses messages of 2 GiB and more; stay clear of it.
PROTOBUF_LIMIT = 1_800_000_000
# Ranges of weights at least this large are copied by the kernel, page-aligned as in the source;
# smaller ones are read and written with the bytes around them (a syscall each costs more).
COPY_MIN = 64 * 1024
_PAGE = 4096


class Sources:
    """The files weights are copied from, each opened once for a whole split (DenseNet-121's 24
    sub-models copy 848 tensors out of one file) and shared by the writing threads: every read
    names its offset, so no thread moves a file position another relies on."""

    def __init__(self):
        self._fds: dict[Path, int] = {}
        self._lock = threading.Lock()

    def fd(self, path: Path) -> int:
        with self._lock:
            if path not in self._fds:
                self._fds[path] = os.open(path, os.O_RDONLY)
            return self._fds[path]

    def read(self, path: Path, offset: int, length: int) -> bytes:
        data = os.pread(self.fd(path), length, offset)
        if len(data) < length:
            raise AutodiceError(f"{path}: file ends before byte {offset + length}")
        return data

    def copy(self, path: Path, dst_fd: int, offset: int, length: int) -> None:
        """Append ``length`` bytes at ``offset`` of ``path`` to ``dst_fd``, in the kernel where
        it can; across filesystems (``EXDEV``: an output on /dev/shm, a model on NFS) and where
        the kernel or filesystem has no such copy, by reading and writing."""
        fd = self.fd(path)
        while length:
            try:
                n = os.copy_file_range(fd, dst_fd, length, offset)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL,
                                   errno.EBADF, errno.EPERM):
                    raise
                n = _read_write(fd, dst_fd, length, offset)
            if n == 0:
                raise AutodiceError(f"{path}: file ends before byte {offset + length}")
            offset += n
            length -= n

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __enter__(self) -> Sources:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read_write(src_fd: int, dst_fd: int, length: int, offset: int) -> int:
    """Up to ``length`` bytes at ``offset`` of ``src_fd`` appended to ``dst_fd``: the copy for
    when ``copy_file_range`` cannot. Returns how many (0 at the end of the file)."""
    data = os.pread(src_fd, min(length, 1 << 24), offset)
    _write_all(dst_fd, data)
    return len(data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _external_tensor(ref: TensorRef, location: str, offset: int) -> bytes:
    """A TensorProto header that points at ``location`` instead of holding the payload."""
    t = TensorProto(name=ref.name, dims=ref.dims, data_type=ref.data_type,
                    data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(ref.nbytes))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t.SerializeToString()


@dataclass
class _Run:
    """Initializers that lie back to back in one file, written as one range: the first one's
    field header is written anew (padded, when the range is copied), the rest come along."""

    first: TensorRef
    end: int  # where the last one's message ends in ``first.path``
    header: bytes = b""

    @property
    def start(self) -> int:
        return self.first.offset

    @property
    def copied(self) -> bool:
        return self.end - self.start >= COPY_MIN


def _varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _aligned_header(length: int, pos: int, target: int) -> bytes:
    """The initializer field header of a ``length``-byte tensor message written at ``pos``,
    padded with a ``doc_string`` field so that the message starts at ``target`` modulo the
    page size: the field's tag and length, then the padding, which the message's own fields
    follow."""
    for size in ((target - pos) % _PAGE, (target - pos) % _PAGE + _PAGE):
        for tag_and_length in range(2, 12):
            padding = size - tag_and_length  # the doc_string field: tag, length, spaces
            if padding < 2 or 1 + _varint_size(length + padding) != tag_and_length:
                continue
            for n in (padding - 2, padding - 3):
                if n >= 0 and 1 + _varint_size(n) + n == padding:
                    return (len_field(GRAPH_INITIALIZER, length + padding)
                            + len_field(TENSOR_DOC_STRING, n) + b" " * n)
    raise AssertionError("unreachable: every residue has a padding")


def _layout(pieces: list, start: int, graph_bytes: int) -> int:
    """Give every run its header for a graph field whose value starts at ``start``; returns
    the graph field's size."""
    pos = start + graph_bytes
    for piece in pieces:
        if isinstance(piece, bytes):
            pos += len(piece)
            continue
        length = piece.first.length
        if piece.copied:
            piece.header = _aligned_header(length, pos, piece.start)
        else:
            piece.header = len_field(GRAPH_INITIALIZER, length)
        pos += len(piece.header) + piece.end - piece.start
    return pos - start


def write_model(path: Path, proto: onnx.ModelProto, tensors: list[TensorRef],
                sources: Sources | None = None) -> None:
    """Write ``proto`` (whose graph has no initializers) plus ``tensors`` as one ONNX file.

    Tensors that were external stay external (``<file>.data`` beside it); if the inline file would
    pass the protobuf limit, every tensor goes external.

    Args:
        sources: the open source files to copy from (shared by the writes of one split).
    """
    if sources is None:
        with Sources() as own:
            return write_model(path, proto, tensors, own)
    graph_bytes = proto.graph.SerializeToString()  # nodes, inputs, outputs: small
    data_name = path.name + ".data"
    all_external = sum(t.length for t in tensors) + len(graph_bytes) > PROTOBUF_LIMIT
    data_fd = None
    pieces: list[bytes | _Run] = []  # in ``tensors``' order
    data_offset = 0
    try:
        for ref in tensors:
            if ref.external or all_external:
                if data_fd is None:
                    data_fd = os.open(path.parent / data_name,
                                      os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                src, off, length = payload_source(ref)
                sources.copy(src, data_fd, off, length)
                msg = _external_tensor(ref, data_name, data_offset)
                data_offset += length
                pieces.append(len_field(GRAPH_INITIALIZER, len(msg)) + msg)
                continue
            last = pieces[-1] if pieces else None
            if (isinstance(last, _Run) and last.first.path == ref.path
                    and ref.field_offset == last.end
                    and ref.offset - ref.field_offset == 1 + _varint_size(ref.length)):
                last.end = ref.offset + ref.length  # its field header comes along, as written
            else:
                pieces.append(_Run(ref, ref.offset + ref.length))
    finally:
        if data_fd is not None:
            os.close(data_fd)
    # Everything in ``proto`` but the graph field, then the graph field rebuilt with initializers.
    rest = onnx.ModelProto()
    rest.CopyFrom(proto)
    rest.ClearField("graph")
    head = rest.SerializeToString()
    # The graph field's length comes before the runs, and its size moves the pages they align
    # to: settle it. The headers always match the size written; only alignment needs a match.
    length_size = 1
    for _ in range(4):
        graph_size = _layout(pieces, len(head) + 1 + length_size, len(graph_bytes))
        if _varint_size(graph_size) == length_size:
            break
        length_size = _varint_size(graph_size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pending = bytearray(head + len_field(MODEL_GRAPH, graph_size) + graph_bytes)
        for piece in pieces:
            if isinstance(piece, bytes):
                pending += piece
                continue
            pending += piece.header
            length = piece.end - piece.start
            if not piece.copied:
                pending += sources.read(piece.first.path, piece.start, length)
                continue
            _write_all(fd, pending)
            pending.clear()
            sources.copy(piece.first.path, fd, piece.start, length)
        _write_all(fd, pending)
    finally:
        os.close(fd)


class TensorFile:
    """New initializers (weight slices a rewrite made) written once to a file of serialized
    TensorProtos, so sub-models copy them by reference like the model's own."""

    def __init__(self, path: Path):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._size = 0

    def add(self, name: str, array) -> TensorRef:
        from onnx import numpy_helper

        t = numpy_helper.from_array(array, name)
        data = t.SerializeToString()
        offset = self._size
        _write_all(self._fd, data)
        self._size += len(data)
        # raw_data is the last field protobuf serializes here, so the payload ends the message.
        nbytes = len(t.raw_data)
        return TensorRef(name, tuple(t.dims), t.data_type, nbytes, self.path, offset, len(data),
                         offset + len(data) - nbytes, False)

    def close(self) -> None:
        os.close(self._fd)
