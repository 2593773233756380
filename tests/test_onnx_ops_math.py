"""ONNX math op lowerings: tiny models built with onnx.helper, imported, optimized and
lowered to a Program, run by a small interpreter of Programs (each step's kernel
compiled alone) and compared with onnx's ReferenceEvaluator (and onnxruntime where it
accepts the model, or where onnx's reference is known to be wrong)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
from onnx import helper

from polyc.codegen import compile_kernel
from polyc.frontend.onnx_graph import UnsupportedOpError
from polyc.frontend.onnx_import import load_graph
from polyc.frontend.onnx_lower import lower_graph
from polyc.frontend.onnx_passes import optimize_graph
from polyc.options import Options
from polyc.pipeline import schedule_kernel
from polyc.program import Program

# -- an interpreter of Programs ---------------------------------------------------------

NP_OF = {"float32": np.float32, "float64": np.float64, "int32": np.int32,
         "int64": np.int64, "bool": np.bool_}
ELEM = {np.dtype(np.float32): onnx.TensorProto.FLOAT,
        np.dtype(np.float64): onnx.TensorProto.DOUBLE,
        np.dtype(np.int32): onnx.TensorProto.INT32, np.dtype(np.int64): onnx.TensorProto.INT64,
        np.dtype(np.bool_): onnx.TensorProto.BOOL}


def _compile(kernel, options):
    return compile_kernel(kernel, schedule_kernel(kernel, options).schedule, options)


def check_program(program: Program) -> None:
    """Structural invariants of a Program."""
    names = [b.name for b in program.buffers]
    assert len(names) == len(set(names))
    kinds = {b.name: b.kind for b in program.buffers}
    for i in program.inputs:
        assert kinds[i] == "input"
    for o in program.outputs:
        assert kinds[o] == "output"
        assert program.root(o) == o
    for name, value in program.weights:
        b = program.buffer(name)
        assert b.kind == "weight" and value.shape == b.shape, name
        assert value.dtype == NP_OF[b.dtype], name
    for view, base in program.aliases:
        assert program.buffer(view).size == program.buffer(base).size
    for step in program.steps:
        k = step.kernel
        assert len(step.args) == len(k.inputs) + len(k.outputs)
        for arg, arr in zip(step.args, k.inputs + k.outputs):
            b = program.buffer(arg)
            assert b.dtype == k.array(arr).dtype, (arg, b, k.array(arr))


def run_program(program: Program, feeds: dict[str, np.ndarray],
                options: Options | None = None) -> list[np.ndarray]:
    """Run ``program`` step by step (weights and aliases as the C library will)."""
    check_program(program)
    options = options or Options()
    with ThreadPoolExecutor(max_workers=4) as pool:
        fns = list(pool.map(lambda s: _compile(s.kernel, options), program.steps))
    bufs: dict[str, np.ndarray] = dict(program.weights)
    for name in program.inputs:
        x = np.asarray(feeds[name])
        assert x.shape == program.buffer(name).shape
        bufs[name] = x

    def get(name: str) -> np.ndarray:
        return bufs[program.root(name)].reshape(program.buffer(name).shape)

    for step, fn in zip(program.steps, fns):
        n_in = len(step.kernel.inputs)
        outs = fn([get(a) for a in step.args[:n_in]])
        for a, v in zip(step.args[n_in:], outs):
            bufs[a] = v
    return [get(o) for o in program.outputs]


def compile_model(model, shapes=None, optimize=True) -> Program:
    graph = load_graph(model, shapes)
    if optimize:
        graph = optimize_graph(graph)
    return lower_graph(graph)


def make_model(nodes, inputs, outputs, initializers=(), opset=17, ir_version=8,
               name="test"):
    """``inputs``/``outputs``: (name, numpy dtype, shape or None)."""
    def vi(n, dt, shape):
        return helper.make_tensor_value_info(n, ELEM[np.dtype(dt)], shape)
    graph = helper.make_graph(
        nodes, name, [vi(*i) for i in inputs], [vi(*o) for o in outputs],
        [onnx.numpy_helper.from_array(np.asarray(v), n) for n, v in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=ir_version)


def reference(model, feeds) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator
    return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, feeds)]


def onnxruntime_outputs(model, feeds) -> list[np.ndarray] | None:
    """onnxruntime's outputs, or None where it refuses the model."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        return [np.asarray(r) for r in sess.run(None, feeds)]
    except Exception:
        return None


