"""ONNX model -> :class:`~polyc.frontend.onnx_graph.Graph` (static shapes, constants).

:func:`load_graph` reads a model (a path, bytes or an ``onnx.ModelProto``), checks it
with onnx's checker, gives symbolic input dimensions the values passed in ``shapes``,
runs onnx's shape inference and requires every tensor to have a static shape and a
dtype polyc compiles. Initializers and ``Constant`` nodes become constants (graph
inputs that also have an initializer are constants too, as old IR versions list weights
as inputs); anonymous nodes are named ``<OpType>_<index>``; attributes become Python
values. Where shape inference cannot see through a shape computation (``Shape`` ->
``Gather`` -> ``Concat`` -> ``Reshape``), constant subgraphs are evaluated and shape
inference runs again.

Before any of that, opsets newer than polyc implements and custom domains are refused,
and declared shapes with negative extents; while the Graph is built, each node is
validated against its op's semantics (:mod:`.onnx_validate`: shapes declared or
inferred must be those the op computes from its inputs, axes and constant indices in
range), so that a bad model is refused here with the node, tensors and shapes named.

Every failure is a :class:`polyc.errors.CompileError` that names the file, the tensor
or the node: never a protobuf or onnx traceback.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from polyc import dtypes as D
from polyc.errors import CompileError

from .onnx_control import NOT_FLATTENED, flatten_control_flow
from .onnx_functions import expand_functions
from .onnx_dynamic import Extent, count_of, is_data_dependent, made_extents, propagate, \
    with_count
from .onnx_graph import Graph, Node, TensorInfo, UnsupportedOpError
from .onnx_validate import OnnxValidationError, check_declared_dims, check_opsets, \
    check_outputs, expected_outputs

#: ONNX element type -> polyc dtype
DTYPES = {getattr(TensorProto, {"float32": "FLOAT", "float64": "DOUBLE"}.get(n, n.upper())): n
          for n in D.ORDER}
#: polyc dtype -> numpy dtype
NUMPY = {n: D.numpy_dtype(n) for n in D.ORDER}
STANDARD_DOMAINS = ("", "ai.onnx")
_SUPPORTED = ", ".join(D.ORDER)


def onnx_type_name(elem_type: int) -> str:
    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"type {elem_type}"


# -- reading --------------------------------------------------------------------------

def read_model(model: str | os.PathLike | bytes | onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """The model proto and a description of where it came from (for messages)."""
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy, "the model"
    if isinstance(model, (bytes, bytearray, memoryview)):
        where = "the model bytes"
        data = bytes(model)
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(data)
        except Exception as e:  # google.protobuf.message.DecodeError and friends
            raise CompileError(f"{where}: not a valid ONNX model (cannot decode the protobuf: "
                               f"{e})") from None
        _check_nonempty(proto, where, data)
        return proto, where
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        where = f"{path!r}"
        if not os.path.exists(path):
            raise CompileError(f"{where}: no such file (expected an ONNX model)")
        if os.path.isdir(path):
            raise CompileError(f"{where} is a directory, not an ONNX model file")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise CompileError(f"{where}: cannot read the file: {e}") from None
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(data)
        except Exception as e:
            raise CompileError(f"{where}: not a valid ONNX model (the file is malformed or "
                               f"truncated: {e})") from None
        _check_nonempty(proto, where, data)
        try:  # weights stored next to the model
            from onnx.external_data_helper import load_external_data_for_model
            if any(t.data_location == TensorProto.EXTERNAL for t in proto.graph.initializer):
                load_external_data_for_model(proto, os.path.dirname(os.path.abspath(path)))
        except Exception as e:
            raise CompileError(f"{where}: cannot load the external weight data: {e}") from None
        return proto, where
    raise CompileError(f"expected a path, bytes or an onnx.ModelProto, got "
                       f"{type(model).__name__}")


def _check_nonempty(proto: onnx.ModelProto, where: str, data: bytes) -> None:
    if not data or not proto.HasField("graph") or proto.ir_version == 0:
        raise CompileError(f"{where}: not a valid ONNX model (no graph or IR version; the "
                           f"file is empty, truncated or not ONNX)")


# -- checks and shapes ------------------------------------------------------------------

def _opset(proto: onnx.ModelProto) -> int:
    for o in proto.opset_import:
        if o.domain in STANDARD_DOMAINS:
            return int(o.version)
    return 1


def _check_domains(proto: onnx.ModelProto, where: str = "the model") -> None:
    """Opsets newer than polyc implements and non-standard domains used by nodes are
    refused (:func:`.onnx_validate.check_opsets`)."""
    check_opsets(proto, where)


def _with_output_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model for onnx's checker, which wants a shape on every graph output: where
    one has none (shape inference, and polyc's folding, will find it), an empty one."""
    if all(o.type.tensor_type.HasField("shape") for o in proto.graph.output
           if o.type.HasField("tensor_type")):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for o in copy.graph.output:
        if o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape"):
            o.type.tensor_type.shape.SetInParent()
    return copy


