"""The ONNX graph as polyc sees it, and the contract of op lowerings.

:class:`Graph` is a frozen, static-shaped copy of an ONNX graph (after onnx's shape
inference): nodes in topological order, every tensor's dtype and shape, constant
values. Graph passes (``onnx_passes``) map Graph -> Graph.

An op lowering is a function registered with :func:`register` for one or more ONNX
op types::

    @register("Relu")
    def relu(node: Node, ctx: LowerContext) -> Lowered:
        y, x = ctx.name(node.outputs[0]), ctx.name(node.inputs[0])
        idx = ctx.indices(ctx.rank(node.outputs[0]))
        return Lowered([f"{y}({idx}) = fmax({x}({idx}), 0.0)"])

It returns TC-language statements (see shared TC_LANGUAGE.md) that compute the node's
outputs from its inputs, using the TC names given by ``ctx.name``; or, for ops that only
re-view their input (Reshape, Squeeze...), a :class:`View`. The statements of the nodes
of one fusion group are joined into one ``def`` whose inputs, outputs and temporaries
follow from use, and that def goes through the same TC frontend, dependence analysis,
scheduler and code generator as every operator.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyc import dtypes as D
from polyc.errors import CompileError
from polyc.program import IndexCheck


class UnsupportedOpError(CompileError):
    """An ONNX node polyc cannot lower: names the node, its op type and what is supported."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # polyc dtype
    shape: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Node:
    name: str  # never empty: the importer names anonymous nodes "<op_type>_<index>"
    op_type: str
    inputs: tuple[str, ...]  # "" for an omitted optional input
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)  # ints, floats, str, lists, ndarrays
    domain: str = ""

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


@dataclass(frozen=True, eq=False)
class Graph:
    name: str
    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]  # graph inputs that are not initializers
    outputs: tuple[str, ...]
    tensors: Mapping[str, TensorInfo]  # every tensor: inputs, outputs, intermediates, constants
    constants: Mapping[str, np.ndarray]  # initializers and folded constants
    opset: int = 17


@dataclass(frozen=True)
class Lowered:
    """TC statements computing a node's outputs (names from ``LowerContext.name``).

    ``checks``: run-time checks of index values the statements read (a Gather's
    runtime indices), each a :class:`polyc.program.IndexCheck` whose ``buffer`` is a
    graph tensor (its ``step`` is filled in by the lowering driver)."""
    statements: tuple[str, ...] | list[str]
    checks: tuple[IndexCheck, ...] = ()
    #: ``(iterator, first, last)``: statements ``first..last`` (indices into
    #: ``statements``) share their outer loop ``iterator`` -- at each of its values they
    #: run in order (a recurrence over time); TC itself runs statements one after another
    loops: tuple[tuple[str, int, int], ...] = ()
    #: statements that only declare a temporary for TC (read before the statement that
    #: computes it, in a shared loop): dropped from the kernel
    scaffold: tuple[int, ...] = ()
    #: ``(temporary, k)``: a temporary indexed first by a shared loop's iterator whose
    #: steps read only the last ``k`` steps' values: stored in ``k`` slots (see
    #: :func:`polyc.rewrite.fold_storage`)
    folds: tuple[tuple[str, int], ...] = ()
    #: temporaries written at each step of a shared loop whose 0 ends the loop after
    #: that step: the lowering promises that the later steps would change nothing read
    #: after the loop (:attr:`polyc.ir.Kernel.exits`)
    exits: tuple[str, ...] = ()


@dataclass(frozen=True)
class View:
    """The output is the input with another shape (same row-major elements, no code)."""
    output: str
    input: str


LowerFn = Callable[[Node, "LowerContext"], "Lowered | View"]
REGISTRY: dict[str, LowerFn] = {}


def register(*op_types: str) -> Callable[[LowerFn], LowerFn]:
    def deco(fn: LowerFn) -> LowerFn:
        for op in op_types:
            REGISTRY[op] = fn
        return fn
    return deco


def supported_ops() -> list[str]:
    """Every op type with a lowering (the op modules are imported first)."""
    from .onnx_lower import load_lowerings
    load_lowerings()
    return sorted(REGISTRY)