def assert_close(got, want, rtol=1e-4, atol=1e-5, what=""):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (what, g.shape, w.shape)
        assert g.dtype == w.dtype, (what, g.dtype, w.dtype)
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=what)
        else:
            np.testing.assert_array_equal(g, w, err_msg=what)


def check_against_references(model, feeds, rtol=1e-4, atol=1e-5, ref="both"):
    """Lower, run and compare: ``ref`` is "both", "reference" or "ort" (where onnx's
    reference implementation is known to disagree with the spec)."""
    program = compile_model(model)
    got = run_program(program, feeds)
    if ref in ("both", "reference"):
        assert_close(got, reference(model, feeds), rtol, atol, "vs onnx reference")
    if ref in ("both", "ort"):
        want = onnxruntime_outputs(model, feeds)
        if ref == "ort":
            assert want is not None, "onnxruntime refused the model"
        if want is not None:
            assert_close(got, want, rtol, atol, "vs onnxruntime")
    return program


# -- cases --------------------------------------------------------------------------------

F, D, I64, I32, B = np.float32, np.float64, np.int64, np.int32, np.bool_
RNG = np.random.default_rng(1234)


def rand(shape, dtype=F, lo=None, hi=None):
    if np.dtype(dtype) == np.bool_:
        return RNG.random(shape) < 0.5
    if np.dtype(dtype).kind == "i":
        return RNG.integers(-7 if lo is None else lo, 8 if hi is None else hi,
                            size=shape).astype(dtype)
    x = RNG.standard_normal(shape)
    if lo is not None:
        x = lo + (hi - lo) * RNG.random(shape)
    return np.asarray(x, dtype=dtype)


def case(op, ins, out_dtype=None, attrs=None, inits=(), opset=17, n_out=1, ref="both",
         rtol=1e-4, atol=1e-5, id=None, feeds=None):
    """One single-node test: ``ins`` = [(name, array)]; inits = [(name, array)]."""
    attrs = attrs or {}
    names = [n for n, _ in ins] + [n for n, _ in inits]
    return pytest.param(dict(op=op, ins=ins, out_dtype=out_dtype, attrs=attrs, inits=inits,
                             opset=opset, n_out=n_out, ref=ref, rtol=rtol, atol=atol,
                             inputs=names if feeds is None else feeds),
                        id=id or f"{op}-{opset}-" + "-".join(
                            "x".join(map(str, a.shape)) or "s" for _, a in ins + list(inits)))


x235 = rand((2, 3, 5))
pos235 = rand((2, 3, 5), F, 0.1, 3.0)