def _dims(t: onnx.TypeProto) -> list[int | str | None] | None:
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    out: list[int | str | None] = []
    for d in t.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            out.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            out.append(d.dim_param)
        else:
            out.append(None)
    return out


def _show_dims(dims: Sequence[int | str | None] | None) -> str:
    if dims is None:
        return "(unknown rank)"
    return "(" + ", ".join("?" if d is None else str(d) for d in dims) + ")"


def _apply_shapes(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None,
                  where: str) -> None:
    inits = {t.name for t in proto.graph.initializer}
    real = [i for i in proto.graph.input if i.name not in inits]
    by_name = {i.name: i for i in real}
    shapes = dict(shapes or {})
    unknown = [n for n in shapes if n not in by_name]
    if unknown:
        raise CompileError(f"{where}: --shape/shapes names {', '.join(map(repr, unknown))}, "
                           f"which {'is' if len(unknown) == 1 else 'are'} not a graph input; "
                           f"the inputs are: "
                           + ", ".join(f"{i.name} {_show_dims(_dims(i.type))}" for i in real))
    for name, value in shapes.items():
        inp = by_name[name]
        try:
            value = [int(v) for v in value]
        except (TypeError, ValueError):
            raise CompileError(f"shape for input {name!r} must be a list of integers, got "
                               f"{value!r}") from None
        if any(v < 1 for v in value):
            raise CompileError(f"shape for input {name!r} must have positive dimensions, got "
                               f"{value}")
        old = _dims(inp.type)
        if old is not None and len(old) != len(value):
            raise CompileError(f"input {name!r} has rank {len(old)} {_show_dims(old)}, but the "
                               f"shape given for it has rank {len(value)}: {value}")
        for d, (o, v) in enumerate(zip(old or [], value)):
            if isinstance(o, int) and o != v:
                raise CompileError(f"input {name!r} has dimension {d} fixed to {o} in the "
                                   f"model, but the shape given for it says {v}")
        tt = inp.type.tensor_type
        tt.shape.Clear()
        for v in value:
            tt.shape.dim.add().dim_value = v
    for inp in real:
        if not inp.type.HasField("tensor_type"):
            kind = inp.type.WhichOneof("value") or "untyped"
            raise UnsupportedOpError(f"input {inp.name!r} is of {kind.replace('_type', '')} "
                                     f"type, "
                                     f"not a tensor: polyc compiles tensors only")
        if inp.type.tensor_type.elem_type not in DTYPES:
            raise UnsupportedOpError(
                f"tensor {inp.name!r} (graph input) has dtype "
                f"{onnx_type_name(inp.type.tensor_type.elem_type)}, which polyc does not "
                f"support (supported: {_SUPPORTED})")
        dims = _dims(inp.type)
        if dims is None or any(not isinstance(d, int) for d in dims):
            example = ",".join(str(d) if isinstance(d, int) else "1" for d in (dims or []))
            raise CompileError(
                f"input {inp.name!r} has a dynamic shape {_show_dims(dims)}: polyc compiles "
                f"static shapes; give it a value with --shape {inp.name}={example or '...'} "
                f"(command line) or shapes={{{inp.name!r}: [{example.replace(',', ', ')}]}} "
                f"(Python)")
    # value_info and outputs may carry symbolic dims that inference would keep: drop them
    for vi in list(proto.graph.value_info):
        dims = _dims(vi.type)
        if dims is not None and any(not isinstance(d, int) for d in dims):
            proto.graph.value_info.remove(vi)
    for out in proto.graph.output:
        dims = _dims(out.type)
        if dims is not None and any(not isinstance(d, int) for d in dims):
            out.type.tensor_type.ClearField("shape")


