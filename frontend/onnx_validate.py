"""Validation of an ONNX model before any code exists.

onnx's checker and shape inference do not catch everything that would make polyc
generate wrong code: shape inference is run leniently (its strict mode rejects many
valid models) and then keeps the shapes a model declares even where they contradict
the ops (a Reshape of 6 elements to ``[4, 4]``, a MatMul of ``[2, 3]`` by ``[4, 5]``),
and a bad model may leave a tensor with no shape at all (an unclear error later) or
with a negative extent (a Conv whose kernel is larger than its padded input).

This module recomputes, from each op's semantics, what its inputs allow and what shape
each output must have, and compares the result with the shapes the graph holds (the
model's declarations, else onnx's inference):

* :func:`check_opsets`: the default domain's opset must be one polyc implements
  (:data:`MAX_OPSET`, the newest of onnx 1.23); a non-standard domain that nodes use is
  refused with its version;
* :func:`check_declared_dims`: no negative extent in a declared shape, and a graph
  input that also has an initializer declares the initializer's shape;
* :func:`expected_outputs` / :func:`check_outputs`: per node (the importer calls them
  for each node, in order, before the node's outputs are looked at): Reshape element
  counts (``0`` and ``-1`` per the spec, ``allowzero``), every view's element count,
  MatMul / Gemm inner dimensions (``transA`` / ``transB``), broadcasting of elementwise
  ops, Conv / ConvTranspose / pool windows against the padded input (dilations,
  strides, ``auto_pad``, ``ceil_mode``), channel and group counts, Concat axes and
  non-axis extents, axes of Gather / GatherElements / GatherND / Split / Slice /
  Transpose / Squeeze / Unsqueeze / Flatten / Softmax / reductions / ArgMax in range,
  constant indices in range, Split sizes, Pad / Tile / Expand results.

The per-op rules are in :mod:`.onnx_shape_rules`. Every failure is an
:class:`OnnxValidationError` (a :class:`polyc.errors.SemanticError`)
naming the node (name and op type), the tensors and their shapes, e.g.
``node 'reshape_1' (Reshape): cannot reshape 'x' of shape [2, 3] (6 elements) to [4, 4]
(16 elements)``. Ops this module does not know are not checked here (their lowering
still checks what it relies on).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from polyc.errors import UnsupportedError

from .onnx_graph import Node, UnsupportedOpError
from .onnx_shape_rules import RULES, OnnxValidationError, Shape, element_count, NodeView, fmt

#: the newest default-domain (ai.onnx) opset polyc implements and is tested with: that
#: of onnx 1.23 (``onnx.defs.onnx_opset_version()`` there)
MAX_OPSET = 28
STANDARD_DOMAINS = ("", "ai.onnx")


class UnsupportedOpsetError(UnsupportedOpError, UnsupportedError):
    """The model imports an opset (or a domain) newer than, or other than, those
    polyc implements."""


# -- model-level checks ---------------------------------------------------------------

def check_opsets(proto: onnx.ModelProto, where: str) -> None:
    """Refuse a default-domain opset newer than :data:`MAX_OPSET`, and any other
    domain that a node uses (named with its imported version)."""
    used = {n.domain for n in proto.graph.node}
    versions = {o.domain: int(o.version) for o in proto.opset_import}
    for domain, version in versions.items():
        if domain in STANDARD_DOMAINS and version > MAX_OPSET:
            raise UnsupportedOpsetError(
                f"{where} imports the default ONNX domain (ai.onnx) at opset {version}; "
                f"polyc implements opsets up to {MAX_OPSET} (onnx 1.23): convert the model "
                f"to opset {MAX_OPSET} or lower (onnx.version_converter)")
    bad = sorted(d for d in used if d not in STANDARD_DOMAINS)
    if bad:
        nodes = [n for n in proto.graph.node if n.domain not in STANDARD_DOMAINS]
        listed = "; ".join(f"node {n.name or n.op_type!r} ({n.domain}.{n.op_type})"
                           for n in nodes[:20])
        more = f" and {len(nodes) - 20} more" if len(nodes) > 20 else ""
        doms = ", ".join(f"{d!r} (opset {versions[d]})" if d in versions
                         else f"{d!r} (not imported)" for d in bad)
        raise UnsupportedOpsetError(
            f"custom op domains are not supported: {listed}{more}; the model uses the "
            f"domain(s) {doms}, and polyc implements only the default ONNX domain "
            f"(ai.onnx, opsets up to {MAX_OPSET})")


def _declared(vi: onnx.ValueInfoProto) -> list[int | None] | None:
    t = vi.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return [int(d.dim_value) if d.HasField("dim_value") else None
            for d in t.tensor_type.shape.dim]


def check_declared_dims(proto: onnx.ModelProto, where: str) -> None:
    """No negative extent in any declared shape (inputs, value_info, outputs,
    initializers); a graph input with an initializer declares the initializer's shape."""
    g = proto.graph
    for kind, infos in (("graph input", g.input), ("graph output", g.output),
                        ("value_info", g.value_info)):
        for vi in infos:
            dims = _declared(vi)
            if dims and any(d is not None and d < 0 for d in dims):
                shown = "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
                raise OnnxValidationError(
                    f"{where}: {kind} {vi.name!r} declares the shape {shown}, with a "
                    f"negative dimension")
    inits = {}
    for t in g.initializer:
        if any(d < 0 for d in t.dims):
            raise OnnxValidationError(f"{where}: initializer {t.name!r} has the shape "
                                      f"{fmt(t.dims)}, with a negative dimension")
        inits[t.name] = list(t.dims)
    for vi in g.input:
        dims = _declared(vi)
        if vi.name in inits and dims is not None:
            have = inits[vi.name]
            if len(dims) != len(have) or any(d is not None and d != h
                                             for d, h in zip(dims, have)):
                shown = "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
                raise OnnxValidationError(
                    f"{where}: graph input {vi.name!r} declares the shape {shown}, but its "
                    f"initializer has the shape {fmt(have)}")