BINARY = [
    case("Add", [("a", x235), ("b", rand((3, 1)))]),
    case("Add", [("a", rand((5,))), ("b", x235)]),
    case("Sub", [("a", x235), ("b", rand((5,)))]),
    case("Mul", [("a", rand((1, 3, 1))), ("b", rand((2, 1, 5)))]),
    case("Div", [("a", x235), ("b", rand((2, 1, 1), F, 0.5, 2.0))]),
    case("Div", [("a", rand((2, 3, 5), I64)), ("b", rand((3, 5), I64, 1, 4) * np.where(
        rand((3, 5)) > 0, 1, -1))], id="Div-int64-truncates"),
    case("Div", [("a", rand((4, 3), I32))], inits=[("b", np.array(-2, I32))],
         id="Div-int32-const"),
    case("Add", [("a", rand((2, 3), D)), ("b", rand((3,), D))], id="Add-float64"),
    case("Add", [("a", rand((2, 3), I64)), ("b", rand((), I64))], id="Add-int64-scalar"),
    case("Pow", [("a", pos235), ("b", rand((5,)))]),
    case("Pow", [("a", x235)], inits=[("b", np.array(2.0, F))], id="Pow-square"),
    case("Pow", [("a", x235)], inits=[("b", np.array(3.0, F))], id="Pow-cube"),
    case("Pow", [("a", pos235)], inits=[("b", np.array(2, I64))], id="Pow-int-exponent"),
    case("Pow", [("a", rand((2, 3), I64, 0, 4)), ("b", rand((2, 3), I64, 0, 4))],
         id="Pow-int64"),
    case("Max", [("a", x235), ("b", rand((3, 1))), ("c", rand((5,)))]),
    case("Min", [("a", x235), ("b", rand((3, 1))), ("c", rand((5,)))]),
    case("Max", [("a", rand((2, 3), I64)), ("b", rand((2, 3), I64))], id="Max-int64"),
    case("Sum", [("a", x235), ("b", rand((3, 1))), ("c", rand((1, 5)))]),
    case("Sum", [("a", x235)], id="Sum-one-input"),
    case("Mean", [("a", x235), ("b", rand((3, 1))), ("c", rand((1, 5)))]),
    case("Where", [("c", rand((2, 1, 5), B)), ("a", x235), ("b", rand((3, 5)))]),
    case("Where", [("c", rand((3, 5), B)), ("a", rand((3, 5), I64))],
         inits=[("b", np.array(-1, I64))], id="Where-int-const"),
    case("Equal", [("a", rand((2, 3, 5), I64, 0, 3)), ("b", rand((3, 5), I64, 0, 3))]),
    case("Less", [("a", x235), ("b", rand((5,)))]),
    case("LessOrEqual", [("a", rand((2, 3), I64, 0, 3)), ("b", rand((2, 3), I64, 0, 3))]),
    case("Greater", [("a", x235), ("b", rand((3, 1)))]),
    case("GreaterOrEqual", [("a", rand((2, 3), I64, 0, 3)), ("b", rand((3,), I64, 0, 3))]),
    case("Not", [("a", rand((2, 3, 5), B))]),
    case("And", [("a", rand((2, 3, 5), B)), ("b", rand((3, 5), B))]),
    case("Or", [("a", rand((2, 3, 5), B)), ("b", rand((3, 1), B))]),
    case("Xor", [("a", rand((2, 3, 5), B)), ("b", rand((5,), B))]),
    case("Mod", [("a", rand((3, 4), I64, -9, 9)), ("b", rand((4,), I64, 1, 4) * np.array(
        [1, -1, 1, -1]))], id="Mod-int-floor"),
    case("Mod", [("a", rand((3, 4), I64, -9, 9)), ("b", rand((4,), I64, 1, 4) * np.array(
        [1, -1, 1, -1]))], attrs=dict(fmod=1), id="Mod-int-fmod"),
    case("Mod", [("a", x235 * 3), ("b", rand((5,), F, 0.5, 2))], attrs=dict(fmod=1),
         id="Mod-float"),
]

UNARY = [case(op, [("x", x235)], attrs=a, id=f"{op}{'-' + str(a) if a else ''}") for op, a in [
    ("Relu", {}), ("LeakyRelu", {}), ("LeakyRelu", dict(alpha=0.3)), ("Sigmoid", {}),
    ("HardSigmoid", {}), ("HardSigmoid", dict(alpha=0.3, beta=0.6)), ("HardSwish", {}),
    ("Tanh", {}), ("Erf", {}), ("Exp", {}), ("Reciprocal", {}), ("Neg", {}), ("Abs", {}),
    ("Floor", {}), ("Ceil", {}), ("Softplus", {}), ("Softsign", {}), ("Elu", {}),
    ("Elu", dict(alpha=0.5)), ("Selu", {}), ("Celu", {}), ("ThresholdedRelu", dict(alpha=0.4)),
    ("Sign", {}), ("Sin", {}), ("Cos", {}), ("Atan", {}), ("Round", {})]] + [
    case("Log", [("x", pos235)]), case("Sqrt", [("x", pos235)]),
    case("Relu", [("x", rand((2, 3), I64))], id="Relu-int64"),
    case("Abs", [("x", rand((2, 3), I32))], id="Abs-int32"),
    case("Neg", [("x", rand((2, 3), I64))], id="Neg-int64"),
    case("Exp", [("x", rand((2, 3), D))], id="Exp-float64"),
    case("Gelu", [("x", x235)], opset=20, id="Gelu-none"),
    case("Gelu", [("x", x235)], attrs=dict(approximate="tanh"), opset=20, id="Gelu-tanh"),
    case("PRelu", [("x", x235), ("s", rand((3, 1)))]),
    case("PRelu", [("x", x235)], inits=[("s", np.array([0.1], F))], id="PRelu-const"),
    case("IsNaN", [("x", np.array([1.0, np.nan, -np.inf, 0.0], F))], id="IsNaN"),
    case("IsInf", [("x", np.array([1.0, np.nan, -np.inf, np.inf], F))], id="IsInf"),
    case("IsInf", [("x", np.array([1.0, np.nan, -np.inf, np.inf], F))],
         attrs=dict(detect_negative=0), id="IsInf-positive"),
]