_TC_DTYPE = {d.name: d.tc for d in D.BY_NAME.values()}


class LowerContext:
    """What a lowering may ask about the graph, and fresh TC names.

    One context serves one fusion group; names it hands out are unique in the group's def.
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self._names: dict[str, str] = {}
        self._views: dict[str, tuple[str, tuple[int, ...]]] = {}
        self._used: set[str] = set()
        self._counter = 0

    # -- tensors -------------------------------------------------------------------------
    def info(self, tensor: str) -> TensorInfo:
        return self.graph.tensors[tensor]

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self.graph.tensors[tensor].shape

    def rank(self, tensor: str) -> int:
        return len(self.graph.tensors[tensor].shape)

    def dtype(self, tensor: str) -> str:
        return self.graph.tensors[tensor].dtype

    def tc_type(self, tensor: str) -> str:
        """``float(1,3,224,224)`` for a declaration."""
        info = self.info(tensor)
        dims = ",".join(str(d) for d in info.shape)
        return f"{_TC_DTYPE[info.dtype]}({dims})" if dims else _TC_DTYPE[info.dtype]

    def const(self, tensor: str) -> np.ndarray | None:
        """The value of a constant tensor (initializer or folded), else None."""
        if not tensor:
            return None
        return self.graph.constants.get(tensor)

    def name(self, tensor: str) -> str:
        """The TC identifier of a graph tensor (stable within this context)."""
        if tensor not in self._names:
            base = "t_" + re.sub(r"\W", "_", tensor, flags=re.ASCII)
            self._names[tensor] = self._fresh(base)
        return self._names[tensor]

    def tensor_of(self, tc_name: str) -> str | None:
        for t, n in self._names.items():
            if n == tc_name:
                return t
        return None

    def named_tensors(self) -> dict[str, str]:
        return dict(self._names)

    def view(self, tensor: str, shape: Sequence[int]) -> str:
        """A TC name that reads ``tensor`` (a group input) with another ``shape`` of the
        same row-major elements: the kernel gets a second parameter bound to the same
        buffer (a 1x1 convolution reads ``(N, C, H, W)`` as ``(N, C, H*W)``)."""
        info = self.info(tensor)
        if int(np.prod(shape)) != int(np.prod(info.shape)):
            raise ValueError(f"view {list(shape)} of {tensor!r} {list(info.shape)}")
        name = self._fresh("w_" + re.sub(r"\W", "_", tensor, flags=re.ASCII))
        self._views[name] = (tensor, tuple(int(d) for d in shape))
        return name

    def views(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """TC name -> (graph tensor, shape) of every :meth:`view` handed out."""
        return dict(self._views)

    def view_type(self, tc_name: str) -> str:
        tensor, shape = self._views[tc_name]
        return f"{_TC_DTYPE[self.dtype(tensor)]}({','.join(map(str, shape))})"

    # -- fresh names ---------------------------------------------------------------------
    def temp(self, hint: str = "tmp") -> str:
        """A fresh name for a temporary tensor of a lowering."""
        return self._fresh("v_" + re.sub(r"\W", "_", hint, flags=re.ASCII))

    def indices(self, rank: int, prefix: str = "i") -> str:
        """``"i0, i1, i2"``: index names for a rank (comma-joined, as TC writes them)."""
        return ", ".join(f"{prefix}{d}" for d in range(rank))

    def _fresh(self, base: str) -> str:
        name, n = base, 0
        while name in self._used:
            n += 1
            name = f"{base}_{n}"
        self._used.add(name)
        return name


def literal(value: float | int | bool, dtype: str) -> str:
    """A TC literal of ``value`` in ``dtype`` (``1.0``, ``-inf`` as ``(-1.0/0.0)``...)."""
    if dtype == "bool":
        return "1" if value else "0"
    if dtype in D.INTS:
        return str(int(value))
    v = float(value)
    if np.isnan(v):
        return "(0.0/0.0)"
    if np.isinf(v):
        return "(1.0/0.0)" if v > 0 else "(-1.0/0.0)"
    text = repr(v)
    return text if ("e" in text or "." in text) else text + ".0"
