"""The weights file of a compiled model: its layout, writer and reader (Python side).

A model's weights are never C initializers (a 100 MB model would take minutes to
compile): they go to one binary file that ``<model>_init`` reads into one 64-byte
aligned allocation. Layout (little-endian)::

    offset 0    char     magic[8]        "POLYCWTS"
           8    uint32   version         1
          12    uint32   count           number of tensors
          16    uint64   layout_hash     FNV-1a 64 of the tensor list (names, dtypes,
                                         shapes, offsets); compiled into the library
          24    uint64   data_bytes      size of the data region
          32    uint64   data_offset     where the data region starts (= header_bytes)
          40    uint8    reserved[24]    zero
          64    table: count entries of 4 x uint64
                    offset      of the tensor in the data region (a multiple of 64)
                    nbytes      its size in bytes (elements x itemsize)
                    sum1, sum2  Fletcher-style checksum of its padded bytes
                                (64-bit words w_0..w_n-1: sum1 = sum w_i,
                                sum2 = sum (n - i) w_i, both modulo 2^64)
          data_offset (a multiple of 64): the tensors, row-major, each at its offset,
                    zero padding up to the next multiple of 64

The file is exactly ``data_offset + data_bytes`` long. ``init`` refuses a file whose
magic, version, count, layout hash, sizes, offsets or checksums differ from what the
library was compiled with.
"""
from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from polyc.errors import PolycError

from .memplan import ALIGN, round_up

MAGIC = b"POLYCWTS"
VERSION = 1
HEADER = struct.Struct("<8sIIQQQ24x")
ENTRY = struct.Struct("<QQQQ")
_CHUNK = 1 << 20  # words per checksum chunk (bounds the temporary arrays)


class WeightsError(PolycError, ValueError):
    """A weights file is missing, truncated, corrupt or belongs to another model."""


@dataclass(frozen=True)
class WeightSlot:
    """One tensor of the weights file."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int  # in the data region
    nbytes: int


@dataclass(frozen=True)
class WeightsLayout:
    slots: tuple[WeightSlot, ...]
    data_bytes: int
    layout_hash: int

    @property
    def header_bytes(self) -> int:
        return round_up(HEADER.size + ENTRY.size * len(self.slots), ALIGN)

    @property
    def file_bytes(self) -> int:
        return self.header_bytes + self.data_bytes


def plan_weights(tensors: Sequence[tuple[str, str, tuple[int, ...]]]) -> WeightsLayout:
    """Offsets of ``(name, dtype, shape)`` tensors, in order, each 64-byte aligned."""
    slots, cursor = [], 0
    for name, dtype, shape in tensors:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        slots.append(WeightSlot(name, dtype, tuple(shape), cursor, nbytes))
        cursor += round_up(max(nbytes, 1))
    text = ";".join(f"{s.name}:{s.dtype}:{','.join(map(str, s.shape))}@{s.offset}"
                    for s in slots)
    return WeightsLayout(tuple(slots), cursor, fnv1a64(text.encode()))


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def checksum(padded: np.ndarray) -> tuple[int, int]:
    """(sum1, sum2) of a byte array whose length is a multiple of 8 (see the module doc)."""
    words = padded.view("<u8")
    n = len(words)
    s1 = s2 = np.uint64(0)
    with np.errstate(over="ignore"):
        for start in range(0, n, _CHUNK):
            chunk = words[start:start + _CHUNK]
            weights = np.arange(n - start, n - start - len(chunk), -1, dtype=np.uint64)
            s1 += chunk.sum(dtype=np.uint64)
            s2 += (chunk * weights).sum(dtype=np.uint64)
    return int(s1), int(s2)


def weights_bytes(layout: WeightsLayout, values: Sequence[np.ndarray]) -> bytes:
    """The whole file for ``values`` (one array per slot, in order)."""
    data = np.zeros(layout.data_bytes, np.uint8)
    table = []
    for slot, value in zip(layout.slots, values, strict=True):
        arr = np.asarray(value, dtype=slot.dtype, order="C")
        if arr.shape != slot.shape:
            raise PolycError(f"weight {slot.name!r}: value of shape {arr.shape}, "
                             f"expected {slot.shape}")
        raw = arr.reshape(-1).view(np.uint8)
        data[slot.offset:slot.offset + slot.nbytes] = raw
        padded = data[slot.offset:slot.offset + round_up(max(slot.nbytes, 1))]
        table.append(ENTRY.pack(slot.offset, slot.nbytes, *checksum(padded)))
    head = HEADER.pack(MAGIC, VERSION, len(layout.slots), layout.layout_hash,
                       layout.data_bytes, layout.header_bytes)
    header = (head + b"".join(table)).ljust(layout.header_bytes, b"\0")
    return header + data.tobytes()


def digest(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()[:32]


def check_weights_file(path: str, layout: WeightsLayout) -> None:
    """Raise :class:`WeightsError` saying what is wrong with ``path`` (header and size
    only: the checksums are verified by ``init`` in C)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
    except OSError as e:
        raise WeightsError(f"cannot read the weights file {path!r}: {e.strerror}") from None
    where = f"weights file {path!r}"
    if len(head) < HEADER.size:
        raise WeightsError(f"{where} is truncated ({size} bytes, expected "
                           f"{layout.file_bytes})")
    magic, version, count, lhash, data_bytes, data_offset = HEADER.unpack(head)
    if magic != MAGIC:
        raise WeightsError(f"{where} is not a polyc weights file (magic {magic!r})")
    if version != VERSION:
        raise WeightsError(f"{where} has format version {version}, expected {VERSION}")
    if (count, lhash, data_bytes, data_offset) != (
            len(layout.slots), layout.layout_hash, layout.data_bytes, layout.header_bytes):
        raise WeightsError(f"{where} belongs to another model (its tensor layout differs)")
    if size != layout.file_bytes:
        raise WeightsError(f"{where} has {size} bytes, expected {layout.file_bytes} "
                           "(truncated or padded)")