def _infer_onnx(proto: onnx.ModelProto, where: str,
                strict_errors: list[str] | None = None) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True,
                                                 data_prop=True)
    except Exception as e:  # kept: it may explain a tensor left without a shape
        if strict_errors is not None:
            strict_errors.append(_first_line(e))
    try:
        return onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception as e:
        raise CompileError(f"{where}: onnx shape inference failed: {_first_line(e)}") from None


def _infer(proto: onnx.ModelProto, where: str,
           strict_errors: list[str] | None = None) -> onnx.ModelProto:
    """onnx's shape inference, then pool output shapes corrected (see
    :func:`_fix_pool_shapes`) and inference run again below each corrected tensor.
    The errors of onnx's strict mode (the lenient mode runs after them) are appended
    to ``strict_errors``."""
    proto = _infer_onnx(proto, where, strict_errors)
    for _ in range(len(proto.graph.node) + 1):
        if not _fix_pool_shapes(proto):
            break
        proto = _infer_onnx(proto, where, strict_errors)
    return proto


def _pool_dims(n: onnx.NodeProto, in_dims: Sequence[int]) -> list[int] | None:
    """The output shape of a MaxPool/AveragePool with ``ceil_mode=1`` and explicit (or
    VALID) padding as onnxruntime, PyTorch and onnx's reference compute it: the last
    window is dropped if it would start inside the right padding. (onnx's shape
    inference keeps that window, one element more than the operator produces.) None
    where the rule does not apply."""
    attrs = {a.name: attribute_value(a) for a in n.attribute}
    if int(attrs.get("ceil_mode", 0)) != 1 or len(in_dims) < 3:
        return None
    auto = attrs.get("auto_pad", "NOTSET")
    if auto not in ("NOTSET", "VALID"):
        return None
    k = len(in_dims) - 2
    kernel = attrs.get("kernel_shape")
    if kernel is None or len(kernel) != k:
        return None
    strides = attrs.get("strides") or [1] * k
    dil = attrs.get("dilations") or [1] * k
    pads = attrs.get("pads") if auto == "NOTSET" else None
    pads = pads or [0] * (2 * k)
    if len(strides) != k or len(dil) != k or len(pads) != 2 * k or min(strides) < 1:
        return None
    out = list(in_dims[:2])
    for d in range(k):
        size, begin = in_dims[d + 2], pads[d]
        span = size + begin + pads[d + k] - ((kernel[d] - 1) * dil[d] + 1)
        if span < 0:
            return None
        o = -(-span // strides[d]) + 1
        if (o - 1) * strides[d] >= size + begin:
            o -= 1
        out.append(o)
    return out


def _fix_pool_shapes(proto: onnx.ModelProto) -> bool:
    """Correct the inferred output shapes of ceil-mode pools (:func:`_pool_dims`); drop
    the shapes inferred below each corrected tensor so that inference recomputes them.
    True if anything changed."""
    g = proto.graph
    infos = _value_infos(proto)
    fixed: dict[str, list[int]] = {}
    for n in g.node:
        if n.domain not in STANDARD_DOMAINS or n.op_type not in ("MaxPool", "AveragePool") \
                or not n.output or not n.output[0] or not _static(infos.get(n.input[0])):
            continue
        in_dims = [int(d) for d in _dims(infos[n.input[0]].type)]  # type: ignore[union-attr]
        want = _pool_dims(n, in_dims)
        if want is None:
            continue
        have = infos.get(n.output[0])
        if have is not None and _dims(have.type) == want:
            continue
        fixed[n.output[0]] = want
    if not fixed:
        return False
    below: set[str] = set()
    for n in g.node:  # nodes are topologically sorted
        if any(x in fixed or x in below for x in n.input if x):
            below.update(o for o in n.output if o and o not in fixed)
    elem = {name: vi.type.tensor_type.elem_type for name, vi in infos.items()}
    for vi in list(g.value_info):
        if vi.name in fixed or vi.name in below:
            g.value_info.remove(vi)
    outputs = {o.name: o for o in g.output}
    for name, dims in fixed.items():
        if name in outputs:
            tt = outputs[name].type.tensor_type
            tt.shape.Clear()
            for v in dims:
                tt.shape.dim.add().dim_value = v
        else:
            g.value_info.append(helper.make_tensor_value_info(
                name, elem.get(name) or TensorProto.FLOAT, dims))
    for name in below:
        if name in outputs and outputs[name].type.HasField("tensor_type"):
            outputs[name].type.tensor_type.ClearField("shape")
    return True


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text if len(text) < 2000 else text[:2000] + "..."


def _value_infos(proto: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    g = proto.graph
    out: dict[str, onnx.ValueInfoProto] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.HasField("tensor_type"):
            prev = out.get(vi.name)
            dims = _dims(vi.type)
            if prev is None or (_dims(prev.type) is None and dims is not None) or (
                    dims is not None and all(isinstance(d, int) for d in dims)):
                out[vi.name] = vi
    return out


def _static(vi: onnx.ValueInfoProto | None) -> bool:
    if vi is None:
        return False
    dims = _dims(vi.type)
    return dims is not None and all(isinstance(d, int) for d in dims) \
        and vi.type.tensor_type.elem_type != 0


def _fold_for_shapes(proto: onnx.ModelProto) -> bool:
    """Evaluate nodes whose inputs are all constants (or Shape/Size of static tensors),
    turning them into initializers, so that shape inference sees through shape
    computations. True if anything changed."""
    from .onnx_passes import evaluate_node
    g = proto.graph
    infos = _value_infos(proto)
    consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    opset = _opset(proto)
    changed = False
    keep = []
    for i, n in enumerate(g.node):
        ins = [x for x in n.input if x]
        value = None
        if n.domain in STANDARD_DOMAINS and n.op_type in ("Shape", "Size") and ins \
                and _static(infos.get(ins[0])):
            dims = [int(d) for d in _dims(infos[ins[0]].type)]  # type: ignore[union-attr]
            fake = np.zeros(dims, dtype=np.float32)
            node = _node_of(n, i, opset)
            value = evaluate_node(node, [fake], opset)
        elif n.domain in STANDARD_DOMAINS and all(x in consts for x in ins) \
                and n.op_type not in _NO_FOLD and not (
                    n.op_type == "ConstantOfShape" and ins
                    and np.prod(consts[ins[0]], dtype=np.float64) > _SHAPE_FOLD_LIMIT):
            try:
                value = evaluate_node(_node_of(n, i, opset), [consts[x] for x in ins], opset)
            except Exception:
                value = None
            # shape computations are small: big values wait for the constant-folding pass
            if value is not None and sum(np.size(v) for v in value) > _SHAPE_FOLD_LIMIT:
                value = None
        if value is None:
            keep.append(n)
            continue
        for name, v in zip(n.output, value):
            if name:
                consts[name] = v
                g.initializer.append(numpy_helper.from_array(np.asarray(v), name))
        changed = True
    if changed:
        del g.node[:]
        g.node.extend(keep)
        # shape inference keeps a value_info it inferred before, even when the folded
        # values now give a static shape: forget the ones that are not static
        stale = [vi for vi in g.value_info if not _static(vi)]
        for vi in stale:
            g.value_info.remove(vi)
    return changed


#: the largest value (elements) folded at import to help shape inference
_SHAPE_FOLD_LIMIT = 1 << 16
_NO_FOLD = frozenset(["RandomNormal", "RandomUniform", "RandomNormalLike",
                      "RandomUniformLike", "Multinomial", "Bernoulli", "If", "Loop", "Scan"])


def _node_of(n: onnx.NodeProto, index: int, opset: int) -> Node:
    return Node(n.name or f"{n.op_type}_{index}", n.op_type, tuple(n.input), tuple(n.output),
                {a.name: attribute_value(a) for a in n.attribute}, n.domain)


# -- attributes ---------------------------------------------------------------------------

def attribute_value(a: onnx.AttributeProto) -> Any:
    """An attribute as a Python value: int, float, str, list, numpy array."""
    A = onnx.AttributeProto
    if a.type == A.INT:
        return int(a.i)
    if a.type == A.FLOAT:
        return float(a.f)
    if a.type == A.STRING:
        return a.s.decode("utf-8", errors="replace")
    if a.type == A.TENSOR:
        return numpy_helper.to_array(a.t)
    if a.type == A.INTS:
        return [int(v) for v in a.ints]
    if a.type == A.FLOATS:
        return [float(v) for v in a.floats]
    if a.type == A.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in a.strings]
    if a.type == A.TENSORS:
        return [numpy_helper.to_array(t) for t in a.tensors]
    return helper.get_attribute_value(a)  # graphs, type protos: kept as protos


def _constant_value(node: onnx.NodeProto) -> np.ndarray:
    for a in node.attribute:
        v = attribute_value(a)
        if a.name == "value":
            return np.asarray(v)
        if a.name == "value_float":
            return np.asarray(v, dtype=np.float32)
        if a.name == "value_floats":
            return np.asarray(v, dtype=np.float32)
        if a.name == "value_int":
            return np.asarray(v, dtype=np.int64)
        if a.name == "value_ints":
            return np.asarray(v, dtype=np.int64)
        if a.name == "sparse_value":
            from onnx.numpy_helper import to_array
            sp = a.sparse_tensor
            dense = np.zeros(tuple(sp.dims), dtype=to_array(sp.values).dtype)
            idx = to_array(sp.indices)
            vals = to_array(sp.values)
            if idx.ndim == 1:
                dense.reshape(-1)[idx] = vals
            else:
                dense[tuple(idx.T)] = vals
            return dense
    raise UnsupportedOpError(f"node {node.name!r} (Constant): no supported value attribute "
                             f"(value, value_float(s), value_int(s), sparse_value)")


# -- the graph ----------------------------------------------------------------------------

#: the inputs of each op that polyc needs as constants (axes, pads, slice bounds, split
#: sizes, K, shapes, scales): given as graph inputs they are the model's *parameters*
PARAMETER_SLOTS: dict[str, tuple[int, ...]] = {
    **{op: (1,) for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                           "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                           "ReduceSumSquare", "Split", "CumSum", "CumProd", "TopK",
                           "Reshape", "Expand", "Tile", "Squeeze", "Unsqueeze", "OneHot",
                           "Upsample", "Trilu")},
    "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3), "Resize": (1, 2, 3), "ConstantOfShape": (0,),
    "CenterCropPad": (1,), "AffineGrid": (1,), "DFT": (1, 2), "Col2Im": (1, 2),
    "Range": (0, 1, 2), "NonMaxSuppression": (2,), "Loop": (0,)}


