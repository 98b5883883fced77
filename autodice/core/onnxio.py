"""Reading and writing ONNX files without pulling the weights through Python.

A full-size VGG-19 is 548 MB, nearly all of it weights. ``onnx.load`` parses every byte into
protobuf objects and a sub-model written with ``onnx.save`` copies them twice more; on small
edge-class machines (and this one) that dominates the split. So we scan the protobuf wire format
instead: every field of the model and graph is parsed normally *except* initializers, which become
:class:`TensorRef` — name, dims, dtype and where their serialized bytes lie in the file. Writing a
sub-model concatenates the re-serialized small parts with the referenced byte ranges, copied file to
file by the kernel (``os.copy_file_range``). Each weight is written once and never deep-copied.

The copy is the split's physical limit, so it is kept as cheap as ``cp``'s: initializers that lie
back to back in the source go as one range, small ranges are read and written with the bytes around
them, and each large range lands at the same offset modulo the page size as in the source — the
kernel then copies whole pages instead of stitching every page from two (measured: 40% less CPU on
VGG-19). The few bytes that shift it there are a ``doc_string`` of spaces in the tensor's message,
placed before the tensor's own fields so that a ``doc_string`` the tensor had still wins.

Tensors stored as external data stay external: their bytes are copied into a data file beside the
sub-model. Sub-models that would pass protobuf's 2 GB limit move all their weights to such a file.
External data must lie inside the model's folder, as onnx's checker requires: a location is data
from the file, and ``../../etc/passwd`` would otherwise be copied into the output.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import onnx
from onnx import TensorProto

from .errors import AutodiceError, Problems

# Protobuf wire types and the field numbers of onnx.proto that this module reads by hand.
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_NAME, _TENSOR_RAW_DATA = 1, 2, 8, 9
_TENSOR_DOC_STRING, _TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 12, 13, 14

# Initializers up to this size are parsed into TensorProtos: shape constants, scalars, small biases
# whose values shape inference and constant folding need.
SMALL_TENSOR_BYTES = 4096
# Protobuf refuses messages of 2 GiB and more; stay clear of it.
PROTOBUF_LIMIT = 1_800_000_000
# The most elements one tensor may have. ncnn indexes blobs with int; past this a shape is a typo
# (or --input-shape 1x3x1099511627776x...), and the plan's byte counts would be fiction.
MAX_ELEMENTS = 2**31
# Ranges of weights at least this large are copied by the kernel, page-aligned as in the source;
# smaller ones are read and written with the bytes around them (a syscall each costs more).
COPY_MIN = 64 * 1024
_PAGE = 4096


@dataclass(frozen=True)
class TensorRef:
    """An initializer left in its file: what it is, and where its serialized bytes are."""

    name: str
    dims: tuple[int, ...]
    data_type: int
    nbytes: int  # payload size (dims x element size), whether inline or external
    path: Path  # the file holding the serialized TensorProto
    offset: int  # ... at this offset
    length: int  # ... of this many bytes
    raw_offset: int | None  # absolute offset of raw_data in ``path`` (None: not raw_data)
    external: bool  # data lives in an external file named by the TensorProto
    source: tuple[Path, int] | None = None  # external: (data file, offset), checked on reading
    # Where the initializer field (tag, length, message) starts, when the message is one in a
    # model's graph: tensors whose fields lie back to back are copied as one range.
    field_offset: int | None = None


@dataclass
class LazyModel:
    """A model whose graph has no initializers; those are in ``tensors`` by reference."""

    path: Path
    proto: onnx.ModelProto  # graph.initializer is empty
    tensors: dict[str, TensorRef]  # in file order
    small: dict[str, TensorProto]  # parsed values of the small initializers


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _fields(buf, start: int, end: int):
    """Yield (field number, wire type, value start, value end, field start) over buf[start:end]."""
    pos = start
    while pos < end:
        field_start = pos
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            _, after = _varint(buf, pos)
        elif wire == _LEN:
            size, pos = _varint(buf, pos)
            after = pos + size
        elif wire == _I64:
            after = pos + 8
        elif wire == _I32:
            after = pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} at byte {field_start}")
        yield number, wire, pos, after, field_start
        pos = after


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(number: int, size: int) -> bytes:
    return _encode_varint((number << 3) | _LEN) + _encode_varint(size)


_ELEM_SIZE = {
    TensorProto.FLOAT: 4, TensorProto.UINT8: 1, TensorProto.INT8: 1, TensorProto.UINT16: 2,
    TensorProto.INT16: 2, TensorProto.INT32: 4, TensorProto.INT64: 8, TensorProto.BOOL: 1,
    TensorProto.FLOAT16: 2, TensorProto.DOUBLE: 8, TensorProto.UINT32: 4, TensorProto.UINT64: 8,
    TensorProto.BFLOAT16: 2,
}


def element_size(data_type: int) -> int:
    """Bytes per element of an ONNX tensor type (4 for unknown types, a safe estimate)."""
    return _ELEM_SIZE.get(data_type, 4)


def _scan_tensor(buf, start: int, end: int, path: Path, field_start: int) -> TensorRef:
    dims: list[int] = []
    data_type = TensorProto.FLOAT
    name = ""
    raw_offset = raw_len = None
    external = False
    for number, wire, vstart, vend, _ in _fields(buf, start, end):
        if number == _TENSOR_DIMS:
            if wire == _LEN:  # packed
                p = vstart
                while p < vend:
                    d, p = _varint(buf, p)
                    dims.append(d)
            else:
                dims.append(_varint(buf, vstart)[0])
        elif number == _TENSOR_DATA_TYPE:
            data_type = _varint(buf, vstart)[0]
        elif number == _TENSOR_NAME:
            name = bytes(buf[vstart:vend]).decode()
        elif number == _TENSOR_RAW_DATA:
            raw_offset, raw_len = vstart, vend - vstart
        elif number == _TENSOR_DATA_LOCATION:
            external = _varint(buf, vstart)[0] == TensorProto.EXTERNAL
    dims = [d - 2**64 if d >= 2**63 else d for d in dims]  # int64 on the wire
    nbytes = raw_len if raw_len is not None else elements(dims) * element_size(data_type)
    return TensorRef(name, tuple(dims), data_type, nbytes, path, start, end - start,
                     raw_offset, external, field_offset=field_start)


def elements(dims) -> int:
    """How many elements a tensor of shape ``dims`` holds."""
    count = 1
    for d in dims:
        count *= d
    return count


def _check_tensor(buf, ref: TensorRef, problems: Problems) -> TensorRef:
    """Problems of one initializer's shape and bytes; the ref with its external source found.

    The dims are the truth shape inference and the plan use, so the bytes must agree with
    them: a short ``raw_data`` or external range would make a sub-model that pnnx reads past.
    """
    where = f'{ref.path}: initializer "{ref.name}"'
    shape = "x".join(map(str, ref.dims)) or "scalar"
    group = f"{ref.path}: and {{n}} more initializers with a bad shape or bytes"
    if any(d < 0 for d in ref.dims):
        problems.add(f"{where}: shape {shape} has a negative dimension", group)
        return ref
    count = elements(ref.dims)
    if count > MAX_ELEMENTS:
        problems.add(f"{where}: shape {shape} has {count} elements, past 2^31 (the most "
                     f"autodice handles in one tensor)", group)
        return ref
    size = _ELEM_SIZE.get(ref.data_type)
    want = None if size is None else count * size
    if ref.external:
        return _check_external(buf, ref, want, where, problems)
    if ref.raw_offset is not None and want is not None and ref.nbytes != want:
        problems.add(f"{where} holds {ref.nbytes} bytes of raw_data; its shape {shape} of "
                     f"{TensorProto.DataType.Name(ref.data_type).lower()} needs {want}", group)
    return ref


def _check_external(buf, ref: TensorRef, want: int | None, where: str,
                    problems: Problems) -> TensorRef:
    """The external data of ``ref``: a regular file inside the model's folder (no ``..``, no
    absolute path, no symbolic link out of it), holding the whole range the tensor needs."""
    t = TensorProto()
    t.ParseFromString(bytes(buf[ref.offset:ref.offset + ref.length]))
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location")
    if not location:
        problems.add(f"{where}: external data has no location")
        return ref
    numbers = {}
    for key, default in (("offset", "0"), ("length", None)):
        text = info.get(key, default)
        if text is None:
            continue
        if not text.isdigit():
            problems.add(f'{where}: external data {key} "{text}" is not a whole number')
            return ref
        numbers[key] = int(text)
    folder = ref.path.parent.resolve()
    file = (folder / location).resolve()
    if (Path(location).is_absolute() or ".." in Path(location).parts
            or not file.is_relative_to(folder)):
        problems.add(f'{where}: external data "{location}" is outside the model\'s folder '
                     f"({folder}); onnx requires it there")
        return ref
    if not file.exists():
        problems.add(f'{where}: external data "{location}": no such file in {folder}')
        return ref
    if not file.is_file():
        problems.add(f'{where}: external data "{location}" is not a file')
        return ref
    offset = numbers["offset"]
    length = numbers.get("length", want if want is not None else ref.nbytes)
    if want is not None and length != want:
        problems.add(f'{where}: external data "{location}" gives length {length}; the '
                     f"shape {'x'.join(map(str, ref.dims))} needs {want} bytes")
        return ref
    size = file.stat().st_size
    if offset + length > size:
        problems.add(f'{where}: external data "{location}" holds {size} bytes; the tensor needs '
                     f"bytes {offset} to {offset + length}")
        return ref
    return replace(ref, nbytes=length, external=True, source=(file, offset))


def read_model(path: str | os.PathLike) -> LazyModel:
    """Parse ``path`` except for its initializers' payloads.

    Raises:
        AutodiceError: the file is missing or is not an ONNX model.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _read(buf, path)
    except FileNotFoundError:
        raise AutodiceError(f"{path}: no such file") from None
    except (ValueError, IndexError, UnicodeDecodeError) as e:
        raise AutodiceError(f"{path}: not an ONNX model ({e})") from None
    except Exception as e:  # protobuf's DecodeError has no stable import path
        if type(e).__name__ == "DecodeError":
            raise AutodiceError(f"{path}: not an ONNX model ({e})") from None
        raise