CLIP = [
    case("Clip", [("x", x235)], attrs=dict(min=-0.5, max=0.6), opset=6, id="Clip-6-attrs"),
    case("Clip", [("x", x235)], attrs=dict(max=0.6), opset=6, id="Clip-6-max-only"),
    case("Clip", [("x", x235)], inits=[("lo", np.array(-0.5, F)), ("hi", np.array(0.7, F))],
         opset=13, id="Clip-13-const"),
    case("Clip", [("x", x235), ("lo", np.array(-0.2, F)), ("hi", np.array(0.3, F))],
         opset=13, id="Clip-13-inputs"),
    case("Clip", [("x", x235), ("lo", np.array(0.5, F)), ("hi", np.array(-0.3, F))],
         opset=13, id="Clip-13-min-above-max"),
    case("Clip", [("x", rand((2, 3), I64))], inits=[("lo", np.array(-2, I64)),
                                                     ("hi", np.array(3, I64))],
         opset=13, id="Clip-int64"),
    case("Clip", [("x", x235)], opset=13, id="Clip-no-bounds"),
]

CASTS = [
    case("Cast", [("x", x235 * 4)], attrs=dict(to=onnx.TensorProto.INT32), id="Cast-f-i32"),
    case("Cast", [("x", x235 * 4)], attrs=dict(to=onnx.TensorProto.INT64), id="Cast-f-i64"),
    case("Cast", [("x", rand((2, 3), I64))], attrs=dict(to=onnx.TensorProto.FLOAT),
         id="Cast-i64-f"),
    case("Cast", [("x", np.array([0.0, 1.5, -2.0, 0.0], F))],
         attrs=dict(to=onnx.TensorProto.BOOL), id="Cast-f-bool"),
    case("Cast", [("x", rand((2, 3), B))], attrs=dict(to=onnx.TensorProto.FLOAT),
         id="Cast-bool-f"),
    case("Cast", [("x", x235)], attrs=dict(to=onnx.TensorProto.DOUBLE), id="Cast-f-d"),
    case("Cast", [("x", rand((2, 3), I32))], attrs=dict(to=onnx.TensorProto.INT64),
         id="Cast-i32-i64"),
    case("CastLike", [("x", rand((2, 3), I64)), ("like", rand((1,), D))], id="CastLike"),
]

MATMUL = [
    case("MatMul", [("a", rand((2, 3))), ("b", rand((3, 4)))]),
    case("MatMul", [("a", rand((3,))), ("b", rand((3, 4)))]),
    case("MatMul", [("a", rand((2, 3))), ("b", rand((3,)))]),
    case("MatMul", [("a", rand((3,))), ("b", rand((3,)))]),
    case("MatMul", [("a", rand((2, 1, 2, 3))), ("b", rand((3, 3, 4)))]),
    case("MatMul", [("a", rand((4, 2, 3))), ("b", rand((3, 5)))]),
    case("MatMul", [("a", rand((5,))), ("b", rand((2, 5, 3)))]),
    case("MatMul", [("a", rand((2, 3), I64)), ("b", rand((3, 2), I64))], id="MatMul-int64"),
    case("Gemm", [("a", rand((2, 3))), ("b", rand((3, 4)))]),
    case("Gemm", [("a", rand((3, 2))), ("b", rand((4, 3))), ("c", rand((4,)))],
         attrs=dict(transA=1, transB=1, alpha=0.5, beta=2.0)),
    case("Gemm", [("a", rand((2, 3))), ("b", rand((3, 4))), ("c", rand((2, 1)))],
         attrs=dict(beta=0.0), id="Gemm-beta0"),
    case("Gemm", [("a", rand((2, 3))), ("b", rand((3, 4))), ("c", rand((2, 4)))]),
    case("Gemm", [("a", rand((2, 3))), ("b", rand((3, 4)))], inits=[("c", np.array(1.5, F))],
         attrs=dict(beta=0.5), id="Gemm-scalar-C"),
    case("Gemm", [("a", rand((2, 3))), ("b", rand((3, 4))), ("c", rand((1, 4)))],
         opset=9, id="Gemm-opset9"),
]

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
              "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]