def parameter_inputs(model: str | os.PathLike | bytes | onnx.ModelProto) -> list[str]:
    """The graph inputs (not initializers) that some node takes as a parameter (see
    :data:`PARAMETER_SLOTS`), in graph order: polyc compiles such a model for given
    values of them (``compile_onnx(..., values=...)``)."""
    proto, _ = read_model(model)
    inits = {t.name for t in proto.graph.initializer}
    graph_inputs = [i.name for i in proto.graph.input if i.name not in inits]
    slots = [n.input[k] for n in proto.graph.node for k in PARAMETER_SLOTS.get(n.op_type, ())
             if n.domain in ("", "ai.onnx") and k < len(n.input) and n.input[k]]
    # a parameter computed from graph inputs (a Loop's trip count from Range's start,
    # limit and delta) makes them parameters too; Shape and Size read only shapes
    made_by = {o: n for n in proto.graph.node for o in n.output if o}
    used: set[str] = set()
    todo = list(slots)
    while todo:
        t = todo.pop()
        if t in used:
            continue
        used.add(t)
        n = made_by.get(t)
        if n is not None and n.op_type not in ("Shape", "Size"):
            todo.extend(x for x in n.input if x)
    return [name for name in graph_inputs if name in used]


def check_tensor_interface(proto: onnx.ModelProto) -> None:
    """Refuse a graph input or output that is not a tensor (a sequence, map or optional)."""
    for kind, values in (("input", proto.graph.input), ("output", proto.graph.output)):
        for v in values:
            if v.HasField("type") and not v.type.HasField("tensor_type"):
                what = v.type.WhichOneof("value")
                what = what.replace("_type", "")
                article = "an" if what[0] in "aeiou" else "a"
                raise UnsupportedOpError(f"graph {kind} {v.name!r} is {article} {what}, not a "
                                         f"tensor (sequences, maps and optionals are not "
                                         f"supported)")