# -- per-node checks (the rules are in .onnx_shape_rules) ----------------------------

def expected_outputs(node: Node, shape_of: Callable[[str], Shape | None],
                     const_of: Callable[[str], np.ndarray | None],
                     opset: int) -> list[Shape | None] | None:
    """The shape each output of ``node`` must have (None where not computed), from its
    inputs' shapes and constant values; raises :class:`OnnxValidationError` where the
    inputs do not fit the op. None for an op without a rule, or a node whose inputs'
    shapes are not known."""
    if node.domain not in STANDARD_DOMAINS:
        return None
    rule = RULES.get(node.op_type)
    if rule is None:
        return None
    if any(x and shape_of(x) is None for x in node.inputs):
        return None
    try:
        return rule(NodeView(node, shape_of, const_of, opset))
    except OnnxValidationError:
        raise
    except Exception:  # an attribute of an unexpected form: the lowering will say
        return None


def check_outputs(node: Node, expected: list[Shape | None] | None,
                  shape_of: Callable[[str], Shape | None], opset: int) -> None:
    """Compare the graph's output shapes of ``node`` with ``expected`` (see
    :func:`expected_outputs`); a view op's output must also have its input's element
    count whatever the rule computed."""
    v = NodeView(node, shape_of, lambda _: None, opset)
    if node.op_type in VIEW_OPS and node.inputs and node.outputs and node.outputs[0] \
            and v.shape(0) is not None and shape_of(node.outputs[0]) is not None:
        x, y = v.shape(0), shape_of(node.outputs[0])
        if element_count(x) != element_count(y):  # type: ignore[arg-type]
            raise v.error(f"cannot reshape {node.inputs[0]!r} of shape {fmt(x)} "  # type: ignore[arg-type]
                          f"({element_count(x)} elements) to {fmt(y)} "  # type: ignore[arg-type]
                          f"({element_count(y)} elements)")  # type: ignore[arg-type]
    if not expected:
        return
    for out, want in zip(node.outputs, expected):
        if not out or want is None:
            continue
        have = shape_of(out)
        if have is None or tuple(have) == tuple(want):
            continue
        ins = ", ".join(v.desc(i) for i in range(len(node.inputs)) if v.has(i))
        raise v.error(f"output {out!r} has the shape {fmt(have)} in the model, but "
                      f"{node.op_type} of {ins} gives {fmt(want)}")


#: ops whose output is the input re-viewed (same elements)
VIEW_OPS = frozenset(["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"])


# -- broadcasting -----------------------------------------------------------------------


def validate_graph(graph: Any) -> None:
    """Run the per-node checks over a :class:`~.onnx_graph.Graph` (the importer does
    this while it builds the graph; this is for graphs built otherwise)."""
    def shape_of(t: str) -> Shape | None:
        info = graph.tensors.get(t)
        return None if info is None else tuple(info.shape)
    for n in graph.nodes:
        want = expected_outputs(n, shape_of, graph.constants.get, graph.opset)
        check_outputs(n, want, shape_of, graph.opset)
