"""Reading ONNX files without pulling the weights through Python.

A full-size VGG-19 is 548 MB, nearly all of it weights. ``onnx.load`` parses every byte into
protobuf objects and a sub-model written with ``onnx.save`` copies them twice more; on small
edge-class machines (and this one) that dominates the split. So we scan the protobuf wire format
instead: every field of the model and graph is parsed normally *except* initializers, which become
:class:`TensorRef` — name, dims, dtype and where their serialized bytes lie in the file.
:mod:`autodice.core.onnxwrite` writes sub-models from those references, never deep-copying a
weight.

Tensors stored as external data stay external. External data must lie inside the model's folder,
as onnx's checker requires: a location is data from the file, and ``../../etc/passwd`` would
otherwise be copied into the output.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, replace
from pathlib import Path

import onnx
from onnx import TensorProto

from .errors import AutodiceError, Problems

# Protobuf wire types and the field numbers of onnx.proto that this module reads by hand.
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
MODEL_GRAPH = 7
GRAPH_INITIALIZER = 5
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_NAME, _TENSOR_RAW_DATA = 1, 2, 8, 9
TENSOR_DOC_STRING, _TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 12, 13, 14

# Initializers up to this size are parsed into TensorProtos: shape constants, scalars, small biases
# whose values shape inference and constant folding need.
SMALL_TENSOR_BYTES = 4096
# The most elements one tensor may have. ncnn indexes blobs with int; past this a shape is a typo
# (or --input-shape 1x3x1099511627776x...), and the plan's byte counts would be fiction.
MAX_ELEMENTS = 2**31


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


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def len_field(number: int, size: int) -> bytes:
    return encode_varint((number << 3) | _LEN) + encode_varint(size)


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
        if number != MODEL_GRAPH:
            model_parts.append(buf[fstart:vend])
            continue
        saw_graph = True
        for gnum, _, gstart, gend, gfstart in _fields(buf, vstart, vend):
            if gnum != GRAPH_INITIALIZER:
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


def payload_source(ref: TensorRef) -> tuple[Path, int, int]:
    if ref.source is not None:  # external: the file and range read_model checked
        return ref.source[0], ref.source[1], ref.nbytes
    if ref.raw_offset is not None:
        return ref.path, ref.raw_offset, ref.nbytes
    raise AutodiceError(f'{ref.path}: initializer "{ref.name}" stores typed data, not raw_data, '
                        f"and is too large to write inline; re-export the model with raw_data")


def read_array(ref: TensorRef):
    """One initializer's values as a numpy array (a weight that a rewrite must slice)."""
    import numpy as np
    from onnx import numpy_helper

    if ref.raw_offset is not None or ref.external:
        src, offset, length = payload_source(ref)
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