def _reduce_cases():
    out = []
    for op in REDUCE_OPS:
        x = pos235 if op == "ReduceLogSum" else x235
        attr_opset = 11 if op == "ReduceSum" else 13  # ReduceSum-13 takes axes as input
        out.append(case(op, [("x", x)], attrs=dict(axes=[1], keepdims=1), opset=attr_opset,
                        id=f"{op}-{attr_opset}-axis1-keep"))
        out.append(case(op, [("x", x)], attrs=dict(axes=[0, -1], keepdims=0),
                        opset=attr_opset, id=f"{op}-{attr_opset}-axes0,-1"))
        out.append(case(op, [("x", x)], attrs=dict(keepdims=0), opset=11,
                        id=f"{op}-11-all"))
        out.append(case(op, [("x", x)], inits=[("axes", np.array([-2], I64))], opset=18,
                        id=f"{op}-18-axes-input"))
    out += [
        case("ReduceSum", [("x", x235)], inits=[("axes", np.array([2, 0], I64))],
             attrs=dict(keepdims=1), opset=13, id="ReduceSum-13-axes-input"),
        case("ReduceSum", [("x", x235)], attrs=dict(noop_with_empty_axes=1), opset=13,
             id="ReduceSum-13-noop"),
        case("ReduceMean", [("x", x235)], opset=18, id="ReduceMean-18-all"),
        case("ReduceSumSquare", [("x", x235)], attrs=dict(noop_with_empty_axes=1), opset=18,
             id="ReduceSumSquare-18-noop"),
        case("ReduceMax", [("x", rand((2, 3, 5), I64))], attrs=dict(axes=[1]), opset=13,
             id="ReduceMax-int64"),
        case("ReduceSum", [("x", rand((2, 3), I32))], attrs=dict(keepdims=0), opset=11,
             id="ReduceSum-int32"),
        case("ReduceMean", [("x", rand((4,)))], attrs=dict(keepdims=1), opset=13,
             id="ReduceMean-rank1-keep"),
    ]
    ties = np.array([[[1, 3, 3], [2, 2, 0]], [[0, 0, 0], [5, 1, 5]]], F)
    for op in ("ArgMax", "ArgMin"):
        out += [
            case(op, [("x", ties)], attrs=dict(axis=2), id=f"{op}-ties-first"),
            case(op, [("x", ties)], attrs=dict(axis=2, select_last_index=1),
                 id=f"{op}-ties-last"),
            case(op, [("x", x235)], attrs=dict(axis=-2, keepdims=0), id=f"{op}-axis-2"),
            case(op, [("x", rand((5,)))], attrs=dict(keepdims=0), id=f"{op}-rank1"),
            case(op, [("x", rand((3, 4), I64))], attrs=dict(axis=0), id=f"{op}-int64"),
        ]
    return out


SOFTMAX = [
    case("Softmax", [("x", x235)], attrs=dict(axis=1), opset=13),
    case("Softmax", [("x", x235)], opset=13, id="Softmax-13-default"),
    case("LogSoftmax", [("x", x235)], attrs=dict(axis=0), opset=13),
    case("Softmax", [("x", rand((2, 3), D))], opset=13, id="Softmax-float64"),
    # opset < 13 coerces to 2-D at axis; onnx's reference implements the new semantics
    case("Softmax", [("x", x235)], attrs=dict(axis=1), opset=11, ref="ort",
         id="Softmax-11-axis1"),
    case("Softmax", [("x", x235)], opset=11, ref="ort", id="Softmax-11-default"),
    case("LogSoftmax", [("x", x235)], attrs=dict(axis=1), opset=11, ref="ort",
         id="LogSoftmax-11-axis1"),
    case("Hardmax", [("x", np.array([[1, 3, 3], [2, 0, 1]], F))], opset=13, id="Hardmax"),
]

