"""The element types polyc compiles: one table for every layer.

Each dtype has a name (numpy's spelling; ``bfloat16`` as ml_dtypes spells it), a kind
(``b`` bool, ``i`` signed, ``u`` unsigned, ``f`` floating point), a width, the C type it
is stored in and the dtype its arithmetic is done in:

* ``float16`` and ``bfloat16`` are stored as such and computed in float32: a read widens
  to float, a write rounds to nearest even (branch-free bit operations, which gcc
  vectorizes; it does not vectorize C's ``_Float16`` conversions without AVX512-FP16);
* the float8 types and float4e2m1 are stored as their codes (one per byte, as
  ml_dtypes holds them) and converted through tables: a read is a table lookup, a write
  rounds to nearest even and overflows to infinity or NaN as ml_dtypes does (ONNX's
  saturating Cast clamps first);
* ``int8``, ``int16``, ``uint8``, ``uint16`` are computed in 32 bits (no C integer
  promotion can overflow) and wrapped back to their width after each operation, as numpy
  and ONNX do; ``int4``, ``uint4``, ``int2``, ``uint2`` likewise, one per byte;
* the others compute in themselves.

The order of :data:`ORDER` is the promotion lattice of :func:`polyc.expr.promote`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class DType:
    name: str
    kind: str      # "b", "i", "u", "f"
    bits: int
    ctype: str     # the C type of stored elements
    compute: str   # the dtype arithmetic is done in
    tc: str        # the TC language's spelling

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"

    @property
    def storage_only(self) -> bool:
        """Stored in a narrower type than its arithmetic (float16, bfloat16)."""
        return self.kind == "f" and self.compute != self.name

    @property
    def limits(self) -> tuple[int, int]:
        """(min, max) of an integer dtype."""
        if self.kind == "u":
            return 0, 2 ** self.bits - 1
        if self.kind == "i":
            return -2 ** (self.bits - 1), 2 ** (self.bits - 1) - 1
        raise ValueError(f"{self.name} is not an integer dtype")

    @cached_property
    def numpy(self) -> Any:
        import numpy as np
        if self.name in _ML_DTYPES:
            import ml_dtypes
            return np.dtype(getattr(ml_dtypes, _ML_DTYPES[self.name]))
        return np.dtype(self.name)

    @property
    def minifloat(self) -> bool:
        """A float of 8 bits or fewer: stored as its code, converted through tables."""
        return self.kind == "f" and self.bits <= 8


_TABLE = (
    DType("bool", "b", 8, "bool", "bool", "bool"),
    DType("int2", "i", 2, "int8_t", "int32", "int2"),
    DType("uint2", "u", 2, "uint8_t", "uint32", "uint2"),
    DType("int4", "i", 4, "int8_t", "int32", "int4"),
    DType("uint4", "u", 4, "uint8_t", "uint32", "uint4"),
    DType("int8", "i", 8, "int8_t", "int32", "int8"),
    DType("uint8", "u", 8, "uint8_t", "uint32", "uint8"),
    DType("int16", "i", 16, "int16_t", "int32", "int16"),
    DType("uint16", "u", 16, "uint16_t", "uint32", "uint16"),
    DType("int32", "i", 32, "int32_t", "int32", "int32"),
    DType("uint32", "u", 32, "uint32_t", "uint32", "uint32"),
    DType("int64", "i", 64, "int64_t", "int64", "int64"),
    DType("uint64", "u", 64, "uint64_t", "uint64", "uint64"),
    DType("float4e2m1", "f", 4, "uint8_t", "float32", "float4e2m1"),
    DType("float8e4m3fn", "f", 8, "uint8_t", "float32", "float8e4m3fn"),
    DType("float8e4m3fnuz", "f", 8, "uint8_t", "float32", "float8e4m3fnuz"),
    DType("float8e5m2", "f", 8, "uint8_t", "float32", "float8e5m2"),
    DType("float8e5m2fnuz", "f", 8, "uint8_t", "float32", "float8e5m2fnuz"),
    DType("float16", "f", 16, "uint16_t", "float32", "float16"),
    DType("bfloat16", "f", 16, "uint16_t", "float32", "bfloat16"),
    DType("float32", "f", 32, "float", "float32", "float"),
    DType("float64", "f", 64, "double", "float64", "double"),
)

#: the dtypes numpy has through ml_dtypes (which onnx depends on), by ml_dtypes' name
_ML_DTYPES = {"bfloat16": "bfloat16", "int2": "int2", "uint2": "uint2", "int4": "int4",
              "uint4": "uint4", "float4e2m1": "float4_e2m1fn",
              "float8e4m3fn": "float8_e4m3fn", "float8e4m3fnuz": "float8_e4m3fnuz",
              "float8e5m2": "float8_e5m2", "float8e5m2fnuz": "float8_e5m2fnuz"}

#: every dtype by name
BY_NAME: dict[str, DType] = {d.name: d for d in _TABLE}
#: dtype names in promotion order (bool < ... < float64)
ORDER: tuple[str, ...] = tuple(d.name for d in _TABLE)
FLOATS: tuple[str, ...] = tuple(d.name for d in _TABLE if d.is_float)
INTS: tuple[str, ...] = tuple(d.name for d in _TABLE if d.is_int)
SIGNED: tuple[str, ...] = tuple(d.name for d in _TABLE if d.kind == "i")
#: TC spellings (and aliases) of each dtype
TC_NAMES: dict[str, str] = {**{d.tc: d.name for d in _TABLE}, **{d.name: d.name for d in _TABLE},
                            "half": "float16", "byte": "uint8"}


def get(name: str) -> DType:
    return BY_NAME[name]


def itemsize(name: str) -> int:
    return BY_NAME[name].itemsize


def numpy_dtype(name: str) -> Any:
    return BY_NAME[name].numpy


def finite_max(name: str) -> float:
    """The largest finite value of a floating-point dtype."""
    import ml_dtypes  # its finfo knows numpy's floats and its own
    return float(ml_dtypes.finfo(numpy_dtype(name)).max)


def from_numpy(dtype: Any) -> str | None:
    """polyc's name for a numpy dtype, None if polyc has no such dtype."""
    import numpy as np
    dt = np.dtype(dtype)
    for d in _TABLE:
        if d.numpy == dt:
            return d.name
    return None
