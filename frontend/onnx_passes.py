"""Graph passes: :class:`~polyc.frontend.onnx_graph.Graph` -> Graph.

:func:`optimize_graph` runs, in this order:

0. :func:`gemms_as_convs` -- a QDQ fully-connected layer becomes a 1x1 QDQ convolution;
   :func:`fuse_qdq_convs` -- a QDQ convolution becomes one QLinearConv (then integer
   dot products on a CPU that has them, else exact float convolutions; a model's own
   QLinearConv goes to :func:`convs_as_dot_products` after the first folding);
   :func:`fold_empty_tensors` -- tensors with no elements become constants;
1. :func:`fold_constants` -- nodes whose inputs are all constants (and ``Shape`` /
   ``Size`` of static tensors) are evaluated now;
2. :func:`remove_noops` -- Identity, inference Dropout, Cast to the same dtype;
   :func:`pools_on_integers` -- a QDQ MaxPool pools the integers;
3. :func:`fold_batchnorm` -- BatchNormalization after a Conv or Gemm goes into its
   weights and bias;
4. :func:`eliminate_common_subexpressions` -- same op, inputs and attributes computed
   once (identical constants merged too);
5. :func:`eliminate_dead_nodes` -- nodes and constants nothing uses.

(then folding, CSE and DCE once more, as each can open work for the others), and last
:func:`.onnx_layout.choose_conv_layouts` -- which Convs run channel-last.
:func:`fusion_groups` then partitions the nodes into the groups that become one
kernel each. Counts of what each pass did are kept: :func:`pass_stats`.
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from polyc import dtypes as D
from polyc.ir import QUAD_LANES

from .onnx_dynamic import DATA_DEPENDENT_OPS
from .onnx_graph import Graph, Node, TensorInfo
from .onnx_layout import TO_NCHW, TO_NHWC, choose_conv_layouts, pointwise_unpadded

NUMPY = {n: D.numpy_dtype(n) for n in D.ORDER}

#: ops never evaluated at compile time or merged (their value is not a function of inputs)
NONDETERMINISTIC = frozenset(["RandomNormal", "RandomUniform", "RandomNormalLike",
                              "RandomUniformLike", "Multinomial", "Bernoulli"])
#: ops with subgraphs or state: never folded
NO_FOLD = NONDETERMINISTIC | {"If", "Loop", "Scan"} | DATA_DEPENDENT_OPS
#: an output larger than this (bytes) is only folded if it is not much larger than the
#: inputs (an Expand or Tile of a small constant is cheaper to compute than to store);
#: ConstantOfShape is always folded (model weights are often such fills)
FOLD_LIMIT_BYTES = 16 << 20

#: ops that only re-view their input (lowered as views): kept out of fusion groups
VIEW_OPS = frozenset(["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"])
#: ops that start a fusion group (their elementwise consumers join them)
ANCHOR_OPS = frozenset(["Conv", "ConvTranspose", "Gemm", "MatMul", "PolycConvDot",
                        "PolycConvNHWC", "PolycWinogradOutput",
                        "PolycMatMulBlocked"])
#: elementwise ops (each output element from the same element of the inputs, broadcast)
ELEMENTWISE_OPS = frozenset([
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "Equal",
    "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor",
    "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
    "Erf", "Gelu", "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs", "Floor", "Ceil",
    "Softplus", "Softsign", "Elu", "Selu", "Celu", "ThresholdedRelu", "Sign", "Sin", "Cos",
    "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Round",
    "Mod", "Cast", "CastLike", "IsNaN", "IsInf", "Mish", "BatchNormalization", "Swish",
    "Shrink", "PolycRequantize", "PolycRoundHalf", "QuantizeLinear", "DequantizeLinear"])
#: the largest fusion group
MAX_GROUP = 6

_STATS: dict[str, int] = {}


def pass_stats() -> dict[str, int]:
    """What the last :func:`optimize_graph` did: ``{"folded": 12, "cse": 3, ...}``."""
    return dict(_STATS)


# -- helpers ----------------------------------------------------------------------------

def consumers(graph: Graph) -> dict[str, list[Node]]:
    """Tensor name -> the nodes reading it (a node reading it twice counts once)."""
    out: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for x in dict.fromkeys(n.inputs):
            if x:
                out.setdefault(x, []).append(n)
    return out


def producers(graph: Graph) -> dict[str, Node]:
    return {o: n for n in graph.nodes for o in n.outputs if o}


def _namer(names: set[str], tensors: dict[str, TensorInfo],
           constants: dict[str, np.ndarray]) -> Callable[..., str]:
    """``fresh(base, dtype, shape, value=None)``: a new tensor named after ``base``
    (unique in ``names``), declared in ``tensors``, a constant ``value`` when given."""
    def fresh(base: str, dtype: str, shape: tuple[int, ...], value=None) -> str:
        name = _fresh(base, names)
        names.add(name)
        tensors[name] = TensorInfo(name, dtype, tuple(int(d) for d in shape))
        if value is not None:
            constants[name] = value
        return name
    return fresh


def _replace(graph: Graph, **changes: Any) -> Graph:
    fields = dict(name=graph.name, nodes=graph.nodes, inputs=graph.inputs,
                  outputs=graph.outputs, tensors=graph.tensors, constants=graph.constants,
                  opset=graph.opset)
    fields.update(changes)
    fields["nodes"] = tuple(fields["nodes"])
    return Graph(**fields)


def _rename_inputs(nodes: Iterable[Node], renames: Mapping[str, str]) -> list[Node]:
    """The nodes with every input renamed through ``renames`` (transitively)."""
    def resolve(x: str) -> str:
        seen = set()
        while x in renames and x not in seen:
            seen.add(x)
            x = renames[x]
        return x
    out = []
    for n in nodes:
        ins = tuple(resolve(x) if x else x for x in n.inputs)
        out.append(n if ins == n.inputs else _with(n, inputs=ins))
    return out


def _with(n: Node, **changes: Any) -> Node:
    fields = dict(name=n.name, op_type=n.op_type, inputs=n.inputs, outputs=n.outputs,
                  attrs=n.attrs, domain=n.domain)
    fields.update(changes)
    return Node(**fields)


# -- evaluation of one node ---------------------------------------------------------------

def _attribute(key: str, value: Any) -> onnx.AttributeProto:
    if isinstance(value, np.ndarray):
        return helper.make_attribute(key, numpy_helper.from_array(value))
    if isinstance(value, (list, tuple)):
        if not value:
            return helper.make_attribute(key, [], attr_type=onnx.AttributeProto.INTS)
        if all(isinstance(v, np.ndarray) for v in value):
            return helper.make_attribute(key, [numpy_helper.from_array(v) for v in value])
        return helper.make_attribute(key, list(value))
    return helper.make_attribute(key, value)


def node_proto(node: Node) -> onnx.NodeProto:
    p = helper.make_node(node.op_type, list(node.inputs), list(node.outputs), name=node.name,
                         domain=node.domain or None)
    p.attribute.extend(_attribute(k, v) for k, v in node.attrs.items())
    return p


def evaluate_node(node: Node, values: Sequence[np.ndarray], opset: int) -> list[np.ndarray]:
    """The outputs of ``node`` on the values of its non-empty inputs (in order)."""
    op, a = node.op_type, node.attrs
    if op == "Identity":
        return [np.array(values[0])]
    if op == "Shape":
        shape = np.asarray(np.shape(values[0]), dtype=np.int64)
        start, end = a.get("start", 0), a.get("end")
        return [shape[start:end] if end is not None else shape[start:]]
    if op == "Size":
        return [np.asarray(np.size(values[0]), dtype=np.int64)]
    if op == "ConstantOfShape":
        fill = a.get("value")
        fill = np.zeros(1, dtype=np.float32) if fill is None else np.asarray(fill).reshape(-1)
        shape = tuple(int(d) for d in np.asarray(values[0]).reshape(-1))
        return [np.full(shape, fill[0], dtype=fill.dtype)]
    if op == "Constant":
        from .onnx_import import _constant_value
        return [_constant_value(node_proto(node))]
    if op == "DequantizeLinear" and not a.get("block_size") and len(values) >= 2 \
            and np.asarray(values[1]).dtype in (np.float32, np.float64):
        # onnx's reference evaluator has no DequantizeLinear before opset 19: a
        # quantized model's weights would be dequantized at every run
        return [_dequantized(values, int(a.get("axis", 1)))]
    from onnx.reference import ReferenceEvaluator
    names = [x for x in node.inputs if x]
    inputs = [helper.make_tensor_value_info(x, helper.np_dtype_to_tensor_dtype(
        np.asarray(v).dtype), np.shape(v)) for x, v in zip(names, values)]
    outputs = [helper.make_empty_tensor_value_info(o) for o in node.outputs if o]
    graph = helper.make_graph([node_proto(node)], "fold", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    results = ReferenceEvaluator(model).run(None, {x: np.asarray(v)
                                                   for x, v in zip(names, values)})
    return [np.asarray(r) for r in results]


def _dequantized(values: Sequence[np.ndarray], axis: int) -> np.ndarray:
    """``(float(x) - float(zero_point)) * scale`` in the scale's type (as the lowering
    computes it: :mod:`.onnx_ops_quant`), the scale and zero point per
    tensor or per slice along ``axis`` (ONNX's DequantizeLinear without blocks)."""
    x = np.asarray(values[0])
    scale = np.asarray(values[1])
    zero = np.asarray(values[2]) if len(values) > 2 else np.zeros((), x.dtype)
    shape = [1] * x.ndim
    if scale.size > 1 or zero.size > 1:
        shape[axis % x.ndim] = -1
    dt = scale.dtype  # each operand rounded to it, as the lowering computes it
    centred = x.astype(dt) - zero.astype(dt).reshape(shape if zero.size > 1 else ())
    return (centred * scale.reshape(shape if scale.size > 1 else ())).astype(dt)


# -- passes -----------------------------------------------------------------------------

def fold_empty_tensors(graph: Graph, stats: Counter | None = None) -> Graph:
    """A tensor with no elements (an extent 0: an empty Slice or Split piece, a
    reduction's empty input) has one value whatever the inputs: it becomes a constant.
    A node all of whose outputs are empty is dropped; a Concat drops its empty inputs.
    The folding that follows then evaluates what only reads constants (a reduction over
    an empty axis: its identity)."""
    stats = stats if stats is not None else Counter()
    constants = dict(graph.constants)
    for t, info in graph.tensors.items():
        if 0 in info.shape and t not in constants:
            constants[t] = np.zeros(info.shape, NUMPY[info.dtype])
    if len(constants) == len(graph.constants):
        return graph
    nodes: list[Node] = []
    for n in graph.nodes:
        outs = [o for o in n.outputs if o]
        if outs and all(o in graph.tensors and 0 in graph.tensors[o].shape for o in outs):
            stats["empty"] += 1
            continue
        if n.op_type == "Concat" and n.domain in ("", "ai.onnx"):
            kept = [x for x in n.inputs if x and 0 not in graph.tensors[x].shape]
            if kept and len(kept) < len(n.inputs):
                n = Node(n.name, n.op_type, tuple(kept), n.outputs, n.attrs, n.domain)
                stats["empty"] += 1
        nodes.append(n)
    return _replace(graph, nodes=nodes, constants=constants)


def fold_constants(graph: Graph, stats: Counter | None = None) -> Graph:
    """Evaluate, at compile time, every node whose inputs are all constants (a node with
    no inputs, such as ConstantOfShape's fill, included), and Shape / Size of tensors
    (shapes are static). The node is dropped and its outputs become constants. Nodes
    with random outputs or subgraphs are kept; so is a node whose output would exceed
    ``FOLD_LIMIT_BYTES`` while being more than 4x larger than its inputs (cheaper to
    compute than to store), except ConstantOfShape."""
    stats = stats if stats is not None else Counter()
    constants = dict(graph.constants)
    tensors = dict(graph.tensors)
    keep: list[Node] = []
    for n in graph.nodes:
        ins = [x for x in n.inputs if x]
        value: list[np.ndarray] | None = None
        if n.domain not in ("", "ai.onnx") or n.op_type in NO_FOLD:
            keep.append(n)
            continue
        if n.op_type in ("Shape", "Size") and ins and ins[0] in tensors:
            fake = np.broadcast_to(np.zeros((), NUMPY[tensors[ins[0]].dtype]),
                                   tensors[ins[0]].shape)
            value = evaluate_node(n, [fake], graph.opset)
        elif all(x in constants for x in ins) and _worth_folding(n, ins, tensors, constants):
            try:
                value = evaluate_node(n, [constants[x] for x in ins], graph.opset)
            except Exception:  # the lowering will say what is wrong with the node
                value = None
        if value is None:
            keep.append(n)
            continue
        for o, v in zip([o for o in n.outputs if o], value):
            info = tensors.get(o)
            v = np.asarray(v)
            if info is not None:
                v = np.asarray(v.astype(NUMPY[info.dtype], copy=False), order="C")
                if tuple(v.shape) != tuple(info.shape):
                    v = v.reshape(info.shape)
            else:
                from .onnx_import import _dtype_of_numpy
                tensors[o] = TensorInfo(o, _dtype_of_numpy(v.dtype, o, n.name),
                                        tuple(v.shape))
            constants[o] = v
        stats["folded"] += 1
    return _replace(graph, nodes=keep, constants=constants, tensors=tensors)


def _worth_folding(n: Node, ins: list[str], tensors: Mapping[str, TensorInfo],
                   constants: Mapping[str, np.ndarray]) -> bool:
    if n.op_type == "ConstantOfShape":
        return True
    out_bytes = 0
    for o in n.outputs:
        if o and o in tensors:
            info = tensors[o]
            out_bytes += int(np.prod(info.shape, dtype=np.int64)) * \
                np.dtype(NUMPY[info.dtype]).itemsize
    in_bytes = sum(constants[x].nbytes for x in ins)
    return out_bytes <= FOLD_LIMIT_BYTES or out_bytes <= 4 * in_bytes


def _redirect(graph: Graph, nodes: list[Node], old: str, new: str) -> tuple[list[Node], bool]:
    """Make every reader of ``old`` read ``new`` (``old`` disappears). If ``old`` is a
    graph output, the producer of ``new`` is renamed to produce ``old`` instead when that
    is possible; returns (nodes, done)."""
    if old not in graph.outputs:
        return _rename_inputs(nodes, {old: new}), True
    # old is a graph output: keep its name, produce it directly
    prod = {o: n for n in nodes for o in n.outputs if o}
    if new in graph.outputs or new in graph.inputs or new in graph.constants \
            or new not in prod:
        return nodes, False
    p = prod[new]
    renamed = _with(p, outputs=tuple(old if o == new else o for o in p.outputs))
    nodes = [renamed if n is p else n for n in nodes]
    return _rename_inputs(nodes, {new: old}), True


def remove_noops(graph: Graph, stats: Counter | None = None) -> Graph:
    """Drop Identity, Dropout in inference (its mask output unused, no constant-true
    ``training_mode``) and Cast to the input's own dtype: readers use the input instead.
    When the removed output is a graph output, the input's producer is renamed to
    produce it; when that is impossible (the input is a graph input or a constant) the
    node stays. Reshape/Flatten/Squeeze/Unsqueeze stay nodes (lowered as views)."""
    stats = stats if stats is not None else Counter()
    users = consumers(graph)
    nodes = list(graph.nodes)
    for n in list(graph.nodes):
        if not _is_noop(n, graph, users):
            continue
        cur = next((m for m in nodes if m.name == n.name), None)
        if cur is None:
            continue
        src, out = cur.inputs[0], cur.outputs[0]
        rest = [m for m in nodes if m is not cur]
        new_nodes, done = _redirect(graph, rest, out, src)
        if done:
            nodes = new_nodes
            stats["noops"] += 1
    g = _replace(graph, nodes=nodes)
    return _prune_tensors(g)


def _is_noop(n: Node, graph: Graph, users: Mapping[str, list[Node]]) -> bool:
    if not n.inputs or not n.inputs[0] or not n.outputs or not n.outputs[0]:
        return False
    x, y = n.inputs[0], n.outputs[0]
    if graph.tensors.get(x) is None or graph.tensors.get(y) is None:
        return False
    same = graph.tensors[x].shape == graph.tensors[y].shape and \
        graph.tensors[x].dtype == graph.tensors[y].dtype
    if n.op_type == "Identity":
        return same
    if n.op_type == "Dropout":
        mask_used = len(n.outputs) > 1 and n.outputs[1] and (
            n.outputs[1] in users or n.outputs[1] in graph.outputs)
        training = n.inputs[2] if len(n.inputs) > 2 else ""
        if training:
            t = graph.constants.get(training)
            if t is None or bool(np.asarray(t).reshape(-1)[0]):
                return False
        if n.attrs.get("is_test", 1) == 0 and graph.opset < 7:
            return False
        return same and not mask_used
    if n.op_type == "Cast":
        return same
    return False


def fold_batchnorm(graph: Graph, stats: Counter | None = None) -> Graph:
    """BatchNormalization (inference) after a Conv or Gemm whose output nothing else
    reads: y = (conv(x) - mean) * s + b with s = scale / sqrt(var + eps) is the Conv with
    weights W * s (per output channel) and bias (B - mean) * s + b. All of W, B and the
    BN parameters must be constants; the folded weights are new constants."""
    stats = stats if stats is not None else Counter()
    users = consumers(graph)
    prod = producers(graph)
    constants = dict(graph.constants)
    tensors = dict(graph.tensors)
    replaced: dict[str, Node] = {}  # conv name -> folded conv
    dropped: set[str] = set()
    for bn in graph.nodes:
        if bn.op_type != "BatchNormalization" or bn.attrs.get("training_mode", 0):
            continue
        if bn.attrs.get("spatial", 1) != 1:
            continue
        if any(o for o in bn.outputs[1:]):
            continue
        x = bn.inputs[0]
        p = prod.get(x)
        if p is None or p.op_type not in ("Conv", "Gemm") or p.name in replaced:
            continue
        if x in graph.outputs or len(users.get(x, [])) != 1 or len(bn.inputs) < 5:
            continue
        params = [constants.get(t) for t in bn.inputs[1:5]]
        if any(v is None for v in params):
            continue
        scale, bias, mean, var = (np.asarray(v, dtype=np.float64) for v in params)
        eps = float(bn.attrs.get("epsilon", 1e-5))
        s = scale / np.sqrt(var + eps)
        folded = _fold_bn_into(p, s, bias, mean, constants, tensors, bn.outputs[0])
        if folded is None:
            continue
        replaced[p.name] = folded
        dropped.add(bn.name)
        stats["batchnorm_folded"] += 1
    if not replaced:
        return graph
    nodes = [replaced.get(n.name, n) for n in graph.nodes if n.name not in dropped]
    g = _replace(graph, nodes=nodes, constants=constants, tensors=tensors)
    return eliminate_dead_nodes(g, stats)


def _fresh(name: str, tensors: Mapping[str, Any]) -> str:
    cand, k = name, 1
    while cand in tensors:
        cand = f"{name}_{k}"
        k += 1
    return cand


def _fold_bn_into(p: Node, s: np.ndarray, bias: np.ndarray, mean: np.ndarray,
                  constants: dict[str, np.ndarray], tensors: dict[str, TensorInfo],
                  out: str) -> Node | None:
    if p.op_type == "Conv":
        if len(p.inputs) < 2 or p.inputs[1] not in constants:
            return None
        w = constants[p.inputs[1]]
        if w.dtype.kind != "f" or w.shape[0] != s.shape[0]:
            return None
        b = constants.get(p.inputs[2]) if len(p.inputs) > 2 and p.inputs[2] else None
        if len(p.inputs) > 2 and p.inputs[2] and b is None:
            return None
        b64 = np.zeros(w.shape[0]) if b is None else np.asarray(b, np.float64)
        w2 = (w.astype(np.float64) * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        b2 = ((b64 - mean) * s + bias).astype(w.dtype)
        wn, bn_ = _fresh(p.inputs[1] + "_bnfold", tensors), _fresh(
            (p.inputs[2] if b is not None else p.name + "_bias") + "_bnfold", tensors)
        constants[wn], constants[bn_] = w2, b2
        dt = tensors[p.inputs[1]].dtype
        tensors[wn] = TensorInfo(wn, dt, tuple(w2.shape))
        tensors[bn_] = TensorInfo(bn_, dt, tuple(b2.shape))
        return _with(p, inputs=(p.inputs[0], wn, bn_), outputs=(out,))
    # Gemm: Y = alpha * A' B' + beta * C, BN over columns (channel axis 1 of (M, N))
    if len(p.inputs) < 2 or p.inputs[1] not in constants:
        return None
    w = constants[p.inputs[1]]
    if w.dtype.kind != "f" or w.ndim != 2:
        return None
    trans_b = p.attrs.get("transB", 0)
    n_cols = w.shape[0] if trans_b else w.shape[1]
    if n_cols != s.shape[0]:
        return None
    beta = float(p.attrs.get("beta", 1.0))  # alpha stays: alpha * A (B s)
    c_name = p.inputs[2] if len(p.inputs) > 2 else ""
    c = constants.get(c_name) if c_name else None
    if c_name and c is None:
        return None
    w2 = w.astype(np.float64) * (s[:, None] if trans_b else s[None, :])
    c64 = np.zeros(n_cols) if c is None else beta * np.asarray(c, np.float64)
    c2 = (c64 - mean) * s + bias
    if c2.ndim > 2:
        return None
    wn = _fresh(p.inputs[1] + "_bnfold", tensors)
    cn = _fresh((c_name or p.name + "_bias") + "_bnfold", tensors)
    constants[wn], constants[cn] = w2.astype(w.dtype), c2.astype(w.dtype)
    dt = tensors[p.inputs[1]].dtype
    tensors[wn] = TensorInfo(wn, dt, tuple(w2.shape))
    tensors[cn] = TensorInfo(cn, dt, tuple(c2.shape))
    attrs = dict(p.attrs)
    attrs["beta"] = 1.0
    return _with(p, inputs=(p.inputs[0], wn, cn), outputs=(out,), attrs=attrs)


def _attr_key(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return ("nd", str(v.dtype), v.shape, hashlib.sha1(v.tobytes()).hexdigest())
    if isinstance(v, (list, tuple)):
        return tuple(_attr_key(x) for x in v)
    if isinstance(v, float):
        return ("f", repr(v))
    if isinstance(v, (int, str, bool)) or v is None:
        return v
    return ("obj", id(v))  # graphs: never equal to another node's


def eliminate_common_subexpressions(graph: Graph, stats: Counter | None = None) -> Graph:
    """Compute once what several nodes compute: nodes with the same op type, domain,
    inputs and attributes (random ops excepted) are merged, readers of the duplicate's
    outputs reading the first one's. Identical constants (dtype, shape and bytes) are
    merged the same way. A duplicate whose output is a graph output stays."""
    stats = stats if stats is not None else Counter()
    renames: dict[str, str] = {}
    protected = set(graph.outputs)
    # identical constants
    by_value: dict[Any, str] = {}
    for name, v in graph.constants.items():
        if name in protected:
            continue
        key = (str(v.dtype), v.shape, hashlib.sha1(np.ascontiguousarray(v).tobytes()).digest())
        if key in by_value:
            renames[name] = by_value[key]
            stats["cse_constants"] += 1
        else:
            by_value[key] = name
    seen: dict[Any, Node] = {}
    nodes: list[Node] = []
    for n in _rename_inputs(graph.nodes, renames):
        n = _rename_inputs([n], renames)[0]
        if n.op_type in NONDETERMINISTIC or any(o in protected for o in n.outputs):
            nodes.append(n)
            continue
        key = (n.op_type, n.domain, n.inputs, len(n.outputs),
               tuple(sorted((k, _attr_key(v)) for k, v in n.attrs.items())))
        first = seen.get(key)
        if first is None:
            seen[key] = n
            nodes.append(n)
            continue
        for a, b in zip(n.outputs, first.outputs):
            if a:
                renames[a] = b
        stats["cse"] += 1
    nodes = _rename_inputs(nodes, renames)
    return eliminate_dead_nodes(_replace(graph, nodes=nodes), stats)


def _per_tensor(tensors: Mapping[str, TensorInfo], scale: str) -> bool:
    """Whether the quantization scale ``scale`` is one value (not per channel)."""
    return tensors[scale].shape in ((), (1,))


#: a QDQ fully-connected layer runs as a 1x1 QDQ convolution (:func:`gemms_as_convs`)
QDQ_GEMM_AS_CONV = True


def gemms_as_convs(graph: Graph, stats: Counter | None = None,
                   float_bias: bool = False) -> Graph:
    """A QDQ fully-connected layer -- a ``Gemm`` (``transA=0``, ``alpha=1``, ``beta=1``)
    or ``MatMul`` of a 2-D ``DequantizeLinear`` of an int8/uint8 input and of a constant
    int8 weight (per tensor, or per output column), maybe a float bias, maybe a Relu,
    then ``QuantizeLinear`` -- becomes the same computation as a 1x1 ``Conv`` over
    ``(N, K, 1, 1)`` between ``Reshape`` s of the quantized tensors, which
    :func:`fuse_qdq_convs` then takes: the weights stay int8 and the sums run on the
    integers (a ResNet-50's classifier streamed 8 MB of float weights per inference
    where it now reads 2 MB). Only the pattern :func:`fuse_qdq_convs` takes: zero points
    given, the input's and output's scales per tensor, and a float bias only with
    ``float_bias`` (the sums on dot products, whose float requantization adds it)."""
    if not QDQ_GEMM_AS_CONV:
        return graph
    stats = stats if stats is not None else Counter()
    made, users = producers(graph), consumers(graph)
    tensors, constants = dict(graph.tensors), dict(graph.constants)
    names = set(tensors) | set(constants) | {n.name for n in graph.nodes}
    fresh = _namer(names, tensors, constants)

    def node_name(base: str) -> str:
        name = _fresh(base, names)
        names.add(name)
        return name
    nodes: list[Node] = []
    gone: set[str] = set()
    for n in graph.nodes:
        if n.name in gone:
            continue
        found = _gemm_as_conv(n, graph, made, users, fresh, node_name, float_bias)
        if found is None:
            nodes.append(n)
            continue
        new, replaced = found
        nodes.extend(new)
        gone.update(replaced)
        stats["qdq_gemms"] += 1
    if not gone:
        return graph
    return eliminate_dead_nodes(_replace(graph, nodes=nodes, tensors=tensors,
                                         constants=constants))


def _gemm_as_conv(n: Node, graph: Graph, made: Mapping[str, Node],
                  users: Mapping[str, list[Node]], fresh, node_name, float_bias: bool
                  ) -> tuple[list[Node], list[str]] | None:
    """:func:`gemms_as_convs` of one node: the nodes replacing it and the names of the
    Relu and QuantizeLinear after it that they replace too; None where it does not
    match."""
    if n.op_type not in ("Gemm", "MatMul") or len(n.inputs) < 2 or not n.outputs:
        return None
    trans_b = n.op_type == "Gemm" and int(n.attrs.get("transB", 0))
    if n.op_type == "Gemm" and (int(n.attrs.get("transA", 0))
                                or float(n.attrs.get("alpha", 1.0)) != 1.0
                                or float(n.attrs.get("beta", 1.0)) != 1.0):
        return None
    t, c = graph.tensors, graph.constants
    dx, dw = made.get(n.inputs[0]), made.get(n.inputs[1])

    def per_tensor(scale: str) -> bool:
        return _per_tensor(t, scale)
    if dx is None or dw is None or dx.op_type != "DequantizeLinear" \
            or dw.op_type != "DequantizeLinear" or len(dw.inputs) < 3 or not dw.inputs[2] \
            or len(dx.inputs) < 3 or not dx.inputs[2] or not per_tensor(dx.inputs[1]):
        return None
    wq, sw = dw.inputs[0], dw.inputs[1]
    xq = dx.inputs[0]
    if wq not in c or c[wq].ndim != 2 or t[wq].dtype != "int8" or len(t[xq].shape) != 2 \
            or t[xq].dtype not in _INT8 or dw.attr("block_size", 0):
        return None
    w = c[wq].T if not trans_b else c[wq]  # (M, K)
    m, k = w.shape
    out_axis = 0 if trans_b else 1  # the weights' output-column axis
    if not per_tensor(sw) and (t[sw].shape != (m,)
                               or int(dw.attr("axis", 1)) % 2 != out_axis):
        return None
    chain = []  # the Relu (maybe) and the QuantizeLinear after the product
    y = n.outputs[0]
    while True:
        after = users.get(y, [])
        if y in graph.outputs or len(after) != 1:
            return None
        nxt = after[0]
        if nxt.op_type == "Relu" and not chain:
            chain.append(nxt)
            y = nxt.outputs[0]
            continue
        if nxt.op_type != "QuantizeLinear" or t[nxt.outputs[0]].dtype not in _INT8 \
                or len(nxt.inputs) < 3 or not nxt.inputs[2] or not per_tensor(nxt.inputs[1]) \
                or not all(i in c for i in nxt.inputs[1:3]):  # (it moves up to the product)
            return None
        chain.append(nxt)
        break
    bias = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else ""
    if bias and (t[bias].shape != (m,) or (
            not (bias in c and float_bias)
            and getattr(made.get(bias), "op_type", "") != "DequantizeLinear")):
        return None  # (a float constant or a DequantizeLinear'd int32 bias, per column)
    rows = t[xq].shape[0]

    def four(name: str, ch: int) -> str:  # a 2-D tensor's (N, C, 1, 1) twin
        return fresh(f"{name}_1x1", t[name].dtype, (rows, ch, 1, 1))
    x4, xd4 = four(xq, k), four(dx.outputs[0], k)
    w4 = fresh(f"{wq}_1x1", "int8", (m, k, 1, 1), np.ascontiguousarray(w).reshape(m, k, 1, 1))
    wd4 = fresh(f"{dw.outputs[0]}_1x1", t[dw.outputs[0]].dtype, (m, k, 1, 1))
    to4 = fresh(f"{x4}_shape", "int64", (4,), np.array([rows, k, 1, 1], np.int64))
    w_attrs = dict(dw.attrs) if per_tensor(sw) else {**dw.attrs, "axis": 0}
    ys = [four(n.outputs[0], m)] + [four(c_.outputs[0], m) for c_ in chain]
    out = chain[-1].outputs[0]
    to2 = fresh(f"{out}_shape", "int64", (2,), np.array([rows, m], np.int64))
    new = [Node(node_name(f"{n.name}_in_1x1"), "Reshape", (xq, to4), (x4,)),
           Node(node_name(f"{dx.name}_1x1"), "DequantizeLinear", (x4,) + tuple(dx.inputs[1:]),
                (xd4,), dict(dx.attrs)),
           Node(node_name(f"{dw.name}_1x1"), "DequantizeLinear", (w4,) + tuple(dw.inputs[1:]),
                (wd4,), w_attrs),
           Node(n.name, "Conv", (xd4, wd4) + ((bias,) if bias else ()), (ys[0],),
                {"kernel_shape": [1, 1]})]
    new += [dataclasses.replace(c_, inputs=(ys[i],) + tuple(c_.inputs[1:]),
                                outputs=(ys[i + 1],)) for i, c_ in enumerate(chain)]
    new.append(Node(node_name(f"{n.name}_out_1x1"), "Reshape", (ys[-1], to2), (out,)))
    return new, [c_.name for c_ in chain]


def fuse_qdq_convs(graph: Graph, stats: Counter | None = None,
                   integer_dot: bool = False, byte_quads: bool = False,
                   winograd: bool | int = False) -> Graph:
    """A QDQ-quantized convolution -- ``DequantizeLinear`` of an int8/uint8 input and
    weight (and of an int32 bias whose scale is the input's times the weight's, or with
    ``integer_dot`` a float bias, in units of the sums: :func:`_qdq_conv`), a float
    Conv, maybe a Relu, then ``QuantizeLinear`` -- becomes one ``QLinearConv`` on the
    integers (a Relu folds into the saturation, ``polyc_relu``). It computes what the
    float graph computes up to the float rounding of its sum (the integer sum is exact),
    as onnxruntime's QDQ fusion does. Patterns that do not match exactly are left alone
    (their float form is correct, only slower). With ``integer_dot`` the QLinearConv
    runs on integer dot products where it can (:func:`_conv_dot`, as
    :func:`convs_as_dot_products` does for a model's own QLinearConv); else it computes
    its sums in float32 where that is exact (:func:`_exact_in_float`); ``byte_quads``:
    in the layouts of 512-bit VNNI (see :func:`convs_as_dot_products`)."""
    stats = stats if stats is not None else Counter()
    made = producers(graph)
    users = consumers(graph)
    outputs = set(graph.outputs)
    fused: dict[str, list[Node]] = {}   # conv name -> the nodes replacing it
    gone: set[str] = set()              # names of the nodes they replace
    tensors, constants = dict(graph.tensors), dict(graph.constants)
    names = set(tensors) | set(constants)
    node_names = {n.name for n in graph.nodes}
    # a float bias only where the sums run on dot products (their float requantization
    # takes it; the exact float sums and the integer convolution add int32 biases)
    fresh = _namer(names, tensors, constants) if integer_dot else None
    for n in graph.nodes:
        if n.op_type != "Conv" or len(n.inputs) < 2:
            continue
        new = _qdq_conv(graph, n, made, users, outputs, fresh)
        if new is not None:
            node, replaced = new
            on_ints = _conv_dot(node, tensors, constants, names, node_names, byte_quads) \
                if integer_dot else None
            if on_ints is None and len(node.inputs) > 8 and \
                    constants[node.inputs[8]].dtype.kind == "f":
                continue  # (left as the float graph computes it)
            stats["conv_dot"] += on_ints is not None
            fused[n.name] = on_ints or _exact_in_float(node, graph, tensors, constants) \
                or [node]
            gone.update(replaced)
    if not fused:
        return graph
    nodes = [m for n in graph.nodes if n.name not in gone or n.name in fused
             for m in fused.get(n.name, [n])]
    stats["qdq_convs"] += len(fused)
    return eliminate_dead_nodes(_replace(graph, nodes=nodes, tensors=tensors,
                                         constants=constants))


def _exact_in_float(q: Node, graph: Graph, tensors: dict[str, TensorInfo],
                    constants: dict[str, np.ndarray]) -> list[Node] | None:
    """The QLinearConv ``q`` as float32 convolutions and a requantization, where float32
    sums are exact: every product and partial sum is an integer below 2**24, bounded from
    the constant weights (per output channel: the sum of ``|w - w_zero|`` times the
    largest ``|x - x_zero|``, plus ``|bias|``). Then the sums are the int32 ones bit for
    bit, and the convolution runs at float speed (its layouts, FMA). A convolution whose
    bound is larger is split along its input channels into convolutions that each stay
    below it; their exact partial sums are added in int32. None where the zero points or
    weights are not constants, or the convolution is grouped."""
    xq, _, zx, wq, _, zw = q.inputs[:6]
    bias = q.inputs[8] if len(q.inputs) > 8 else ""
    if not all(t in constants for t in (zx, wq, zw) + ((bias,) if bias else ())):
        return None
    if bias and constants[bias].dtype.kind == "f":  # (a float bias: no exact int32 sums)
        return None
    w = constants[wq].astype(np.int64)
    zwv = constants[zw].astype(np.int64).reshape(-1)
    zwv = zwv.reshape((-1,) + (1,) * (w.ndim - 1)) if zwv.size > 1 else zwv.reshape(())
    w = w - zwv
    zxv = int(constants[zx].reshape(-1)[0])
    lo, hi = D.get(tensors[xq].dtype).limits
    xmax = max(abs(lo - zxv), abs(hi - zxv))
    b = constants[bias].astype(np.int64) if bias else np.zeros(w.shape[0], np.int64)
    if int(q.attr("group", 1)) != 1 or w.ndim < 3:
        return None
    per_c = np.abs(w).reshape(w.shape[0], w.shape[1], -1).sum(axis=2) * xmax  # (M, C)
    chunks, start, limit = [], 0, 2 ** 24
    while start < w.shape[1]:  # channel ranges, each with every sum below 2**24
        total = np.abs(b) if not chunks else np.zeros_like(b)
        end = start
        while end < w.shape[1] and (total + per_c[:, end]).max() < limit:
            total = total + per_c[:, end]
            end += 1
        if end == start:  # one channel alone overflows the bound
            return None
        chunks.append((start, end))
        start = end
    if len(chunks) > 8:
        return None
    shape = tensors[xq].shape
    fresh = _namer(set(tensors) | set(constants), tensors, constants)
    xc = fresh(f"{xq}_f32", "float32", shape)
    nodes = [Node(f"{q.name}_widen", "Cast", (xq,), (xc,), {"to": onnx.TensorProto.FLOAT})]
    xf = xc
    if zxv:
        zf = fresh(f"{zx}_f32", "float32", (), np.array(zxv, np.float32))
        xf = fresh(f"{xq}_centred", "float32", shape)
        nodes.append(Node(f"{q.name}_centre", "Sub", (xc, zf), (xf,)))
    y = q.outputs[0]
    # polyc_exact: the sums must be exact (no Winograd: onnx_layout.wants_winograd)
    conv_attrs = {**{k: v for k, v in q.attrs.items() if k != "polyc_relu"},
                  "polyc_exact": 1}
    parts = []
    for i, (c0, c1) in enumerate(chunks):
        xi = xf
        if len(chunks) > 1:
            xi = fresh(f"{xf}_c{c0}", "float32", (shape[0], c1 - c0) + tuple(shape[2:]))
            consts = [fresh(f"{xi}_{k}", "int64", (1,), np.array([v], np.int64))
                      for k, v in (("start", c0), ("end", c1), ("axis", 1))]
            nodes.append(Node(f"{q.name}_slice{i}", "Slice", (xf, *consts), (xi,)))
        wf = fresh(f"{wq}_f32_{c0}", "float32", (w.shape[0], c1 - c0) + w.shape[2:],
                   w[:, c0:c1].astype(np.float32))
        ins = (xi, wf)
        if bias and i == 0:
            ins += (fresh(f"{bias}_f32", "float32", b.shape, b.astype(np.float32)),)
        part = fresh(f"{y}_sum{i}", "float32", tensors[y].shape)
        nodes.append(Node(f"{q.name}_part{i}" if i else q.name, "Conv", ins, (part,),
                          conv_attrs))
        parts.append(part)
    acc = parts[0]
    if len(parts) > 1:  # the exact partial sums, added in int32
        ints = []
        for i, part in enumerate(parts):
            pi = fresh(f"{part}_i32", "int32", tensors[y].shape)
            nodes.append(Node(f"{q.name}_exact{i}", "Cast", (part,), (pi,),
                              {"to": onnx.TensorProto.INT32}))
            ints.append(pi)
        acc = fresh(f"{y}_sum", "int32", tensors[y].shape)
        nodes.append(Node(f"{q.name}_sum", "Sum", tuple(ints), (acc,)))
    nodes.append(_requantization(q, f"{q.name}_requantize", acc, "", y, constants, fresh, {}))
    return nodes


def _requantization(q: Node, name: str, acc: str, bias: str, y: str,
                    constants: Mapping[str, np.ndarray], fresh, attrs: dict) -> Node:
    """The ``PolycRequantize`` of the QLinearConv ``q``'s int32 sums ``acc`` (plus the
    int32 ``bias`` per output channel when given) into ``y``. When the three scales are
    float32 constants, per tensor but for the weights', the multiplier ``x_scale *
    w_scale / y_scale`` is computed here, in float32 as the C would (the same bits), into
    a constant (``polyc_multiplier``): a convolution's copy-out then loads it instead of
    dividing at every element of every tile."""
    _, sx, _, _, sw, _, sy, zy = q.inputs[:8]
    attrs = {"polyc_relu": q.attr("polyc_relu", 0), "polyc_float": q.attr("polyc_float", 0),
             **attrs}
    ins = (acc, sx, sw, sy, zy)
    scales = [constants.get(t) for t in (sx, sw, sy)]
    if all(c is not None and c.dtype == np.float32 for c in scales) and \
            scales[0].size == 1 and scales[2].size == 1:
        s_x, s_w, s_y = scales
        mult = np.asarray((s_x.reshape(()) * s_w.reshape(-1 if s_w.size > 1 else ()))
                          / s_y.reshape(()), np.float32)
        ins = (acc, fresh(f"{y}_multiplier", "float32", mult.shape, mult), "", "", zy)
        attrs["polyc_multiplier"] = 1
    return Node(name, "PolycRequantize", ins + ((bias,) if bias else ()), (y,), attrs)


def convs_as_dot_products(graph: Graph, stats: Counter | None = None,
                          quads: bool = False) -> Graph:
    """Each ``QLinearConv`` (a model's own, or a fused QDQ convolution) with constant
    weights, zero weight zero points, a constant input zero point and one group becomes
    integer code built for the CPU's dot-product instructions:

    * ``PolycIm2Col``: the input's patches, ``cols[n, o.., k.., c]`` (the padding is the
      input zero point), so one output pixel's reduction is one contiguous run;
    * ``PolycConvDot``: ``acc[n, m, o..] = sum_k cols[n, o.., k] * wt[m, k]`` in int32,
      the weights laid out ``(M, K)`` at compile time -- both operands contiguous along
      the reduction, the form the scheduler's dot-product register tiles take (int8
      products become ``vpdpbusd`` on a CPU with VNNI);
    * ``PolycRequantize`` with a bias of ``bias - x_zero * sum_k wt[m, k]`` (the input
      zero point's share of the sum, taken out exactly).

    With ``quads`` (512-bit VNNI; uint8 input, int8 weights) the layouts are those of
    ``vpdpbusd`` outer products instead: patches ``cols[n, k.., c/4, o.., c%4]`` (the
    channels in groups of four, zero-padded: one 32-bit lane a pixel), the sums
    ``acc[n, m, p]`` over the flat pixels ``p``, and the weights ``(K/4, M', 4)`` (a
    step's rows side by side; ``M' >= M``: :func:`_odd_lines`), so that
    ``acc(n, m, p) +=! sum_r int32(cols(n, q, p, r)) * int32(wt(q, m, r))`` is a byte
    dot product (:func:`polyc.ir.quad_dot`) whose register tiles vectorize the pixels.
    A 2-D convolution with at least :data:`polyc.ir.QUAD_LANES` output channels runs
    channel-last instead, between ``Transpose`` nodes that
    :func:`.onnx_layout.sink_transposes` later cancels between convolutions: patches
    ``cols[n, o.., k.., c]`` of the NHWC input (none for a unit-stride unpadded 1x1
    convolution over a multiple of four channels: the input itself), the sums
    ``acc[n, p, m]``, ``acc(n, p, m) +=! sum_r int32(cols(n, p, q, r)) *
    int32(wt(q, m, r))`` -- the output channels on the lanes (the int8 weights' vectors;
    :attr:`polyc.ir.QuadDot.signed_lanes`), the pixels the register tile's rows --
    and an NHWC output. Every layer of ResNet-50 fills its vectors so (a 7x7 layer's 49
    pixels filled 49 of 64 pixel lanes).

    The sums are exact; the result is QLinearConv's bit for bit."""
    stats = stats if stats is not None else Counter()
    tensors, constants = dict(graph.tensors), dict(graph.constants)
    names = set(tensors) | set(constants)
    node_names = {n.name for n in graph.nodes}
    nodes: list[Node] = []
    done = 0
    for n in graph.nodes:
        new = _conv_dot(n, tensors, constants, names, node_names, quads) \
            if n.op_type == "QLinearConv" else None
        nodes.extend(new or [n])
        done += new is not None
    if not done:
        return graph
    stats["conv_dot"] += done
    return eliminate_dead_nodes(_replace(graph, nodes=nodes, tensors=tensors,
                                         constants=constants))


def _dot_weights(q: Node, tensors: Mapping[str, TensorInfo],
                 constants: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """For a QLinearConv that :func:`convs_as_dot_products` can take: its weights laid
    out ``(M, K)`` (``K`` = kernel positions x input channels, channels fastest) and the
    int32 bias with the input zero point's share taken out; else None. The int32 sums of
    the uncentred products must not overflow: the largest ``|x|`` of the input's type
    times the largest ``sum_k |wt[m, k]|`` stays below 2**31, and so does the bias."""
    xq, _, zx, wq, _, zw, _, zy = (list(q.inputs) + [""] * 8)[:8]
    bias = q.inputs[8] if len(q.inputs) > 8 else ""
    if not all(t and t in constants for t in (zx, wq, zw) + ((bias,) if bias else ())) or \
            int(q.attr("group", 1)) != 1 or not zy or not q.outputs:
        return None
    w = constants[wq].astype(np.int64)
    if w.ndim < 3 or tensors[xq].dtype not in _INT8 or tensors[wq].dtype not in _INT8 \
            or np.any(constants[zw] != 0) or constants[zx].size != 1:
        return None
    if list(q.attr("kernel_shape", w.shape[2:])) != list(w.shape[2:]):
        return None
    m = w.shape[0]
    if bias and constants[bias].size != m:
        return None
    wt = np.moveaxis(w, 1, -1).reshape(m, -1)  # (M, k.., C): the patches' order
    lo, hi = D.get(tensors[xq].dtype).limits
    if max(abs(lo), abs(hi)) * int(np.abs(wt).sum(axis=1).max(initial=0)) >= 2 ** 31:
        return None
    zxv = int(constants[zx].reshape(-1)[0])
    if bias and constants[bias].dtype.kind == "f":  # in units of the sums, added in float
        return wt, constants[bias].astype(np.float64).reshape(-1) - zxv * wt.sum(axis=1)
    b = constants[bias].astype(np.int64).reshape(-1) if bias else np.zeros(m, np.int64)
    b = b - zxv * wt.sum(axis=1)
    if np.abs(b).max(initial=0) >= 2 ** 31:
        return None
    return wt, b


def _conv_dot(q: Node, tensors: dict[str, TensorInfo], constants: dict[str, np.ndarray],
              names: set[str], node_names: set[str], quads: bool) -> list[Node] | None:
    found = _dot_weights(q, tensors, constants)
    if found is None:
        return None
    wt, b = found
    xq, wq = q.inputs[0], q.inputs[3]
    bias = q.inputs[8] if len(q.inputs) > 8 else ""
    m = wt.shape[0]
    y = q.outputs[0]
    xs, ys = tensors[xq].shape, tensors[y].shape

    fresh = _namer(names, tensors, constants)

    def node_name(base: str) -> str:
        name = _fresh(base, node_names)
        node_names.add(name)
        return name
    geometry = {k: v for k, v in q.attrs.items() if k in ("auto_pad", "dilations", "pads",
                                                          "strides", "kernel_shape")}
    kernel = tuple(int(d) for d in constants[wq].shape[2:])
    geometry["kernel_shape"] = list(kernel)
    quad = quads and tensors[xq].dtype == "uint8" and tensors[wq].dtype == "int8"
    nhwc = quad and m >= QUAD_LANES and len(xs) == 4
    pixels = int(np.prod(ys[2:]))
    if quad:  # vpdpbusd's operands: groups of 4 channels (padded with zero weights)
        c4 = -(-xs[1] // 4)
        geometry["polyc_quad"] = 1
        # (Q, M, 4): a step's weights of consecutive output channels side by side (one
        # pointer for a register tile's rows, or one vector of 16 channels)
        wt = np.pad(wt.reshape(m, -1, xs[1]), ((0, 0), (0, 0), (0, 4 * c4 - xs[1])))
        wt = np.ascontiguousarray(wt.reshape(m, -1, 4).transpose(1, 0, 2))
        wt = np.pad(wt, ((0, 0), (0, _odd_lines(m) - m), (0, 0)))
    if nhwc:  # channel-last: the output channels on the lanes, between Transposes
        geometry["polyc_layout"] = "nhwc"
        xt = fresh(f"{xq}_nhwc", tensors[xq].dtype, tuple(xs[i] for i in TO_NHWC))
        # a unit-stride unpadded 1x1 convolution over whole quads reads its input in place
        pointwise = pointwise_unpadded(q, constants[wq]) and xs[1] % 4 == 0 and \
            xs[2:] == ys[2:]
        cols = xt if pointwise else fresh(f"{xq}_patches", tensors[xq].dtype,
                                          (xs[0],) + tuple(ys[2:]) + kernel + (4 * c4,))
        acc = fresh(f"{y}_sum", "int32", (ys[0], pixels, m))
        yt = fresh(f"{y}_nhwc", tensors[y].dtype, tuple(ys[i] for i in TO_NHWC))
    elif quad:
        cols = fresh(f"{xq}_patches", tensors[xq].dtype,
                     (xs[0],) + kernel + (c4,) + tuple(ys[2:]) + (4,))
        acc = fresh(f"{y}_sum", "int32", (ys[0], m, pixels))
    else:
        cols = fresh(f"{xq}_patches", tensors[xq].dtype,
                     (xs[0],) + tuple(ys[2:]) + kernel + (xs[1],))
        acc = fresh(f"{y}_sum", "int32", ys)
    wtn = fresh(f"{wq}_rows", tensors[wq].dtype, wt.shape,
                wt.astype(constants[wq].dtype))
    b_type = "float32" if b.dtype.kind == "f" else "int32"  # (a float bias: in float)
    bn = fresh(f"{bias or y}_centred", b_type, (m,), b.astype(b_type))
    if nhwc:
        layout = {"polyc_layout": "nhwc"}
        nodes = [Node(node_name(f"{q.name}_to_nhwc"), "Transpose", (xq,), (xt,),
                      {"perm": list(TO_NHWC)})]
        source = xt
        if cols != xt and xs[1] % 4 and QUAD_INPUT and _scalar(q.inputs[2], tensors):
            # channels padded to whole quads with the zero point: each patch then copies
            # whole 4-byte pixels, contiguous along the kernel's row (an RGB stem's
            # patches took 0.64 ms as three byte scatters and a fill of the fourth)
            source = fresh(f"{xq}_quads", tensors[xq].dtype, tuple(xs[i] for i in TO_NHWC)
                           [:-1] + (4 * c4,))
            pads = fresh(f"{xq}_quad_pads", "int64", (8,),
                         np.array([0, 0, 0, 0, 0, 0, 0, 4 * c4 - xs[1]], np.int64))
            nodes.append(Node(node_name(f"{q.name}_quads"), "Pad", (xt, pads, q.inputs[2]),
                              (source,), {"mode": "constant"}))
        if cols != xt:
            nodes.append(Node(node_name(f"{q.name}_patches"), "PolycIm2Col",
                              (source, q.inputs[2]), (cols,), geometry))
        return nodes + [
            Node(q.name, "PolycConvDot", (cols, wtn), (acc,), {"polyc_quad": 1, **layout}),
            _requantization(q, node_name(f"{q.name}_requantize"), acc, bn, yt, constants,
                            fresh, layout),
            Node(node_name(f"{q.name}_to_nchw"), "Transpose", (yt,), (y,),
                 {"perm": list(TO_NCHW)})]
    patches = Node(node_name(f"{q.name}_patches"), "PolycIm2Col", (xq, q.inputs[2]), (cols,),
                   geometry)
    return [patches,
            Node(q.name, "PolycConvDot", (cols, wtn), (acc,), {"polyc_quad": 1} if quad else {}),
            _requantization(q, node_name(f"{q.name}_requantize"), acc, bn, y, constants,
                            fresh, {})]


#: a channel-last byte-quad conv over channels that are no whole quads (an RGB stem)
#: reads its input padded to quads (:func:`_conv_dot`)
QUAD_INPUT = True


def _scalar(name: str, tensors: Mapping[str, TensorInfo]) -> bool:
    """``name`` is a tensor of one element given as a scalar (Pad's constant_value)."""
    return name in tensors and tensors[name].shape == ()


def _odd_lines(m: int) -> int:
    """Output channels of a byte-quad weight row ``(M, 4)`` padded to an odd number of
    64-byte cache lines (past one line): a register tile reads a few lines of each row,
    rows ``4 M`` bytes apart; at 256 or 512 channels (1 or 2 KB) those lines fall in a
    few of the L1's 64 sets and evict each other, while rows an odd number of lines
    apart fall in every set."""
    lines = -(-m * 4 // 64)
    return m if lines <= 1 else 16 * (lines + 1 - lines % 2)


_INT8 = ("int8", "uint8")
#: the contractions a float16 model computes in float32 (its weights converted once)
_CONTRACTIONS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
#: the half types, computed in float32 (:mod:`polyc.dtypes`)
_HALF = ("float16", "bfloat16")
#: their ONNX element types (a Cast's ``to``)
_HALF_PROTO = {"float16": onnx.TensorProto.FLOAT16, "bfloat16": onnx.TensorProto.BFLOAT16}


def contractions_in_float(graph: Graph, stats: Counter | None = None) -> Graph:
    """A Conv, ConvTranspose, MatMul or Gemm on float16 (or bfloat16) reads its operands
    converted to float32 and rounds its result once: ``Cast(op(Cast(x), Cast(w)))``.

    polyc sums a float16 contraction in float32 anyway (``polyc.widen``) and products of
    float16 values are exact in float32, so this is the same arithmetic, with the bias
    added before the one rounding. It is much faster: each operand element is widened
    once instead of at each of its uses in the inner loop, the weights at compile time
    (the Casts of constants fold), and the float32 convolution layouts apply."""
    stats = stats if stats is not None else Counter()
    tensors = dict(graph.tensors)
    nodes: list[Node] = []
    node_names = {n.name for n in graph.nodes}
    changed = 0
    for n in graph.nodes:
        out = n.outputs[0] if n.outputs else ""
        half = out and tensors[out].dtype in _HALF
        if n.op_type not in _CONTRACTIONS or not half or len(n.outputs) != 1 or \
                any(x and tensors[x].dtype != tensors[out].dtype for x in n.inputs):
            nodes.append(n)
            continue
        ins = []
        for x in n.inputs:
            if not x:
                ins.append(x)
                continue
            wide = _fresh(f"{x}_f32", tensors)
            tensors[wide] = TensorInfo(wide, "float32", tensors[x].shape)
            widen = _fresh(f"{n.name}_widen_{len(ins)}", node_names)
            node_names.add(widen)
            nodes.append(Node(widen, "Cast", (x,), (wide,), {"to": onnx.TensorProto.FLOAT}))
            ins.append(wide)
        wide_out = _fresh(f"{out}_f32", tensors)
        tensors[wide_out] = TensorInfo(wide_out, "float32", tensors[out].shape)
        nodes.append(_with(n, inputs=tuple(ins), outputs=(wide_out,)))
        to = _HALF_PROTO[tensors[out].dtype]
        rounding = _fresh(f"{n.name}_round", node_names)
        node_names.add(rounding)
        nodes.append(Node(rounding, "Cast", (wide_out,), (out,), {"to": to}))
        changed += 1
    if not changed:
        return graph
    stats["half_in_float"] += changed
    return _replace(graph, nodes=nodes, tensors=tensors)


#: float16 (bfloat16) ops whose result is the float32 operation on their widened
#: operands, rounded once (Sum of at most two): float32's 24 bits are at least 2p + 2
#: for p = 11 (and 8), so for +, -, * and / rounding the correctly rounded float32
#: result again gives the correctly rounded float16 result (no double-rounding error)
_ROUNDED_ONCE = frozenset(["Add", "Sub", "Mul", "Div", "Sum"])
#: float16 ops whose every result element is one of their inputs' elements (or a
#: bound): exact in float32 on float16 values, no rounding after
_EXACT_ON_HALF = frozenset(["Relu", "Max", "Min", "Neg", "Abs", "Clip", "MaxPool",
                            "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
                            "Identity", "Concat"])


def half_values_in_float(graph: Graph, stats: Counter | None = None) -> Graph:
    """float16 (bfloat16) tensors between float16 ops held in float32 storage.

    A float16 value is computed in float32 and rounded (:mod:`polyc.dtypes`); stored as
    float16, each write converts it to its bits and each read back, and a float16 tensor
    that several nodes read is stored so (ResNet-50's residual sums, each read by the
    next block's convolution and its residual add: about 10% of the float16 model's
    time). Here such a tensor becomes a float32 one holding the same values:

    * a rounding ``Cast`` to float16 of a float32 value (what
      :func:`contractions_in_float` makes) becomes ``PolycRoundHalf``: the rounded value
      in float32;
    * an op of :data:`_ROUNDED_ONCE` runs on float32 operands and is followed by
      ``PolycRoundHalf``, an op of :data:`_EXACT_ON_HALF` just runs on float32 operands;
    * a ``Cast`` to float32 of such a tensor is the float32 tensor itself;
    * any other reader (and a graph output) reads a ``Cast`` back to float16 (exact).

    Every value is the same, bit for bit: only where it is stored changes."""
    stats = stats if stats is not None else Counter()
    users = consumers(graph)
    tensors = dict(graph.tensors)
    names = {n.name for n in graph.nodes}
    protected = set(graph.outputs)
    wide: dict[str, str] = {}      # float16 tensor -> the float32 tensor of its values
    have = set(graph.inputs) | set(graph.constants)  # float16 tensors computed as such
    renames: dict[str, str] = {}
    nodes: list[Node] = []

    def dtype(x: str) -> str:
        return tensors[x].dtype if x in tensors else ""

    def fresh_node(base: str) -> str:
        name = _fresh(base, names)
        names.add(name)
        return name

    def fresh_f32(x: str) -> str:
        t = _fresh(f"{x}_f32", tensors)
        tensors[t] = TensorInfo(t, "float32", tensors[x].shape)
        return t

    def widened(x: str) -> str:
        if x not in wide:
            wide[x] = fresh_f32(x)
            nodes.append(Node(fresh_node(f"{x}_widen"), "Cast", (x,), (wide[x],),
                              {"to": onnx.TensorProto.FLOAT}))
        return wide[x]

    def rounded(x: str, y: str, half: str, base: str) -> None:
        wide[y] = fresh_f32(y)
        nodes.append(Node(fresh_node(f"{base}_round"), "PolycRoundHalf", (x,), (wide[y],),
                          {"half": half}))

    def read_by_float(y: str) -> bool:
        """Some reader of ``y`` takes its float32 values."""
        return any(_safe_half(r, tensors) or _widening(r, tensors)
                   for r in users.get(y, []))

    changed = 0
    for n in graph.nodes:
        y = n.outputs[0] if len(n.outputs) == 1 else ""
        if _widening(n, tensors) and n.inputs[0] in wide and y not in protected:
            renames[y] = wide[n.inputs[0]]
            continue
        if n.op_type == "Cast" and y and dtype(y) in _HALF and dtype(n.inputs[0]) == "float32" \
                and read_by_float(y):
            rounded(n.inputs[0], y, dtype(y), n.name)
            changed += 1
            continue
        if _safe_half(n, tensors) and (read_by_float(y) or y in protected):
            half = dtype(y)
            ins = tuple(widened(x) if x and dtype(x) == half else x for x in n.inputs)
            if n.op_type in _ROUNDED_ONCE:
                out = fresh_f32(y)
                nodes.append(_with(n, inputs=ins, outputs=(out,)))
                rounded(out, y, half, n.name)
            else:
                wide[y] = fresh_f32(y)
                nodes.append(_with(n, inputs=ins, outputs=(wide[y],)))
            changed += 1
            continue
        for x in n.inputs:
            if x in wide and x not in have:
                nodes.append(_half_of(x, wide[x], tensors, fresh_node))
                have.add(x)
        nodes.append(n)
        have.update(o for o in n.outputs if o)
    for x in graph.outputs:
        if x in wide and x not in have:
            nodes.append(_half_of(x, wide[x], tensors, fresh_node))
    if not changed:
        return graph
    stats["half_values_in_float"] += changed
    nodes = _rename_inputs(nodes, renames)
    return eliminate_dead_nodes(_replace(graph, nodes=nodes, tensors=tensors))


def _widening(n: Node, tensors: Mapping[str, TensorInfo]) -> bool:
    """``n`` is a Cast of a float16 (bfloat16) tensor to float32."""
    return n.op_type == "Cast" and len(n.outputs) == 1 and bool(n.inputs) and \
        n.inputs[0] in tensors and tensors[n.inputs[0]].dtype in _HALF and \
        tensors[n.outputs[0]].dtype == "float32"


def _safe_half(n: Node, tensors: Mapping[str, TensorInfo]) -> bool:
    """``n`` computes the same float16 (bfloat16) values from its operands' float32
    values (:data:`_ROUNDED_ONCE`, :data:`_EXACT_ON_HALF`): one output of a half type,
    and every float operand of that type."""
    if n.op_type not in _ROUNDED_ONCE | _EXACT_ON_HALF or n.domain not in ("", "ai.onnx") \
            or len(n.outputs) != 1 or not n.outputs[0] \
            or n.op_type == "Sum" and len(n.inputs) > 2:  # rounded after each addition
        return False
    half = tensors[n.outputs[0]].dtype
    if half not in _HALF:
        return False
    floats = [x for x in n.inputs if x and D.get(tensors[x].dtype).kind == "f"]
    return bool(floats) and all(tensors[x].dtype == half for x in floats)


def _half_of(x: str, wide: str, tensors: Mapping[str, TensorInfo],
             fresh_node: Callable[[str], str]) -> Node:
    """The node computing the float16 tensor ``x`` back from its float32 values (exact)."""
    return Node(fresh_node(f"{x}_narrow"), "Cast", (wide,), (x,),
                {"to": _HALF_PROTO[tensors[x].dtype]})


def pools_on_integers(graph: Graph, stats: Counter | None = None) -> Graph:
    """A MaxPool between a per-tensor ``DequantizeLinear`` and ``QuantizeLinear`` of the
    same constant scale and zero point (a QDQ model's pool) pools the integers:
    ``Q(MaxPool(DQ(q)))`` becomes ``MaxPool(q)``. Dequantization by a positive scale
    is increasing, so the maximum of the dequantized values is the dequantized maximum,
    and quantizing it again gives that integer back (``(v - z) * s / s`` is within far
    less than half a unit of ``v - z``); the pool's padding is never read. The pool
    then reads a byte an element instead of a float (ResNet-50's stem pool), and stays
    between channel-last convolutions (:func:`.onnx_layout.sink_transposes`)."""
    stats = stats if stats is not None else Counter()
    made, users, c = producers(graph), consumers(graph), graph.constants

    def params(n: Node) -> tuple | None:
        """(scale, zero point, integer type) of a per-tensor (De)QuantizeLinear whose
        parameters are constants; None otherwise."""
        if len(n.inputs) < 3 or not all(t in c for t in n.inputs[1:3]) or \
                n.attr("block_size", 0) or n.attr("saturate", 1) != 1:
            return None
        scale, zero = c[n.inputs[1]], c[n.inputs[2]]
        if scale.size != 1 or zero.size != 1 or scale.dtype != np.float32 or \
                str(zero.dtype) not in _INT8 or not 1e-30 < float(scale.reshape(-1)[0]) < 1e30:
            return None
        return (float(scale.reshape(-1)[0]), int(zero.reshape(-1)[0]), str(zero.dtype))
    tensors = dict(graph.tensors)
    nodes: list[Node] = []
    renames: dict[str, str] = {}
    gone: set[str] = set()
    for n in graph.nodes:
        if n.name in gone:
            continue
        d = made.get(n.inputs[0]) if n.op_type == "MaxPool" and n.inputs else None
        y = n.outputs[0] if n.outputs else ""
        readers = users.get(y, [])
        want = params(d) if d is not None and d.op_type == "DequantizeLinear" else None
        if want is None or len(n.outputs) != 1 or y in graph.outputs or not readers or \
                not all(r.op_type == "QuantizeLinear" and params(r) == want and
                        r.outputs[0] not in graph.outputs for r in readers):
            nodes.append(n)
            continue
        q = d.inputs[0]
        out = readers[0].outputs[0]
        tensors[out] = TensorInfo(out, tensors[q].dtype, tensors[y].shape)
        nodes.append(_with(n, inputs=(q,), outputs=(out,)))
        renames.update({r.outputs[0]: out for r in readers[1:]})
        gone.update(r.name for r in readers)
        stats["pools_on_integers"] += 1
    if not gone:
        return graph
    nodes = _rename_inputs(nodes, renames)
    return eliminate_dead_nodes(_replace(graph, nodes=nodes, tensors=tensors))


def _qdq_conv(graph: Graph, conv: Node, made: Mapping[str, Node],
              users: Mapping[str, list[Node]], outputs: set[str], fresh=None
              ) -> tuple[Node, list[str]] | None:
    def dq(t: str) -> Node | None:
        p = made.get(t)
        if p is None or p.op_type != "DequantizeLinear" or len(p.inputs) < 3 \
                or not p.inputs[2] or p.attr("block_size", 0):
            return None
        return p
    dx, dw = dq(conv.inputs[0]), dq(conv.inputs[1])
    if dx is None or dw is None:
        return None
    xq, sx, zx = dx.inputs[:3]
    wq, sw, zw = dw.inputs[:3]
    t = graph.tensors
    if t[xq].dtype not in _INT8 or t[wq].dtype not in _INT8 or not _per_tensor(t, sx):
        return None
    if not _per_tensor(t, sw) and (t[sw].shape != (t[wq].shape[0],)
                                          or dw.attr("axis", 1) != 0):
        return None
    bias = ""
    c = graph.constants
    float_bias = None
    if len(conv.inputs) > 2 and conv.inputs[2] and conv.inputs[2] in c and fresh:
        # a float bias (a QDQ Gemm's, :func:`gemms_as_convs`): in units of the sums,
        # ``b / (x_scale * w_scale)``, added to them in float as an int32 bias would be
        if not all(x in c for x in (sx, sw)) or c[conv.inputs[2]].dtype != np.float32:
            return None
        units = (c[sx].astype(np.float64).reshape(-1)[0] *
                 c[sw].astype(np.float64).reshape(-1))
        if not np.all(np.isfinite(units)) or np.any(units == 0):
            return None
        float_bias = (c[conv.inputs[2]].astype(np.float64).reshape(-1) / units
                      ).astype(np.float32)
    elif len(conv.inputs) > 2 and conv.inputs[2]:
        db = made.get(conv.inputs[2])
        if db is None or db.op_type != "DequantizeLinear" or t[db.inputs[0]].dtype != "int32":
            return None
        if not all(x in c for x in (sx, sw, db.inputs[1])):
            return None
        want = (c[sx].astype(np.float32).reshape(-1)[0] *
                c[sw].astype(np.float32).reshape(-1)).astype(np.float32)
        sb = c[db.inputs[1]].astype(np.float32).reshape(-1)
        if len(db.inputs) > 2 and db.inputs[2] and (db.inputs[2] not in c
                                                    or np.any(c[db.inputs[2]] != 0)):
            return None
        if sb.shape != want.shape and sb.size != 1 and want.size != 1:
            return None
        if not np.array_equal(np.broadcast_to(sb, np.broadcast(sb, want).shape),
                              np.broadcast_to(want, np.broadcast(sb, want).shape)):
            return None
        bias = db.inputs[0]
    y = conv.outputs[0]
    replaced = [conv.name]
    relu = False
    after = users.get(y, [])
    if y in outputs or len(after) != 1:
        return None
    nxt = after[0]
    if nxt.op_type == "Relu":
        relu = True
        replaced.append(nxt.name)
        if nxt.outputs[0] in outputs or len(users.get(nxt.outputs[0], [])) != 1:
            return None
        nxt = users[nxt.outputs[0]][0]
    if nxt.op_type != "QuantizeLinear" or len(nxt.inputs) < 3 or not nxt.inputs[2]:
        return None
    sy, zy = nxt.inputs[1], nxt.inputs[2]
    if not _per_tensor(t, sy) or t[nxt.outputs[0]].dtype not in _INT8:
        return None
    replaced.append(nxt.name)
    attrs = {k: v for k, v in conv.attrs.items()}
    if relu:
        attrs["polyc_relu"] = 1
    attrs["polyc_float"] = 1  # the float32 graph's arithmetic: requantized in float
    if float_bias is not None and fresh is not None:
        bias = fresh(f"{conv.inputs[2]}_in_sums", "float32", float_bias.shape, float_bias)
    node = Node(conv.name, "QLinearConv", (xq, sx, zx, wq, sw, zw, sy, zy) +
                ((bias,) if bias else ()), (nxt.outputs[0],), attrs)
    return node, replaced


def eliminate_dead_nodes(graph: Graph, stats: Counter | None = None) -> Graph:
    """Drop nodes none of whose outputs is read (by a live node) or a graph output, and
    constants and tensor records nothing refers to any more."""
    stats = stats if stats is not None else Counter()
    live: set[str] = set(graph.outputs)
    kept: list[Node] = []
    for n in reversed(graph.nodes):
        if any(o in live for o in n.outputs if o):
            kept.append(n)
            live.update(x for x in n.inputs if x)
        else:
            stats["dead"] += 1
    kept.reverse()
    return _prune_tensors(_replace(graph, nodes=kept))


def _prune_tensors(graph: Graph) -> Graph:
    used = set(graph.inputs) | set(graph.outputs)
    for n in graph.nodes:
        used.update(x for x in n.inputs if x)
        used.update(o for o in n.outputs if o)
    constants = {k: v for k, v in graph.constants.items() if k in used}
    tensors = {k: v for k, v in graph.tensors.items() if k in used}
    return _replace(graph, constants=constants, tensors=tensors)


def optimize_graph(graph: Graph, stats: dict[str, int] | None = None,
                   integer_dot: bool = False, byte_quads: bool = False,
                   winograd: bool | int = False, widest_block: int = 64) -> Graph:
    """Every pass, in a fixed order (see the module doc). The counts of what was done go
    into ``stats`` when given, and are returned by :func:`pass_stats` afterwards.
    ``integer_dot``: the target CPU has integer dot-product instructions (VNNI), so
    quantized convolutions run on the integers (:func:`convs_as_dot_products`) rather
    than as exact float convolutions; ``byte_quads``: with 512-bit VNNI, in the layout of
    its outer-product micro-kernels (:func:`convs_as_dot_products`); ``winograd``: dense
    3x3 unit-stride float32 Convs run by Winograd's algorithm (:func:`.onnx_layout.
    wants_winograd`; True, or the output tile 2 or 4); ``widest_block``: the register
    tile's float columns on the target, the widest block constant weights are laid out
    in (:func:`.onnx_layout.channel_block`)."""
    c: Counter = Counter()
    before = len(graph.nodes)
    # before folding turns DequantizeLinear(W) into floats
    graph = gemms_as_convs(graph, c, float_bias=integer_dot)
    graph = fuse_qdq_convs(graph, c, integer_dot=integer_dot, byte_quads=byte_quads)
    graph = fold_empty_tensors(graph, c)
    graph = fold_constants(graph, c)
    graph = remove_noops(graph, c)
    if integer_dot:  # after folding: weights behind an Identity are constants now
        graph = convs_as_dot_products(graph, c, quads=byte_quads)
    graph = pools_on_integers(graph, c)
    graph = fold_batchnorm(graph, c)
    graph = eliminate_common_subexpressions(graph, c)
    graph = contractions_in_float(graph, c)  # after batchnorm folding, before the weights'
    graph = half_values_in_float(graph, c)
    graph = fold_constants(graph, c)         # Casts fold
    graph = eliminate_dead_nodes(graph, c)
    graph = choose_conv_layouts(graph, c, winograd=winograd, widest=widest_block)
    c["nodes_before"] = before
    c["nodes_after"] = len(graph.nodes)
    result = {k: int(c.get(k, 0)) for k in ("qdq_convs", "qdq_gemms", "conv_dot",
                                             "half_in_float",
                                             "half_values_in_float", "empty",
                                             "pools_on_integers",
                                             "folded",
                                             "noops",
                                             "batchnorm_folded", "cse",
                                             "cse_constants", "dead", "conv_channels_last",
                                             "conv_winograd", "transposes_sunk", "transposes_cancelled",
                                             "gemm_transposed", "matmul_blocked",
                                             "nodes_before",
                                             "nodes_after")}
    _STATS.clear()
    _STATS.update(result)
    if stats is not None:
        stats.update(result)
    return graph


# -- fusion groups ------------------------------------------------------------------------

def fusion_groups(graph: Graph, max_size: int = MAX_GROUP) -> list[list[Node]]:
    """A topological partition of the nodes into fusion groups (each becomes one kernel).

    A Conv / ConvTranspose / Gemm / MatMul / PolycConvDot, or an elementwise op (polyc's
    PolycRequantize counts as one), starts a group; an
    elementwise node joins the group whose last node produces one of its inputs when
    that tensor has exactly one reader (this node) and is not a graph output, the node's
    other inputs are computed no later than that group, and the group has fewer than
    ``max_size`` nodes. View ops (Reshape, Flatten, Squeeze, Unsqueeze, Identity,
    Dropout) and every other op are groups of their own. QuantizeLinear and
    DequantizeLinear are elementwise, but a DequantizeLinear does not join a group
    started by a contraction (its quantized result is what the next group reads: the
    residual sum of a QDQ model runs on the two quantized tensors in one kernel).
    """
    users = consumers(graph)
    group_of: dict[str, int] = {}  # tensor -> index of the group producing it
    groups: list[list[Node]] = []
    open_: dict[int, bool] = {}  # group -> may still grow
    for n in graph.nodes:
        target = None
        if n.op_type in ELEMENTWISE_OPS:
            joinable = []
            for x in n.inputs:
                g = group_of.get(x)
                if g is None or not open_.get(g) or groups[g][-1].outputs[0] != x:
                    continue
                if len(users.get(x, [])) != 1 or x in graph.outputs:
                    continue
                if len(groups[g]) >= max_size:
                    continue
                if not _inputs_ready(n, g, graph, users, groups, group_of, max_size):
                    continue
                if any(o for o in groups[g][-1].outputs[1:]):
                    continue
                if n.op_type == "DequantizeLinear" and groups[g][0].op_type in ANCHOR_OPS:
                    continue  # a contraction's quantized result: read by the next group
                joinable.append(g)
            if joinable:  # the largest: lone producers of the other inputs move into it
                target = max(joinable, key=lambda g: (len(groups[g]), -g)) \
                    if JOIN_LARGEST_GROUP else joinable[0]
        if target is None:
            groups.append([])
            target = len(groups) - 1
            open_[target] = n.op_type in ANCHOR_OPS or n.op_type in ELEMENTWISE_OPS
        if n.op_type in ELEMENTWISE_OPS:
            for p in _pulled(n, graph, users, groups, group_of, target, max_size):
                groups[group_of[p.outputs[0]]].remove(p)
                groups[target].append(p)
                group_of[p.outputs[0]] = target
        groups[target].append(n)
        for o in n.outputs:
            if o:
                group_of[o] = target
    return [g for g in groups if g]


#: an elementwise node with several groups to join joins the largest (see fusion_groups)
JOIN_LARGEST_GROUP = True


def _inputs_ready(n: Node, g: int, graph: Graph, users: Mapping[str, list[Node]],
                  groups: list[list[Node]], group_of: Mapping[str, int], max_size: int) -> bool:
    """May ``n`` join group ``g``: is each of its inputs computed by ``g`` or an earlier
    group, or by a lone producer that :func:`_pulled` moves into ``g`` and whose own
    inputs are? GELU's ``(x * 0.5) * (erf(x / sqrt2) + 1)``: the final Mul joins the
    erf's group, and the lone ``x * 0.5`` comes along (one kernel instead of two)."""
    late = [y for y in n.inputs if y and group_of.get(y, -1) > g]
    if not late:
        return True
    if not JOIN_LARGEST_GROUP:
        return False
    pulled = {p.outputs[0]: p for p in _pulled(n, graph, users, groups, group_of, g, max_size)}
    return all(y in pulled and all(group_of.get(z, -1) <= g for z in pulled[y].inputs if z)
               for y in late)


def _pulled(n: Node, graph: Graph, users: Mapping[str, list[Node]], groups: list[list[Node]],
            group_of: Mapping[str, int], target: int, max_size: int) -> list[Node]:
    """The producers of ``n``'s inputs that move into ``n``'s group (``target``): each an
    elementwise node alone in its group, whose output only ``n`` reads, is no graph
    output and has ``n``'s shape (no broadcast: each element computed once). Its value
    is then computed where ``n`` reads it instead of going through memory: a QDQ
    model's residual sum reads the shortcut's uint8 tensor, not its float32 copy."""
    out = []
    for x in dict.fromkeys(n.inputs):
        g = group_of.get(x)
        if g is None or g == target or len(groups[g]) != 1 or x in graph.outputs:
            continue
        p = groups[g][0]
        if p.op_type not in ELEMENTWISE_OPS or len(users.get(x, [])) != 1 \
                or any(o for o in p.outputs[1:]) \
                or graph.tensors[x].shape != graph.tensors[n.outputs[0]].shape \
                or len(groups[target]) + len(out) + 2 > max_size:
            continue
        out.append(p)
    return out