NORMS = [
    case("BatchNormalization", [("x", x235)], inits=[
        ("s", rand((3,))), ("b", rand((3,))), ("m", rand((3,))), ("v", rand((3,), F, 0.5, 2))],
         opset=15),
    case("BatchNormalization", [("x", rand((2, 3, 4, 5))), ("s", rand((3,))), ("b", rand((3,))),
                                ("m", rand((3,))), ("v", rand((3,), F, 0.5, 2))],
         attrs=dict(epsilon=1e-3), opset=9, id="BatchNormalization-9-inputs",
         ref="ort"),  # onnx's reference applies the momentum (training) at opset 9
    case("LayerNormalization", [("x", x235)], inits=[("s", rand((5,))), ("b", rand((5,)))]),
    case("LayerNormalization", [("x", x235)], inits=[("s", rand((3, 5)))],
         attrs=dict(axis=1, epsilon=1e-3), id="LayerNormalization-axis1-noB"),
    case("LayerNormalization", [("x", x235), ("s", rand((5,)))], n_out=3,
         id="LayerNormalization-stats"),
    case("InstanceNormalization", [("x", rand((2, 3, 4, 5)))],
         inits=[("s", rand((3,))), ("b", rand((3,)))], attrs=dict(epsilon=1e-4)),
    case("InstanceNormalization", [("x", rand((2, 3, 7)))],
         inits=[("s", rand((3,))), ("b", rand((3,)))]),
    # onnx's reference LRN loops over the batch instead of the channels: onnxruntime
    case("LRN", [("x", rand((2, 5, 3, 4)))], attrs=dict(size=3), ref="ort"),
    case("LRN", [("x", rand((1, 6, 3, 3)))], attrs=dict(size=5, alpha=1e-2, beta=0.5,
                                                       bias=2.0), ref="ort", id="LRN-5"),
]

MORE = [
    case("Swish", [("x", x235)], attrs=dict(alpha=0.7), opset=24),
    case("Shrink", [("x", x235)], attrs=dict(lambd=0.4, bias=0.1)),
    case("RMSNormalization", [("x", x235)], inits=[("s", rand((5,)))], opset=23),
    case("RMSNormalization", [("x", x235), ("s", rand((3, 5)))], attrs=dict(axis=1),
         opset=23, id="RMSNormalization-axis1"),
    # onnx's reference sums x, not |x|, for p=1
    case("LpNormalization", [("x", x235)], attrs=dict(axis=1, p=1), ref="ort"),
    case("LpNormalization", [("x", x235)]),
    case("Trilu", [("x", x235)], inits=[("k", np.array(1, I64))], id="Trilu-upper-k1"),
    case("Trilu", [("x", rand((3, 4), I64)), ("k", np.array(-1, I64))],
         attrs=dict(upper=0), id="Trilu-lower-k-input"),
    case("EyeLike", [("x", rand((3, 5)))], attrs=dict(k=2, dtype=onnx.TensorProto.INT64),
         opset=22),
    case("CumSum", [("x", x235)], inits=[("axis", np.array(1, I64))], id="CumSum-axis1"),
    case("CumSum", [("x", rand((3, 4), I32))], inits=[("axis", np.array(-1, I64))],
         attrs=dict(exclusive=1, reverse=1), id="CumSum-excl-rev-int32"),
    case("CumSum", [("x", x235)], inits=[("axis", np.array(0, I64))],
         attrs=dict(reverse=1), id="CumSum-reverse"),
    case("CumProd", [("x", x235)], inits=[("axis", np.array(2, I64))],
         attrs=dict(exclusive=1), opset=26, id="CumProd-exclusive"),
    case("Einsum", [("a", rand((2, 3, 4))), ("b", rand((2, 4, 5)))],
         attrs=dict(equation="bij,bjk->bik"), opset=12, id="Einsum-bmm"),
    case("Einsum", [("a", rand((3, 3)))], attrs=dict(equation="ii"), opset=12,
         id="Einsum-trace-implicit"),
    case("Einsum", [("a", rand((2, 3, 4))), ("b", rand((1, 4, 5)))],
         attrs=dict(equation="...ij,...jk->...ik"), opset=12, id="Einsum-ellipsis-bcast"),
    case("Einsum", [("a", rand((3, 4))), ("b", rand((4,)))],
         attrs=dict(equation="ij,j->ji"), opset=12, id="Einsum-elementwise"),
]

