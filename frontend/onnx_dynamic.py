"""Tensors whose extent along one axis depends on the data.

NonZero, Compress (with a condition known only at run time), Unique and
NonMaxSuppression make outputs whose length is only known once the data is: how many
elements are non-zero, how many boxes survive. polyc compiles static shapes, so such an
output gets the extent it can at most have (its *bound*: every element non-zero, every
element distinct, ``min(max_output_boxes_per_class, boxes)`` boxes kept per class), and
the node computes one more output, its *count*: an int64 scalar, the number of valid
entries along that axis. The entries past the count are padding (zeros out of the
op itself; downstream, whatever the ops make of zeros -- integer division by them is 0,
never a trap).

The importer gives each such node its count output (:func:`with_count`); its lowering
writes the count. Downstream, an op that maps entries to entries along that axis keeps
the meaning (elementwise ops and Cast, Transpose, a Gather indexed by the tensor or
gathering along another axis, Squeeze/Unsqueeze/Slice away from it): its output is
dynamic along the corresponding axis with the same count (:func:`propagate`). Any other
reader (a reduction over that axis, Shape, Reshape, a MatMul contracting it) would see
the padding, and is refused with its name.

A dynamic graph output keeps its bound in the compiled library, and its count becomes
one more output (:attr:`polyc.program.Program.extents`); the Python API cuts the array
to its count, and the C header says which output counts which.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .onnx_graph import Graph, Node, UnsupportedOpError

#: op -> (its number of outputs in ONNX, {output index: dynamic axis(node, rank)})
_OUTPUTS = {"NonZero": 1, "Compress": 1, "Unique": 4, "NonMaxSuppression": 1}
DATA_DEPENDENT_OPS = frozenset(_OUTPUTS)


@dataclass(frozen=True)
class Extent:
    """``tensor`` is valid along ``axis`` up to the int64 scalar ``count`` (computed by
    node ``source``)."""
    axis: int
    count: str
    source: str


def is_data_dependent(node: Node, const_of: Callable[[str], Any]) -> bool:
    """Whether ``node``'s output sizes depend on its input values (a Compress with a
    constant condition does not)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in _OUTPUTS:
        return False
    if node.op_type == "Compress":
        return len(node.inputs) < 2 or const_of(node.inputs[1]) is None
    return True


def dynamic_axes(node: Node) -> dict[int, int]:
    """Output index -> the axis along which it is dynamic, for a data-dependent node."""
    op = node.op_type
    if op == "NonZero":
        return {0: 1}
    if op == "NonMaxSuppression":
        return {0: 0}
    axis = node.attr("axis")
    if op == "Compress":
        return {0: 0 if axis is None else int(axis)}  # negative: normalised by the caller
    return {0: 0 if axis is None else int(axis), 1: 0, 3: 0}  # Unique


def with_count(node: Node, taken: Callable[[str], bool]) -> Node:
    """``node`` (data-dependent) with its omitted outputs spelled ``""`` and its count
    output appended (a fresh tensor name)."""
    outs = list(node.outputs) + [""] * (_OUTPUTS[node.op_type] - len(node.outputs))
    first = next((o for o in outs if o), node.name)
    base = f"{first}_count"
    name, k = base, 1
    while taken(name):
        name, k = f"{base}_{k}", k + 1
    return Node(node.name, node.op_type, node.inputs, tuple(outs) + (name,), node.attrs,
                node.domain)


def count_of(node: Node) -> str | None:
    """The count output of a data-dependent node given one by :func:`with_count`."""
    n = _OUTPUTS.get(node.op_type)
    if n is None or len(node.outputs) != n + 1:
        return None
    return node.outputs[-1]


def _elementwise() -> frozenset[str]:
    from .onnx_passes import ELEMENTWISE_OPS
    # their parameters align on axis 1 (the quantizers: on their own axis)
    return ELEMENTWISE_OPS - {"BatchNormalization", "PolycRequantize", "QuantizeLinear",
                              "DequantizeLinear"}


