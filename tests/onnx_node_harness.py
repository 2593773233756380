"""Run one ONNX node through its polyc lowering, without the graph driver.

:func:`check_node` builds a one-node model with ``onnx.helper``, a :class:`Graph` from
it (shapes from onnx's shape inference), calls the registered lowering, joins its
statements into one TC ``def`` with typed inputs and outputs, compiles it with
``from_tc(..., allow_indirect=True)`` and compares the outputs with
``onnx.reference.ReferenceEvaluator`` (and onnxruntime, when it accepts the model).
Constants (weights, shapes) are initializers of the model; those the statements read
are passed to the kernel as inputs.
"""
from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import polyc.frontend.onnx_ops_nn  # noqa: F401  (registers the lowerings)
import polyc.frontend.onnx_ops_shape  # noqa: F401
from polyc.api import Operator
from polyc.frontend import from_tc
from polyc.frontend.onnx_graph import REGISTRY, Graph, LowerContext, Lowered, Node, TensorInfo

_DTYPE = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64",
          onnx.TensorProto.INT32: "int32", onnx.TensorProto.INT64: "int64",
          onnx.TensorProto.BOOL: "bool"}


def _attrs(node: onnx.NodeProto) -> dict:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, onnx.TensorProto):
            v = numpy_helper.to_array(v)
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode() for x in v]
        out[a.name] = v
    return out


def make_model(op_type: str, inputs: dict, outputs: list[str], consts: dict | None = None,
               opset: int = 17, **attrs) -> onnx.ModelProto:
    consts = consts or {}
    names = list(inputs) + [n for n in consts if n not in inputs]
    node = helper.make_node(op_type, [n if n in inputs or n in consts else "" for n in
                                      attrs.pop("_inputs", names)], outputs, name="n0",
                            **attrs)
    vin = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for n, v in inputs.items()]
    vout = [helper.make_empty_tensor_value_info(o) for o in outputs]
    init = [numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()]
    graph = helper.make_graph([node], "g", vin, vout, init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def graph_of(model: onnx.ModelProto, reference: dict[str, np.ndarray]) -> Graph:
    inferred = onnx.shape_inference.infer_shapes(model)
    tensors: dict[str, TensorInfo] = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + \
            list(inferred.graph.output):
        t = vi.type.tensor_type
        if t.elem_type in _DTYPE and t.HasField("shape") and \
                all(d.HasField("dim_value") for d in t.shape.dim):
            tensors[vi.name] = TensorInfo(vi.name, _DTYPE[t.elem_type],
                                          tuple(d.dim_value for d in t.shape.dim))
    constants = {}
    for init in model.graph.initializer:
        v = numpy_helper.to_array(init)
        constants[init.name] = v
        tensors[init.name] = TensorInfo(init.name, str(v.dtype), v.shape)
    for name, v in reference.items():  # outputs shape inference left unknown
        info = TensorInfo(name, str(v.dtype), v.shape)
        assert tensors.setdefault(name, info) == info, (tensors[name], info)
    n = model.graph.node[0]
    node = Node(n.name, n.op_type, tuple(n.input), tuple(n.output), _attrs(n), n.domain)
    opset = model.opset_import[0].version
    return Graph("g", (node,), tuple(i.name for i in model.graph.input),
                 tuple(n.output), tensors, constants, opset)


def lower_node(graph: Graph) -> tuple[str | None, list[str], list[str], LowerContext, object]:
    """(TC source or None for a view, input tensors, output tensors, context, result)."""
    node = graph.nodes[0]
    ctx = LowerContext(graph)
    res = REGISTRY[node.op_type](node, ctx)
    if not isinstance(res, Lowered):
        return None, [], [], ctx, res
    text = "\n".join(res.statements)
    used = lambda t: t and re.search(rf"\b{ctx.name(t)}\b", text)  # noqa: E731
    ins = [t for t in dict.fromkeys(node.inputs) if used(t)]
    outs = [t for t in node.outputs if used(t)]
    views = [(tc, t) for tc, (t, _) in ctx.views().items() if re.search(rf"\b{tc}\b", text)]
    sig = ", ".join([f"{ctx.tc_type(t)} {ctx.name(t)}" for t in ins] +
                    [f"{ctx.view_type(tc)} {tc}" for tc, _ in views])
    ins = ins + [t for _, t in views]  # a view reads its tensor re-shaped (ctx.views())
    ret = ", ".join(f"{ctx.tc_type(t)} {ctx.name(t)}" for t in outs)
    body = "\n    ".join(res.statements)
    return f"def g({sig}) -> ({ret}) {{\n    {body}\n}}", ins, outs, ctx, res


def run_lowered(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                reference: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str | None]:
    graph = graph_of(model, reference)
    src, ins, outs, ctx, res = lower_node(graph)
    if src is None:  # a view: the input re-shaped
        assert res.output in graph.tensors and res.input in graph.tensors, res
        return {res.output: feeds[res.input].reshape(graph.tensors[res.output].shape)}, None
    values = {**graph.constants, **feeds}
    kernel = from_tc(src, allow_indirect=True)
    op = Operator(kernel)
    shapes = [tuple(int(d.value) for d in kernel.array(a).shape) for a in kernel.inputs]
    got = op(*[np.require(values[t], requirements='C').reshape(sh)
               for t, sh in zip(ins, shapes)])
    got = got if isinstance(got, tuple) else (got,)
    return dict(zip(outs, got)), src


def check_node(op_type: str, inputs: dict, outputs: list[str] | str = "y",
               consts: dict | None = None, opset: int = 17, ort: bool = True,
               rtol: float = 1e-5, atol: float = 1e-5, use_reference: bool = True,
               **attrs) -> dict[str, np.ndarray]:
    """Lower, compile and run one node; compare with the reference (and onnxruntime).

    ``use_reference=False`` where onnx's reference evaluator is known to be wrong (LRN
    sums over the batch dimension): onnxruntime alone is then the reference.
    """
    outputs = [outputs] if isinstance(outputs, str) else outputs
    model = make_model(op_type, inputs, outputs, consts, opset, **attrs)
    if use_reference:
        ref = ReferenceEvaluator(model).run(None, inputs)
    else:
        import onnxruntime as rt
        ref = rt.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, inputs)
    reference = {o: np.asarray(v) for o, v in zip(outputs, ref) if o}
    got, src = run_lowered(model, inputs, reference)
    for o, want in reference.items():
        if o not in got:
            continue
        assert got[o].shape == want.shape, (o, got[o].shape, want.shape, src)
        assert got[o].dtype == want.dtype, (o, got[o].dtype, want.dtype)
        np.testing.assert_allclose(got[o], want, rtol=rtol, atol=atol, err_msg=str(src))
    if ort:
        import onnxruntime as rt
        try:
            sess = rt.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001  (a model onnxruntime refuses: reference only)
            sess = None
        if sess is not None:
            for o, v in zip(outputs, sess.run(None, inputs)):
                if o in got:
                    np.testing.assert_allclose(got[o], v, rtol=rtol, atol=atol,
                                               err_msg=f"onnxruntime\n{src}")
    return got


def rand(*shape, dtype=np.float32, seed=0) -> np.ndarray:
    return np.random.default_rng(seed + len(shape) * 7 + sum(shape)).standard_normal(
        shape).astype(dtype)
