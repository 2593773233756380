"""ONNX functions expanded into the graph before import.

* A model's local functions (``ModelProto.functions``, as exporters write a module
  once and call it at each use) are inlined with onnx's own inliner.
* An op that ONNX defines as a function of other ops (HannWindow, MeanVariance-
  Normalization, SwiGLU...: its schema has a function body) and that polyc has no
  lowering of is replaced by that body, taken from the schema of the model's opset:
  the body's inputs and outputs renamed to the node's, its other tensors prefixed with
  the node's name, its attribute references (``ref_attr_name``) given the node's
  attribute or the schema's default. The expanded ops then compile as any others.
"""
from __future__ import annotations

from collections.abc import Collection

import onnx
from onnx import defs

from .onnx_control import renamed_node, replace_nodes


def expand_functions(proto: onnx.ModelProto, lowered: Collection[str]) -> bool:
    """Inline ``proto``'s local functions and expand the nodes whose op polyc does not
    lower (``lowered``: the op types it does) but ONNX defines as a function. In place;
    True if anything changed."""
    changed = False
    if len(proto.functions):
        from onnx import inliner
        inlined = inliner.inline_local_functions(proto)
        proto.CopyFrom(inlined)
        changed = True
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")),
                default=1)
    def expand(n: onnx.NodeProto, index: int) -> list[onnx.NodeProto] | None:
        if n.domain in ("", "ai.onnx") and n.op_type not in lowered:
            return _body(n, index, opset)
        return None
    for _ in range(4):  # a body may itself use function ops
        if not replace_nodes(proto.graph, expand):
            break
        changed = True
    return changed


def _body(n: onnx.NodeProto, index: int, opset: int) -> list[onnx.NodeProto] | None:
    try:
        schema = defs.get_schema(n.op_type, opset)
    except Exception:  # noqa: BLE001 -- not a standard op at this opset
        return None
    if not schema.has_function:
        return None
    # the body written for the newest version of the function not past the model's
    # opset (MeanVarianceNormalization has one for opset 13, another for 18)
    versions = [v for v in getattr(schema, "function_opset_versions", []) if v <= opset]
    if versions:
        fn = onnx.FunctionProto.FromString(schema.get_function_with_opset_version(max(versions)))
    else:
        fn = schema.function_body
    body_opset = max((o.version for o in fn.opset_import if o.domain in ("", "ai.onnx")),
                     default=0)
    if body_opset > opset:
        return None  # a body that needs a newer opset than the model's
    prefix = f"{n.name or n.op_type + '_' + str(index)}/"
    names = {x: y for x, y in zip(fn.input, n.input)}
    names.update({x: "" for x in list(fn.input)[len(n.input):]})  # omitted optional inputs
    names.update({x: y for x, y in zip(fn.output, n.output) if y})
    given = {a.name: a for a in n.attribute}
    defaults = {name: a.default_value for name, a in schema.attributes.items()
                if a.default_value is not None and a.default_value.name}
    nodes = []
    for j, b in enumerate(fn.node):
        c = renamed_node(b, j, prefix,
                         [names.get(x, f"{prefix}{x}") if x else "" for x in b.input],
                         [names.get(x, f"{prefix}{x}") if x else "" for x in b.output])
        del c.attribute[:]
        for a in b.attribute:
            if not a.ref_attr_name:
                c.attribute.append(a)
                continue
            src = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
            if src is None:
                continue  # no value: the attribute is left out, as onnx's inliner does
            v = onnx.AttributeProto()
            v.CopyFrom(src)
            v.name = a.name
            c.attribute.append(v)
        if b.op_type in ("If", "Loop", "Scan"):
            return None  # subgraphs would need their names prefixed too
        nodes.append(c)
    return nodes