ALL = BINARY + UNARY + CLIP + CASTS + MATMUL + _reduce_cases() + SOFTMAX + NORMS + MORE


def _model_of(c):
    outs = [f"y{k}" for k in range(c["n_out"])]
    node = helper.make_node(c["op"], [n for n, _ in c["ins"]] + [n for n, _ in c["inits"]],
                            outs, name=f"the_{c['op']}", **c["attrs"])
    inputs = [(n, a.dtype, a.shape) for n, a in c["ins"]]
    model = make_model([node], inputs, [], c["inits"], opset=c["opset"])
    # output types from shape inference
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {vi.name: vi for vi in inferred.graph.value_info}
    model.graph.output.extend(types[o] for o in outs)
    return model


@pytest.mark.parametrize("c", ALL)
def test_op(c):
    model = _model_of(c)
    feeds = {n: a for n, a in c["ins"]}
    check_against_references(model, feeds, c["rtol"], c["atol"], c["ref"])


# -- groups of ops, fused -----------------------------------------------------------------

def test_fused_matmul_add_gelu_chain():
    x, w, b = rand((2, 4, 6)), rand((6, 5)), rand((5,))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["h"]),
             helper.make_node("Gelu", ["h"], ["g"], approximate="tanh"),
             helper.make_node("Mul", ["g", "x2"], ["y"])]
    model = make_model(nodes, [("x", F, (2, 4, 6)), ("x2", F, (4, 1))], [("y", F, (2, 4, 5))],
                       [("w", w), ("b", b)], opset=20)
    prog = check_against_references(model, {"x": x, "x2": rand((4, 1))})
    assert len(prog.steps) == 1 and len(prog.steps[0].origin) == 4


def test_fused_gemm_relu_softmax_two_steps():
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"])]
    model = make_model(nodes, [("x", F, (3, 6))], [("y", F, (3, 4))],
                       [("w", rand((4, 6))), ("b", rand((4,)))])
    prog = check_against_references(model, {"x": rand((3, 6))})
    assert [len(s.origin) for s in prog.steps] == [2, 1]
    # the transB weight is stored transposed once (frontend/onnx_layout.py)
    assert {n for n, _ in prog.weights} == {"w_t", "b"}


@pytest.mark.parametrize("axis,opset", [(-1, 17), (1, 17), (1, 11)])
def test_softmax_computes_each_exponential_once(axis, opset):
    """A Softmax's exponentials go into a temporary that its sum and its division both
    read: one ``exp`` in the lowered kernel, not one in the sum and one in the division
    (the sum, which adds in order, runs scalar). The last axis, a middle one, and opset
    11's flattening of every trailing axis, against both references."""
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=axis)]
    model = make_model(nodes, [("x", F, (2, 5, 37, 45))], [("y", F, None)], opset=opset)
    # (onnx's reference implementation normalizes opset 11's Softmax over one axis only)
    prog = check_against_references(model, {"x": rand((2, 5, 37, 45), lo=-4, hi=4)},
                                    ref="ort" if opset < 13 else "both")
    (step,) = prog.steps
    values = " ".join(str(st.value) for st in step.kernel.statements)
    assert values.count("fn='exp'") == 1, values