def fix_inputs(model: str | os.PathLike | bytes | onnx.ModelProto,
               values: Mapping[str, Any]) -> onnx.ModelProto:
    """The model with the graph inputs named in ``values`` turned into initializers of
    those values (cast to the input's declared element type)."""
    proto, where = read_model(model)
    declared = {i.name: i for i in proto.graph.input}
    inits = {t.name for t in proto.graph.initializer}
    for name, value in values.items():
        if name not in declared or name in inits:
            raise CompileError(f"{where}: no graph input {name!r} to fix (inputs: "
                               f"{', '.join(n for n in declared if n not in inits)})")
        elem = declared[name].type.tensor_type.elem_type
        array = np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(elem))
        proto.graph.initializer.append(numpy_helper.from_array(array, name))
    kept = [i for i in proto.graph.input if i.name not in values]
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    return proto


def load_graph(model: str | os.PathLike | bytes | onnx.ModelProto,
               shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Read, check and shape-infer an ONNX model into a static :class:`Graph`.

    ``shapes`` gives values to the inputs' symbolic dimensions
    (``{"input": [1, 3, 224, 224]}``; on the command line ``--shape input=1,3,224,224``).
    """
    proto, where = read_model(model)
    from .onnx_graph import supported_ops
    try:
        expand_functions(proto, set(supported_ops()))  # local functions and function ops
    except Exception as e:  # noqa: BLE001 -- onnx's inliner on a malformed model
        raise CompileError(f"{where}: cannot expand the model's functions: "
                           f"{_first_line(e)}") from None
    _check_domains(proto, where)
    try:
        onnx.checker.check_model(_with_output_shapes(proto))
    except Exception as e:
        raise CompileError(f"{where}: not a valid ONNX model: {_first_line(e)}") from None
    if len(proto.graph.output) == 0:
        raise CompileError(f"{where}: the graph has no outputs")
    check_declared_dims(proto, where)
    _apply_shapes(proto, shapes, where)
    strict_errors: list[str] = []
    proto = _infer(proto, where, strict_errors)
    for _ in range(8):  # Scan and If flattened into the graph (nested ones in turn)
        shapes = {name: dims for name, vi in _value_infos(proto).items()
                  if (dims := _dims(vi.type)) is not None and all(isinstance(d, int)
                                                                  for d in dims)}
        shapes.update({t.name: list(t.dims) for t in proto.graph.initializer})
        if not flatten_control_flow(proto, shapes):
            break
        proto = _infer(proto, where)
    for _ in range(50):
        infos = _value_infos(proto)
        used = _used_tensors(proto)
        produced = [o for n in proto.graph.node for o in n.output if o and o in used]
        if all(_static(infos.get(o)) for o in produced):
            break
        if not _fold_for_shapes(proto):
            break
        proto = _infer(proto, where)
    return _to_graph(proto, where, strict_errors[0] if strict_errors else None)


def _used_tensors(proto: onnx.ModelProto) -> set[str]:
    used = {o.name for o in proto.graph.output}
    for n in proto.graph.node:
        used.update(x for x in n.input if x)
    return used


def _to_graph(proto: onnx.ModelProto, where: str, strict_error: str | None = None) -> Graph:
    """The Graph of a shape-inferred model; each node is validated
    (:mod:`.onnx_validate`) as it is added, before its outputs are looked at."""
    g = proto.graph
    used = _used_tensors(proto)
    opset = _opset(proto)
    infos = _value_infos(proto)
    constants: dict[str, np.ndarray] = {}
    for t in g.initializer:
        try:
            constants[t.name] = numpy_helper.to_array(t)
        except Exception as e:
            raise CompileError(f"{where}: cannot read initializer {t.name!r}: {e}") from None
    for sp in g.sparse_initializer:
        raise UnsupportedOpError(f"sparse initializer {sp.values.name!r} is not supported")
    tensors: dict[str, TensorInfo] = {}
    producer: dict[str, str] = {}

    def shape_of(name: str) -> tuple[int, ...] | None:
        info = tensors.get(name)
        return None if info is None else info.shape

    def add_tensor(name: str, made_by: str) -> None:
        if not name or name in tensors:
            return
        if name in constants:
            v = constants[name]
            dtype = _dtype_of_numpy(v.dtype, name, made_by)
            tensors[name] = TensorInfo(name, dtype, tuple(int(d) for d in v.shape))
            return
        vi = infos.get(name)
        if vi is None or vi.type.tensor_type.elem_type == 0:
            if vi is not None and not vi.type.HasField("tensor_type"):
                raise UnsupportedOpError(f"tensor {name!r} ({made_by}) is not a tensor "
                                         f"(sequences, maps and optionals are not supported)")
            said = f" (onnx's strict shape inference says: {strict_error})" \
                if strict_error else ""
            raise UnsupportedOpError(f"tensor {name!r} ({made_by}) has no inferred type or shape: "
                               f"polyc needs static shapes; onnx's shape inference could not "
                               f"compute it{said}")
        elem = vi.type.tensor_type.elem_type
        if elem not in DTYPES:
            raise UnsupportedOpError(f"tensor {name!r} ({made_by}) has dtype "
                                     f"{onnx_type_name(elem)}, which polyc does not support "
                                     f"(supported: {_SUPPORTED})")
        dims = _dims(vi.type)
        if dims is None or any(not isinstance(d, int) for d in dims):
            # the graph's inputs are static by now: the shape depends on data
            raise UnsupportedOpError(f"tensor {name!r} ({made_by}) has a non-static shape "
                                     f"{_show_dims(dims)}: it depends on the values of "
                                     f"tensors, and polyc needs every shape known at compile "
                                     f"time")
        if any(d < 0 for d in dims):  # type: ignore[operator]
            raise OnnxValidationError(f"tensor {name!r} ({made_by}) has the shape "
                                      f"{_show_dims(dims)}, with a negative dimension")
        tensors[name] = TensorInfo(name, DTYPES[elem], tuple(int(d) for d in dims))

    inputs = [i.name for i in g.input if i.name not in constants]
    for name in inputs:
        add_tensor(name, "graph input")
    names = used | set(constants) | {o for n in g.node for o in n.output} | set(inputs)
    dynamic: dict[str, Extent] = {}
    nodes: list[Node] = []
    used_names: set[str] = set()
    for index, n in enumerate(g.node):
        if n.domain not in STANDARD_DOMAINS:  # checked earlier; kept for safety
            raise UnsupportedOpError(f"node {n.name!r}: custom domain {n.domain!r}")
        name = n.name or f"{n.op_type}_{index}"
        base, k = name, 1
        while name in used_names:
            name = f"{base}_{k}"
            k += 1
        used_names.add(name)
        if n.op_type in ("If", "Loop", "Scan") and n.domain in STANDARD_DOMAINS:
            raise UnsupportedOpError(f"node {name!r} ({n.op_type}): {NOT_FLATTENED}")
        if n.op_type == "Constant":
            value = _constant_value(n)
            out = n.output[0]
            constants[out] = value
            add_tensor(out, f"output of node {name!r} (Constant)")
            continue
        # an output nothing reads, without an inferred type (Dropout's mask): omitted
        outs = tuple(o if (o in used or _static(infos.get(o))) else "" for o in n.output)
        node = Node(name, n.op_type, tuple(n.input), outs,
                    {a.name: attribute_value(a) for a in n.attribute}, n.domain)
        for x in node.inputs:
            if x and x not in tensors:
                if x in constants:
                    add_tensor(x, "initializer")
                else:
                    add_tensor(x, f"input of node {name!r} ({n.op_type})")
        if is_data_dependent(node, constants.get):  # one more output: the count
            node = with_count(node, lambda t: t in names or t in tensors)
        expected = expected_outputs(node, shape_of, constants.get, opset)
        unknown = expected is not None and any(
            o and not _static(infos.get(o)) and k < len(expected) and expected[k] is not None
            for k, o in enumerate(node.outputs))
        if count_of(node) is not None or any(x in dynamic for x in node.inputs) or unknown:
            # sizes that depend on data: the bounds polyc's rules give (onnx's inference
            # leaves them symbolic, or takes them from one example's declared shapes)
            found = propagate(node, dynamic, shape_of, constants.get)  # or refuse the node
            _add_bounds(node, expected, tensors, infos,
                        every=count_of(node) is not None or bool(found))
            dynamic.update(found)
            dynamic.update(made_extents(node, shape_of))
        for o in node.outputs:
            if o:
                producer[o] = name
                add_tensor(o, f"output of node {name!r} ({n.op_type})")
        check_outputs(node, expected, shape_of, opset)
        nodes.append(node)
    outputs = [o.name for o in g.output]
    for o in outputs:
        add_tensor(o, "graph output" if o not in producer else f"output of node {producer[o]!r}")
    # constants' dtypes (a weight may be int8 even if no node reads it any more)
    for cname, v in list(constants.items()):
        if cname in tensors:
            want = NUMPY[tensors[cname].dtype]
            if v.dtype != want:
                constants[cname] = v.astype(want)
    return Graph(g.name or "model", tuple(nodes), tuple(inputs), tuple(outputs), tensors,
                 constants, opset)


#: ops whose output has their first input's dtype (for outputs onnx inferred nothing of)
SAME_DTYPE_OPS = frozenset(["GroupNormalization", "ReverseSequence"])


def _add_bounds(node: Node, expected: Sequence[Any] | None, tensors: dict[str, TensorInfo],
                infos: Mapping[str, onnx.ValueInfoProto], every: bool = True) -> None:
    """The outputs of a node at the shapes ``expected`` by polyc's rules, where onnx's
    inference left them unknown: sizes that depend on data (see :mod:`.onnx_dynamic`:
    their bounds), or an op onnx infers nothing for (a context-dependent function such
    as GroupNormalization). The dtypes are onnx's (the count: int64). Unless ``every``
    (a node whose sizes depend on data), only the outputs onnx left unknown, and only
    where the rules know them."""
    count = count_of(node)
    for k, o in enumerate(node.outputs):
        if not o:
            continue
        shape = expected[k] if expected is not None and k < len(expected) else None
        if not every and (_static(infos.get(o)) or shape is None):
            continue  # onnx's shape, or its usual error when the tensor is added
        if shape is None:
            raise UnsupportedOpError(f"node {node.name!r} ({node.op_type}): the size of its "
                                     f"output {o!r} depends on data, and polyc cannot bound it")
        vi = infos.get(o)
        elem = vi.type.tensor_type.elem_type if vi is not None and \
            vi.type.HasField("tensor_type") else 0
        if o == count:
            dtype = "int64"
        elif elem in DTYPES:
            dtype = DTYPES[elem]
        elif node.inputs and node.inputs[0] in tensors and node.op_type in SAME_DTYPE_OPS:
            dtype = tensors[node.inputs[0]].dtype  # onnx inferred no type at all
        else:
            raise UnsupportedOpError(f"node {node.name!r} ({node.op_type}): output {o!r} has "
                                     f"no dtype polyc supports")
        tensors[o] = TensorInfo(o, dtype, tuple(int(d) for d in shape))


def _dtype_of_numpy(dt: np.dtype, name: str, made_by: str) -> str:
    for polyc_dtype, np_dtype in NUMPY.items():
        if np.dtype(np_dtype) == dt:
            return polyc_dtype
    raise UnsupportedOpError(f"tensor {name!r} ({made_by}) has dtype {dt}, which polyc does not "
                             f"support (supported: {_SUPPORTED})")


def graph_to_model(graph: Graph, ir_version: int = 8) -> onnx.ModelProto:
    """The ONNX model of a :class:`Graph` (after passes, for checks with onnx's reference
    evaluator or onnxruntime, and for debugging)."""
    from .onnx_passes import node_proto
    elem = {v: k for k, v in DTYPES.items()}

    def vi(name: str) -> onnx.ValueInfoProto:
        info = graph.tensors[name]
        return helper.make_tensor_value_info(name, elem[info.dtype], list(info.shape))
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in graph.constants.items()]
    g = helper.make_graph([node_proto(n) for n in graph.nodes], graph.name,
                          [vi(i) for i in graph.inputs], [vi(o) for o in graph.outputs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", graph.opset)],
                             ir_version=ir_version)