def _read(buf, path: Path) -> LazyModel:
    model_parts, graph_parts = [], []
    tensors: dict[str, TensorRef] = {}
    small: dict[str, TensorProto] = {}
    problems = Problems()
    saw_graph = False
    for number, _, vstart, vend, fstart in _fields(buf, 0, len(buf)):
        if number != _MODEL_GRAPH:
            model_parts.append(buf[fstart:vend])
            continue
        saw_graph = True
        for gnum, _, gstart, gend, gfstart in _fields(buf, vstart, vend):
            if gnum != _GRAPH_INITIALIZER:
                graph_parts.append(buf[gfstart:gend])
                continue
            ref = _check_tensor(buf, _scan_tensor(buf, gstart, gend, path, gfstart), problems)
            tensors[ref.name] = ref
            if ref.length <= SMALL_TENSOR_BYTES:
                t = TensorProto()
                t.ParseFromString(buf[gstart:gend])
                small[ref.name] = t
    if not saw_graph:
        raise ValueError("no graph")
    proto = onnx.ModelProto()
    proto.ParseFromString(b"".join(model_parts))
    proto.graph.ParseFromString(b"".join(graph_parts))
    if not proto.opset_import:
        raise ValueError("no opset_import")
    problems.raise_if_any()
    return LazyModel(path, proto, tensors, small)


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


