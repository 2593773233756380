"""A whole model as a program: buffers, weights and a sequence of kernel calls.

Frontends that read graphs (ONNX) produce a :class:`Program`; code generation turns it
into one C library (``init`` / ``run`` / ``free``) whose ``run`` calls one generated
kernel function per :class:`Step`, in order, with the step's buffers as arguments.

* **buffer**: a tensor of the model with a static shape. Its ``kind`` says where its
  storage comes from: ``"input"`` / ``"output"`` (the caller's pointers), ``"weight"``
  (the weights file loaded by ``init``) or ``"temp"`` (the run's arena).
* **step**: one kernel (every size constant) applied to buffers; ``args`` names the
  buffer of each of ``kernel.inputs + kernel.outputs``, in that order.
* **alias**: ``(view, base)``: ``view`` is ``base`` with another shape (a Reshape,
  Flatten, Squeeze, Unsqueeze, Identity...): same elements, same storage, no code.
* **extent**: an output whose extent along one axis depends on the data (NonZero,
  Unique...) is computed at its bound; another output, an int64 scalar, counts its
  valid entries along that axis (:attr:`Program.extents`).
* **check**: an :class:`IndexCheck`: before (or after) a step, every element of an
  integer buffer must lie in a range -- the indices a Gather reads at run time -- or the
  run stops with an error that names the node (``<model>_run`` returns 4, the message
  is ``<model>_last_error()``). The kernels themselves clamp such indices, so they
  never read out of bounds whatever the check finds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import Kernel

BUFFER_KINDS = ("input", "output", "weight", "temp")


@dataclass(frozen=True)
class Buffer:
    name: str  # the model's own name (code generation sanitises it)
    dtype: str  # a polyc dtype: float32, float64, int32, int64, bool
    shape: tuple[int, ...]
    kind: str = "temp"

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, eq=False)
class Step:
    kernel: Kernel
    args: tuple[str, ...]
    #: the model nodes lowered into this step (names), for messages and progress
    origin: tuple[str, ...] = ()


@dataclass(frozen=True)
class IndexCheck:
    """Every element of the integer buffer ``buffer`` must lie in ``[low, high]``; the
    check runs right before step ``step`` (right after it when ``after_step``: the
    buffer is computed by that step). A failure stops the run with the message
    ``prefix + "<value> at [<i>, <j>, ...]" + suffix`` (the value and its position in
    ``buffer``)."""
    step: int
    buffer: str
    low: int
    high: int
    prefix: str
    suffix: str
    after_step: bool = False
    #: one more value allowed outside the range (a loss's ``ignore_index``)
    allowed: int | None = None

    def failing(self, value: str) -> str:
        """C: whether ``value`` (an expression) breaks the check (0 or 1, branch-free)."""
        out = f"((int64_t){value} < INT64_C({self.low})) | ((int64_t){value} > " \
              f"INT64_C({self.high}))"
        if self.allowed is not None:
            out = f"(({out}) & ((int64_t){value} != INT64_C({self.allowed})))"
        return out


@dataclass(frozen=True, eq=False)
class Program:
    name: str
    buffers: tuple[Buffer, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    weights: tuple[tuple[str, np.ndarray], ...]
    steps: tuple[Step, ...]
    aliases: tuple[tuple[str, str], ...] = ()
    #: run-time checks of index values (see :class:`IndexCheck`), in step order
    checks: tuple[IndexCheck, ...] = ()
    #: ``(output, axis, count)``: ``output``'s extent along ``axis`` depends on the data
    #: -- it is computed at its largest, and the int64 scalar output ``count`` says how
    #: many entries along that axis are valid (the rest are zeros)
    extents: tuple[tuple[str, int, str], ...] = ()

    def counts(self) -> frozenset[str]:
        """The outputs that are counts of other outputs (see :attr:`extents`)."""
        return frozenset(c for _, _, c in self.extents)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def weight(self, name: str) -> np.ndarray:
        for n, v in self.weights:
            if n == name:
                return v
        raise KeyError(name)

    def root(self, name: str) -> str:
        """The buffer whose storage ``name`` uses (following aliases)."""
        return alias_root(self.aliases, name)


def alias_root(aliases: tuple[tuple[str, str], ...] | list[tuple[str, str]], name: str) -> str:
    """Follow ``(view, base)`` aliases from ``name`` to the buffer that owns the storage."""
    bases = dict(aliases)
    seen = set()
    while name in bases and name not in seen:
        seen.add(name)
        name = bases[name]
    return name