def propagate(node: Node, dyn: Mapping[str, Extent],
              shape_of: Callable[[str], tuple[int, ...]],
              const_of: Callable[[str], Any]) -> dict[str, Extent]:
    """The extents of ``node``'s outputs given those of its inputs (``dyn``); raises
    :class:`UnsupportedOpError` where the node would read past a dynamic tensor's count
    or mix two counts."""
    ins = [(i, x, dyn[x]) for i, x in enumerate(node.inputs) if x and x in dyn]
    if not ins:
        return {}
    op = node.op_type
    i0, x0, e0 = ins[0]

    def refuse(why: str) -> UnsupportedOpError:
        return UnsupportedOpError(
            f"node {node.name!r} ({op}) reads {x0!r}, whose extent along axis {e0.axis} "
            f"depends on the data (computed by node {e0.source!r}): {why}. polyc computes "
            f"such a tensor at its largest size with a run-time count; it can flow only "
            f"through elementwise ops, Cast, Transpose, Gather, Slice, Squeeze and "
            f"Unsqueeze that keep its entries apart, into graph outputs")

    def out(axis: int, *names: str) -> dict[str, Extent]:
        return {o: Extent(axis, e0.count, e0.source) for o in (names or node.outputs) if o}

    if op == "CastLike":  # its second input only gives the type
        ins = [t for t in ins if t[0] == 0]
        if not ins:
            return {}
    if any(e.count != e0.count for _, _, e in ins):
        raise refuse("it combines tensors of two different data-dependent counts")
    if op in _elementwise() or op in ("Identity", "Dropout"):
        data = node.inputs[:1] if op == "CastLike" else node.inputs
        rank = max(len(shape_of(x)) for x in data if x)
        axes = {rank - len(shape_of(x)) + e.axis for _, x, e in ins}
        if len(axes) != 1:
            raise refuse("its dynamic inputs are dynamic along different axes")
        axis = axes.pop()
        for i, x in enumerate(node.inputs):
            if not x or x in dyn or (op == "CastLike" and i == 1):
                continue
            s = shape_of(x)
            d = axis - (rank - len(s))
            if d >= 0 and s[d] != 1:
                raise refuse(f"it broadcasts against {x!r} of shape {list(s)}, which is "
                             f"not 1 along that axis")
        return out(axis)
    if op == "Transpose":
        rank = len(shape_of(x0))
        perm = list(node.attr("perm", list(reversed(range(rank)))))
        return out(perm.index(e0.axis))
    if op == "Gather":
        data, ind = node.inputs[0], node.inputs[1]
        rank = len(shape_of(data))
        axis = int(node.attr("axis", 0))
        axis = axis + rank if axis < 0 else axis
        if data in dyn and ind in dyn:
            raise refuse("both its data and its indices are dynamic")
        if ind in dyn:
            return out(axis + dyn[ind].axis)
        if e0.axis == axis:
            raise refuse("it gathers along the dynamic axis (an index past the count "
                         "would read padding)")
        return out(e0.axis if e0.axis < axis else e0.axis + len(shape_of(ind)) - 1)
    if op in ("Squeeze", "Unsqueeze"):
        rank_in = len(shape_of(x0))
        axes = node.attr("axes")
        if axes is None and len(node.inputs) > 1 and node.inputs[1]:
            axes = const_of(node.inputs[1])
        if axes is None:
            if op == "Unsqueeze":
                raise refuse("its axes are not constant")
            axes = [d for d, n in enumerate(shape_of(x0)) if n == 1]
        rank_out = rank_in + (np.asarray(axes).size if op == "Unsqueeze" else 0)
        r = rank_in if op == "Squeeze" else rank_out
        axes = sorted(int(a) + r if int(a) < 0 else int(a) for a in np.asarray(axes).reshape(-1))
        if op == "Squeeze":
            if e0.axis in axes:
                raise refuse("it squeezes the dynamic axis")
            return out(e0.axis - sum(a < e0.axis for a in axes))
        kept = [d for d in range(rank_out) if d not in axes]
        return out(kept[e0.axis])
    if op == "Slice" and i0 == 0:
        rank = len(shape_of(x0))
        given = [x for x in node.inputs[1:]]
        if given:  # opset 10 on: starts, ends, axes, steps are inputs
            starts = const_of(given[0]) if given[0] else None
            axes = const_of(given[2]) if len(given) > 2 and given[2] else (
                None if starts is None else range(np.asarray(starts).size))
        else:
            axes = node.attr("axes", range(len(node.attr("starts", []))))
        if axes is None:
            raise refuse("its axes are not constant")
        axes = [int(a) + rank if int(a) < 0 else int(a) for a in np.asarray(list(axes)).reshape(-1)]
        if e0.axis in axes:
            raise refuse("it slices the dynamic axis")
        return out(e0.axis)
    raise refuse(f"{op} is not one of them")


def dynamic_extents(graph: Graph) -> dict[str, Extent]:
    """Every tensor of ``graph`` whose extent depends on the data, with its count
    (refusing a node that would read past a count: see :func:`propagate`)."""
    dyn: dict[str, Extent] = {}

    def shape_of(t: str) -> tuple[int, ...]:
        return tuple(graph.tensors[t].shape)

    for n in graph.nodes:
        dyn.update(propagate(n, dyn, shape_of, graph.constants.get))
        dyn.update(made_extents(n, shape_of))
    return dyn


def made_extents(node: Node, shape_of: Callable[[str], tuple[int, ...]]) -> dict[str, Extent]:
    """The extents a data-dependent node (one given its count) makes: its dynamic
    outputs, each along its (normalised) axis."""
    count = count_of(node)
    if count is None:
        return {}
    out = {}
    for k, axis in dynamic_axes(node).items():
        o = node.outputs[k]
        if o:
            out[o] = Extent(axis % max(len(shape_of(o)), 1), count, node.name)
    return out