def _payload_source(ref: TensorRef) -> tuple[Path, int, int]:
    if ref.source is not None:  # external: the file and range read_model checked
        return ref.source[0], ref.source[1], ref.nbytes
    if ref.raw_offset is not None:
        return ref.path, ref.raw_offset, ref.nbytes
    raise AutodiceError(f'{ref.path}: initializer "{ref.name}" stores typed data, not raw_data, '
                        f"and is too large to write inline; re-export the model with raw_data")


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
                    return (_len_field(_GRAPH_INITIALIZER, length + padding)
                            + _len_field(_TENSOR_DOC_STRING, n) + b" " * n)
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
            piece.header = _len_field(_GRAPH_INITIALIZER, length)
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
                src, off, length = _payload_source(ref)
                sources.copy(src, data_fd, off, length)
                msg = _external_tensor(ref, data_name, data_offset)
                data_offset += length
                pieces.append(_len_field(_GRAPH_INITIALIZER, len(msg)) + msg)
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
        pending = bytearray(head + _len_field(_MODEL_GRAPH, graph_size) + graph_bytes)
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


def read_array(ref: TensorRef):
    """One initializer's values as a numpy array (a weight that a rewrite must slice)."""
    import numpy as np
    from onnx import numpy_helper

    if ref.raw_offset is not None or ref.external:
        src, offset, length = _payload_source(ref)
        with open(src, "rb") as f:
            f.seek(offset)
            data = f.read(length)
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(ref.data_type))
        return np.frombuffer(data, dtype=dtype).reshape(ref.dims)
    t = TensorProto()
    with open(ref.path, "rb") as f:
        f.seek(ref.offset)
        t.ParseFromString(f.read(ref.length))
    return numpy_helper.to_array(t)


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