def test_softmax_exponentials_once_on_the_cuda_target():
    """The same Softmax lowering (its exponentials' temporary) on the CUDA target, run by
    the CPU emulation, against numpy, on sizes that are no multiple of a tile."""
    import polyc
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=-1)]
    model = make_model(nodes, [("x", F, (3, 37, 45))], [("y", F, None)])
    x = rand((3, 37, 45), lo=-4, hi=4)
    (got,) = polyc.compile_onnx(model, target="cuda", emulate=True).run(None, {"x": x})
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_intermediate_output_and_shared_input():
    """A fused chain's intermediate that is also a graph output ends the group; a tensor
    read twice is one kernel argument."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]),
             helper.make_node("Sigmoid", ["sq"], ["s"]),
             helper.make_node("Add", ["s", "x"], ["y"])]
    model = make_model(nodes, [("x", F, (2, 3, 5))], [("y", F, None), ("sq", F, None)])
    check_against_references(model, {"x": x235})


def test_rank0_tensors():
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Mul", ["s", "k"], ["y"]),
             helper.make_node("Sub", ["x", "y"], ["z"])]
    model = make_model(nodes, [("x", F, (2, 3)), ("k", F, ())], [("y", F, ()), ("z", F, None)],
                       opset=11)
    check_against_references(model, {"x": rand((2, 3)), "k": np.array(0.5, F)})


def test_unsupported_attribute_names_node():
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
                            name="bn_train", training_mode=1)
    model = make_model([node], [("x", F, (2, 3, 4))], [("y", F, (2, 3, 4))],
                       [("s", rand((3,))), ("b", rand((3,))), ("m", rand((3,))),
                        ("v", rand((3,), F, 0.5, 1))], opset=15)
    with pytest.raises(UnsupportedOpError, match=r"bn_train.*BatchNormalization.*training"):
        compile_model(model, optimize=False)


def test_non_constant_axes_is_unsupported():
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="rs", keepdims=1)
    model = make_model([node], [("x", F, (2, 3)), ("axes", I64, (1,))], [("y", F, None)],
                       opset=13)
    with pytest.raises((UnsupportedOpError, onnx.shape_inference.InferenceError, Exception),
                       match=r"rs|axes|shape"):
        compile_model(model)


def lrn_spec(x, size, alpha, beta, bias):
    """LRN as the ONNX spec writes it (channels c - floor((size-1)/2) .. c + ceil((size-1)/2))."""
    c_total = x.shape[1]
    sq = np.zeros_like(x)
    for c in range(c_total):
        lo, hi = max(0, c - (size - 1) // 2), min(c_total, c + -(-(size - 1) // 2) + 1)
        sq[:, c] = (x[:, lo:hi] ** 2).sum(axis=1)
    return (x / (bias + alpha / size * sq) ** beta).astype(x.dtype)


def test_lrn_even_size():
    """onnxruntime refuses even sizes; the spec's window is asymmetric then."""
    x = rand((2, 6, 3, 3))
    node = helper.make_node("LRN", ["x"], ["y"], size=4, alpha=0.05, beta=0.6, bias=1.5)
    model = make_model([node], [("x", F, x.shape)], [("y", F, x.shape)])
    got = run_program(compile_model(model), {"x": x})
    assert_close(got, [lrn_spec(x, 4, 0.05, 0.6, 1.5)])


@pytest.mark.parametrize("target", [{}, {"target": "cuda", "emulate": True}],
                         ids=["c", "cuda-emulated"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8, np.uint16])
def test_integer_division_by_zero_does_not_trap(dtype, target):
    """C's integer / and % trap (SIGFPE) on a zero divisor and on INT_MIN / -1, killing
    the caller's process. polyc's are total, as numpy's: 0 for a zero divisor, INT_MIN
    / -1 wraps."""
    import polyc
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("Div", ["a", "b"], ["q"]),
             helper.make_node("Mod", ["a", "b"], ["r"], fmod=0)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, [6]) for n in "ab"],
                          [helper.make_tensor_value_info(n, t, [6]) for n in "qr"])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    info = np.iinfo(dtype)
    a = np.array([7, -7 if info.min < 0 else 9, 0, info.min, info.max, 5], dtype)
    b = np.array([2, 0, 0, -1 if info.min < 0 else 1, 3, 0], dtype)
    q, r = polyc.compile_onnx(m, **target).run(None, {"a": a, "b": b})
    with np.errstate(all="ignore"):
        want_r = np.where(b == 0, 0, np.mod(a, np.where(b == 0, 1, b))).astype(dtype)
    def trunc_div(x: int, y: int) -> int:  # C's division, in Python's integers
        if y == 0:
            return 0
        q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
        return info.min if q > info.max else q  # INT_MIN / -1 wraps to INT_MIN
    want_q = np.array([trunc_div(int(x), int(y)) for x, y in zip(a, b)], dtype)
    np.testing.assert_array_equal(q, want_q)
    np.testing.assert_array_equal(r, want_r)
