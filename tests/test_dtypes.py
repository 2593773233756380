"""Every dtype of :mod:`polyc.dtypes` through the TC frontend, the C and CUDA targets and
the ONNX importer, checked against numpy (and onnxruntime).

* integers narrower than 32 bits compute in 32 bits and wrap to their width after each
  operation, as numpy does (sizes 37 and 100: no multiple of a vector or tile);
* float16 rounds every operation's result, as numpy's float16 does, so elementwise
  kernels match numpy bit for bit; reductions into float16 accumulate in float32
  (``polyc.widen``), as numpy's and BLAS's do;
* bfloat16 is its float32 bits' upper half, rounded to nearest even.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import polyc
from polyc import dtypes as D
from polyc.codegen.toolchain import asan_runtime, sanitizer_environment
from polyc.errors import UnsupportedError

INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
BF16 = np.dtype(ml_dtypes.bfloat16)
SCHEDULERS = ["isl", "pluto"]


def _ints(dt: str, n: int, seed: int) -> np.ndarray:
    info = np.iinfo(dt)
    return np.random.default_rng(seed).integers(info.min, info.max, n, dtype=dt,
                                                endpoint=True)


def _int_source(dt: str) -> str:
    return f"""
def f({dt}(N) A, {dt}(N) B) -> (C, E, S) {{
  C(i) = A(i) * B(i) + A(i) - B(i)
  E(i) = max(A(i), B(i)) + min(A(i), B(i)) * 3 - (A(i) > B(i) ? A(i) : -B(i))
  S(j) +=! A(i) * B(i) where j in 0:1
}}"""


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("dt", INTS)
def test_integer_arithmetic_wraps_as_numpy(dt, scheduler):
    op = polyc.define(_int_source(dt), scheduler=scheduler)
    for n, seed in ((37, 0), (100, 1)):
        a, b = _ints(dt, n, seed), _ints(dt, n, seed + 10)
        c, e, s = op(a, b)
        with np.errstate(over="ignore"):
            three = np.array(3, dt)
            want_e = np.maximum(a, b) + np.minimum(a, b) * three - np.where(a > b, a, -b)
            want = [a * b + a - b, want_e, np.array([np.sum(a * b, dtype=dt)])]
        for got, w in zip((c, e, s), want):
            assert got.dtype == np.dtype(dt)
            np.testing.assert_array_equal(got, w)


@pytest.mark.parametrize("dt", ["int8", "uint8", "int16", "uint64"])
def test_casts_and_limits(dt):
    """Casts between integer widths wrap; the identities of max/min are the type's
    limits; a float converts to the integer type by truncation."""
    info = np.iinfo(dt)
    op = polyc.define(f"""
def g(int64(N) X, float(N) F) -> (W, T, MX, MN) {{
  W(i) = {dt}(X(i))
  T(i) = {dt}(F(i))
  MX(j) max=! {dt}(X(i)) where j in 0:1
  MN(j) min=! {dt}(X(i)) where j in 0:1
}}""")
    x = np.random.default_rng(3).integers(-2**40, 2**40, 53, dtype=np.int64)
    f = np.random.default_rng(4).uniform(0, min(100, info.max), 53).astype(np.float32)
    w, t, mx, mn = op(x, f)
    np.testing.assert_array_equal(w, x.astype(dt))
    np.testing.assert_array_equal(t, f.astype(dt))
    np.testing.assert_array_equal(mx, [x.astype(dt).max()])
    np.testing.assert_array_equal(mn, [x.astype(dt).min()])


@pytest.mark.parametrize("dt", ["int8", "uint8", "int16", "uint16"])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_narrow_max_and_min_run_in_their_own_type(dt, scheduler):
    """A max or min of 8- or 16-bit integers (nested, as a max pool's tree) is computed
    in their own type, not promoted to 32 bits (gcc then vectorizes bytes as bytes), a
    literal operand too (the TC types it as the other). The values are numpy's, at the
    type's limits and over 1001 elements (no whole vector)."""
    src = f"""
def m({dt}(N) A, {dt}(N) B, {dt}(N) C) -> (X, Y, Z) {{
  X(i) = max(max(A(i), B(i)), max(C(i), A(i)))
  Y(i) = min(A(i), min(B(i), C(i)))
  Z(i) = max(A(i), 3)
}}"""
    op = polyc.define(src, scheduler=scheduler)
    info = np.iinfo(dt)
    rng = np.random.default_rng(7)
    a, b, c = (rng.integers(info.min, int(info.max) + 1, 1001).astype(dt) for _ in range(3))
    a[:4] = [info.min, info.max, info.min, info.max]
    x, y, z = op(a, b, c)
    np.testing.assert_array_equal(x, np.maximum(np.maximum(a, b), c))
    np.testing.assert_array_equal(y, np.minimum(np.minimum(a, b), c))
    np.testing.assert_array_equal(z, np.maximum(a.astype(np.int64), 3).astype(dt))
    suffix = ("_u" if dt.startswith("u") else "_i") + dt.lstrip("uint")
    assert f"polyc_max{suffix}(" in op.c_source and f"polyc_min{suffix}(" in op.c_source
    if scheduler == "isl":  # the CUDA target, through the emulation: the same values
        cuda = polyc.define(src, target="cuda", emulate=True)
        for got, want in zip(cuda(a, b, c), (x, y, z)):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_float16_elementwise_rounds_each_operation(scheduler):
    op = polyc.define("""
def h(float16(N) A, float16(N) B) -> (C) {
  C(i) = exp(A(i) * B(i) - A(i)) / (B(i) * B(i) + half(1.5))
}""", scheduler=scheduler)
    rng = np.random.default_rng(5)
    a = rng.standard_normal(1001).astype(np.float16)
    b = rng.standard_normal(1001).astype(np.float16)
    with np.errstate(over="ignore"):
        want = np.exp(a * b - a) / (b * b + np.float16(1.5))
    got = op(a, b)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dt", ["float16", "bfloat16", "float8e4m3fn"])
def test_each_value_is_rounded_once(dt):
    """An explicit cast of a value already rounded to the type, and the store of one,
    add no second rounding (rounding twice to one format is rounding once): the code
    has no nested rounding calls, and the result is numpy's, bit for bit."""
    tc = {"float16": "float16", "bfloat16": "bfloat16", "float8e4m3fn": "float8e4m3fn"}[dt]
    op_src = f"""
def h({tc}(N) A, {tc}(N) B) -> (C) {{
  C(i) = {tc}({tc}(A(i) + B(i)) * A(i))
}}"""
    op = polyc.define(op_src)
    np_dt = D.numpy_dtype(dt)
    rng = np.random.default_rng(6)
    a = rng.standard_normal(301).astype(np_dt)
    b = rng.standard_normal(301).astype(np_dt)
    want = ((a.astype(np.float32) + b.astype(np.float32)).astype(np_dt).astype(np.float32)
            * a.astype(np.float32)).astype(np_dt)
    got = op(a, b)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    if dt != "float8e4m3fn":  # (the CUDA target has no float8 types yet)
        cuda = polyc.define(op_src, target="cuda", emulate=True)(a, b)
        np.testing.assert_array_equal(cuda.astype(np.float32), want.astype(np.float32))
    src = op.c_source
    assert not re.search(r"(polyc_\w*round\w*)\(\1\(", src)
    for m in re.finditer(r"polyc_\w+_store\(", src):  # no store of one rounding call
        depth, end = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(src[end], 0)
            end += 1
        arg = src[m.end():end - 1]
        inner = re.match(r"polyc_\w*round\w*\(", arg)
        if inner:
            depth, k = 1, inner.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(arg[k], 0)
                k += 1
            assert k != len(arg), arg


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_half_matmul_accumulates_in_float32(dt, scheduler):
    npdt = BF16 if dt == "bfloat16" else np.dtype(dt)
    op = polyc.define(f"""
def mm({dt}(M,K) A, {dt}(K,N) B) -> (C, T) {{
  C(m,n) +=! A(m,k) * B(k,n)
  T(m) +=! C(m,n)
}}""", scheduler=scheduler)
    rng = np.random.default_rng(6)
    for m, k, n in ((33, 70, 41), (65, 129, 97)):
        a = rng.standard_normal((m, k)).astype(npdt)
        b = rng.standard_normal((k, n)).astype(npdt)
        c, t = op(a, b)
        assert c.dtype == npdt and t.dtype == npdt
        exact = a.astype(np.float64) @ b.astype(np.float64)
        # one rounding of the float32 sum: within an ulp of the exact value
        ulp = 2.0 ** (-10 if dt == "float16" else -7)
        np.testing.assert_allclose(c.astype(np.float64), exact, rtol=ulp,
                                   atol=ulp * np.abs(exact).max())
        tsum = c.astype(np.float64).sum(axis=1)
        np.testing.assert_allclose(t.astype(np.float64), tsum, rtol=ulp,
                                   atol=ulp * np.abs(tsum).max())


def test_float16_sum_is_not_rounded_per_step():
    """3000 ones: rounded at each step, a float16 sum stops at 2048 (2048 + 1 rounds
    back to 2048); accumulated in float32, it is 3000 (a float16 value)."""
    op = polyc.define("def s(float16(N) A) -> (S) { S(j) +=! A(i) where j in 0:1 }")
    np.testing.assert_array_equal(op(np.ones(3000, np.float16)), [3000])


def test_bfloat16_rounds_to_nearest_even():
    op = polyc.define("def r(float(N) X) -> (Y) { Y(i) = bfloat16(X(i)) }")
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(500).astype(np.float32) * 1e3,
                        np.array([np.inf, -np.inf, 0.0, -0.0, 1 + 2**-8, 1 + 3 * 2**-8],
                                 np.float32)])
    y = op(x)
    assert y.dtype == BF16
    np.testing.assert_array_equal(y.view(np.uint16), x.astype(BF16).view(np.uint16))
    assert np.isnan(op(np.array([np.nan], np.float32)).astype(np.float32)).all()


def test_every_dtype_is_in_the_tables():
    from polyc.codegen.c_expr import CTYPES
    from polyc.codegen.runtime import NUMPY_DTYPES
    from polyc.frontend.onnx_import import DTYPES
    for name, d in D.BY_NAME.items():
        assert NUMPY_DTYPES[name].itemsize == d.itemsize
        assert CTYPES[name] == d.ctype
        assert name in DTYPES.values()
        assert D.from_numpy(d.numpy) == name


def test_cuda_target_refuses_float8_by_name():
    op = polyc.define("def c(float8e4m3fn(N) A) -> (B) { B(i) = A(i) * A(i) }",
                      target="cuda", emulate=True)
    with pytest.raises(UnsupportedError, match=r"'A'.*float8e4m3fn.*CUDA target"):
        op(np.ones(4, np.float32).astype(D.numpy_dtype("float8e4m3fn")))


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_cuda_half_types_match_the_c_target(dt):
    """On the CUDA target (through the emulation, or a GPU) the half types are converted
    by the same device functions, shared-memory and register tiles holding converted
    values: the C target's results within one rounding of the type (the float32 sums
    run in another order)."""
    npdt = BF16 if dt == "bfloat16" else np.dtype(dt)
    src = (f"def mm({dt}(M,K) A, {dt}(K,N) B) -> (C, E) {{\n C(m,n) +=! A(m,k) * B(k,n)\n"
           f" E(m,n) = tanh(C(m,n)) * A(m, 0)\n}}")
    rng = np.random.default_rng(12)
    a = rng.standard_normal((37, 70)).astype(npdt)
    b = rng.standard_normal((70, 45)).astype(npdt)
    gpu = polyc.define(src, target="cuda", emulate=True)(a, b)
    cpu = polyc.define(src)(a, b)
    ulp = 2.0 ** (-10 if dt == "float16" else -7)
    for g, c in zip(gpu, cpu):
        assert g.dtype == npdt
        g32, c32 = g.astype(np.float32), c.astype(np.float32)
        np.testing.assert_allclose(g32, c32, rtol=2 * ulp, atol=2 * ulp * np.abs(c32).max())


def test_cuda_emulation_wraps_narrow_integers():
    op = polyc.define(_int_source("int8"), target="cuda", emulate=True)
    a, b = _ints("int8", 37, 8), _ints("int8", 37, 9)
    c, _, s = op(a, b)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(c, a * b + a - b)
        np.testing.assert_array_equal(s, [np.sum(a * b, dtype=np.int8)])


def _model(op_type: str, dt: int, **attrs):
    node = helper.make_node(op_type, ["a", "b"], ["y"], **attrs)
    shape = [3, 37]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", dt, shape),
                                            helper.make_tensor_value_info("b", dt, shape)],
                              [helper.make_tensor_value_info("y", dt, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8)


@pytest.mark.parametrize("op_type,dt", [
    ("Add", TensorProto.INT8), ("Mul", TensorProto.UINT8), ("Sub", TensorProto.UINT16),
    ("Max", TensorProto.INT16), ("Div", TensorProto.UINT32), ("Mod", TensorProto.INT8),
    ("Add", TensorProto.FLOAT16), ("Mul", TensorProto.FLOAT16), ("Div", TensorProto.FLOAT16)])
def test_onnx_narrow_types_match_onnxruntime_or_onnx_reference(op_type, dt):
    ort = pytest.importorskip("onnxruntime")
    model = _model(op_type, dt)
    npdt = helper.tensor_dtype_to_np_dtype(dt)
    rng = np.random.default_rng(11)
    if np.dtype(npdt).kind == "f":
        a = rng.standard_normal((3, 37)).astype(npdt)
        b = (rng.standard_normal((3, 37)) + 3).astype(npdt)
    else:
        info = np.iinfo(npdt)
        a = rng.integers(info.min, info.max, (3, 37), dtype=npdt, endpoint=True)
        b = rng.integers(max(1, info.min), info.max, (3, 37), dtype=npdt, endpoint=True)
    try:
        sess = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime has no kernel of this op for this type: onnx's own
        from onnx.reference import ReferenceEvaluator
        sess = ReferenceEvaluator(model)
    want = sess.run(None, {"a": a, "b": b})[0]
    got = polyc.compile_onnx(model)(a, b)
    got = got[0] if isinstance(got, (tuple, list)) else got
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


_CHILD = """
import ml_dtypes, numpy as np, polyc
for dt, src in {sources!r}:
    op = polyc.define(src, sanitize=True, cflags=("-Wall", "-Wextra", "-Werror"))
    x = np.arange(1, 58).astype(dt)
    out = op(x, x)
    print("ok", dt, flush=True)
"""


@pytest.mark.skipif(asan_runtime() is None, reason="gcc has no libasan.so")
def test_narrow_types_are_sanitizer_and_warning_clean():
    sources = [(dt, _int_source(dt)) for dt in ("int8", "uint16", "uint64")] + [
        (dt, f"def h({dt}(N) A, {dt}(N) B) -> (C, S) {{\n"
             f"  C(i) = exp(A(i) * B(i) - A(i))\n  S(j) +=! A(i) * B(i) where j in 0:1\n}}")
        for dt in ("float16", "bfloat16")]
    env = sanitizer_environment()
    done = subprocess.run([sys.executable, "-c", _CHILD.format(sources=sources)], env=env,
                          capture_output=True, text=True, timeout=600, check=False,
                          cwd=os.path.dirname(os.path.abspath(__file__)))
    report = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"
    assert done.returncode == 0, report
    for dt, _ in sources:
        assert f"ok {dt}" in done.stdout, report


def _qdq_conv_models(c_in: int, relu: bool, seed: int):
    """A QDQ convolution (DequantizeLinear of uint8 input, int8 per-channel weights and
    int32 bias; Conv; maybe Relu; QuantizeLinear) and the same as one QLinearConv."""
    from onnx import numpy_helper
    rng = np.random.default_rng(seed)
    m, k = 16, 3
    w = rng.integers(-127, 128, (m, c_in, k, k)).astype(np.int8)
    sx, zx, sy, zy = np.float32(0.02), np.uint8(117), np.float32(0.9), np.uint8(3)
    sw = rng.uniform(0.001, 0.01, m).astype(np.float32)
    zw = np.zeros(m, np.int8)
    b = rng.integers(-5000, 5000, m).astype(np.int32)
    sb = (sx * sw).astype(np.float32)
    inits = {"w": w, "sx": sx, "zx": zx, "sw": sw, "zw": zw, "sy": sy, "zy": zy, "b": b,
             "sb": sb, "zb": np.zeros(m, np.int32)}
    init = [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()]
    xin = [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, c_in, 9, 11])]
    yout = [helper.make_tensor_value_info("y", TensorProto.UINT8, None)]
    qdq = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
           helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], axis=0),
           helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bf"], axis=0),
           helper.make_node("Conv", ["xf", "wf", "bf"], ["c"], pads=[1, 1, 1, 1])]
    fused = [helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy",
                                              "b"], ["c"], pads=[1, 1, 1, 1])]
    x = rng.integers(0, 256, (1, c_in, 9, 11)).astype(np.uint8)
    return (*_quantized_pair(qdq, fused, relu, xin, yout, init), x)


def _quantized_pair(qdq: list, fused: list, relu: bool, xin: list, yout: list,
                    init: list) -> tuple:
    """The QDQ model (``qdq``'s product ``c``, a Relu maybe, QuantizeLinear to ``y``) and
    its fused twin (``fused``'s quantized ``c``, the Relu as a Max with the output zero
    point)."""
    if relu:
        qdq = qdq + [helper.make_node("Relu", ["c"], ["r"])]
    qdq = qdq + [helper.make_node("QuantizeLinear", ["r" if relu else "c", "sy", "zy"], ["y"])]
    fused = fused + [helper.make_node("Max", ["c", "zy"], ["y"]) if relu
                     else helper.make_node("Identity", ["c"], ["y"])]

    def make(nodes):
        g = helper.make_graph(nodes, "g", xin, yout, init)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)],
                                 ir_version=9)
    return make(qdq), make(fused)


def _qdq_gemm_models(rows: int, k: int, m: int, trans_b: bool, bias: str, relu: bool,
                     seed: int):
    """A QDQ fully-connected layer (``Gemm`` with ``transB``, else ``MatMul``; ``bias``
    "int32" (DequantizeLinear'd, scale x_scale * w_scale), "float" or ""), and the same
    as ``Reshape``, ``QLinearConv`` 1x1, ``Reshape`` for onnx's reference evaluator."""
    from onnx import numpy_helper
    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, (m, k) if trans_b else (k, m)).astype(np.int8)
    sx, zx, sy, zy = np.float32(0.02), np.uint8(117), np.float32(0.9), np.uint8(3)
    sw = rng.uniform(0.001, 0.01, m).astype(np.float32)
    b = rng.integers(-100000, 100000, m).astype(np.int32)  # (about +-10 output quanta)
    inits = {"w": w, "sx": sx, "zx": zx, "sw": sw, "zw": np.zeros(m, np.int8), "sy": sy,
             "zy": zy, "b": b, "sb": (sx * sw).astype(np.float32), "zb": np.zeros(m, np.int32),
             "bfl": (b * sx * sw).astype(np.float32), "w4": (w if trans_b else w.T).reshape(m, k, 1, 1),
             "s4": np.array([rows, k, 1, 1], np.int64), "s2": np.array([rows, m], np.int64)}
    init = [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()]
    xin = [helper.make_tensor_value_info("x", TensorProto.UINT8, [rows, k])]
    yout = [helper.make_tensor_value_info("y", TensorProto.UINT8, None)]
    ins = ["xf", "wf"] + {"int32": ["bf"], "float": ["bfl"], "": []}[bias]
    qdq = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
           helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"],
                            axis=0 if trans_b else 1),
           helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bf"], axis=0),
           helper.make_node("Gemm", ins, ["c"], transB=1) if trans_b or bias
           else helper.make_node("MatMul", ins, ["c"])]
    fused = [helper.make_node("Reshape", ["x", "s4"], ["x4"]),
             helper.make_node("QLinearConv", ["x4", "sx", "zx", "w4", "sw", "zw", "sy", "zy"]
                              + (["b"] if bias else []), ["c4"]),
             helper.make_node("Reshape", ["c4", "s2"], ["c"])]
    x = rng.integers(0, 256, (rows, k)).astype(np.uint8)
    return (*_quantized_pair(qdq, fused, relu, xin, yout, init), x)


@pytest.mark.parametrize("dot", [False, True], ids=["float", "dot"])
@pytest.mark.parametrize("rows,k,m,trans_b,bias,relu", [
    (1, 37, 20, True, "int32", True),    # a classifier: one row, K no whole quads
    (5, 64, 10, False, "", False),        # a MatMul, no bias
    (3, 130, 33, True, "float", True)])   # a float bias (in the sums' units)
def test_qdq_gemm_runs_as_an_integer_convolution(rows, k, m, trans_b, bias, relu, dot,
                                                  monkeypatch):
    """A QDQ fully-connected layer runs as a 1x1 QDQ convolution on the integers
    (int8 weights, :func:`gemms_as_convs`): equal bit for bit to onnx's reference of
    the same layer as a QLinearConv (a float bias: its value in units of the sums,
    ``b / (x_scale * w_scale)``, here the int32 bias' own values, only on dot products;
    without them the float graph runs, within one output quantum); on the CUDA target
    too."""
    from onnx.reference import ReferenceEvaluator

    from polyc.frontend.onnx_passes import pass_stats
    from polyc.schedule import machine
    monkeypatch.setattr(machine, "has_integer_dot", lambda: dot)
    qdq, fused, x = _qdq_gemm_models(rows, k, m, trans_b, bias, relu, seed=k)
    got = polyc.compile_onnx(qdq)(x)
    got = got[0] if isinstance(got, (tuple, list)) else got
    want = ReferenceEvaluator(fused).run(None, {"x": x})[0]
    assert got.dtype == np.uint8 and got.shape == (rows, m)
    if bias == "float" and not dot:
        assert pass_stats()["qdq_gemms"] == 0 and pass_stats()["qdq_convs"] == 0
        assert np.abs(got.astype(int) - want).max() <= 1
        return
    assert pass_stats()["qdq_gemms"] == 1 and pass_stats()["qdq_convs"] == 1
    np.testing.assert_array_equal(got, want)
    if not dot:  # the CUDA target too (emulated)
        cuda = polyc.compile_onnx(qdq, target="cuda", emulate=True)
        np.testing.assert_array_equal(cuda.run(None, {"x": x})[0], want)


@pytest.mark.parametrize("dot", [False, True], ids=["float", "dot"])
@pytest.mark.parametrize("c_in,relu", [(8, True), (40, False), (600, True)])
def test_qdq_convolution_is_exact(c_in, relu, dot, monkeypatch):
    """The fused QDQ convolution computes the integer sums exactly -- in float32 where
    the weights bound them below 2**24, split into input-channel ranges otherwise (600
    channels of 3x3 int8 weights are split), or, for a CPU with integer dot products, on
    the integers -- and requantizes as ONNX's QLinearConv: equal to onnx's reference
    evaluation of the QLinearConv bit for bit."""
    from onnx.reference import ReferenceEvaluator

    from polyc.frontend.onnx_passes import pass_stats
    from polyc.schedule import machine
    monkeypatch.setattr(machine, "has_integer_dot", lambda: dot)
    qdq, fused, x = _qdq_conv_models(c_in, relu, seed=c_in)
    got = polyc.compile_onnx(qdq)(x)
    got = got[0] if isinstance(got, (tuple, list)) else got
    assert pass_stats()["qdq_convs"] == 1
    assert pass_stats()["conv_dot"] == int(dot)
    want = ReferenceEvaluator(fused).run(None, {"x": x})[0]
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, want)


def _float32_edge_cases() -> np.ndarray:
    """Every float16 value and its float32 neighbours (one and two ulps either side, the
    midpoints to the next float16 and theirs), the specials, and random bit patterns."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    f = h[np.isfinite(h)].astype(np.float32)
    with np.errstate(over="ignore"):  # 65504's next is infinity
        nxt = np.nextafter(h[np.isfinite(h)], np.float16(np.inf)).astype(np.float32)
    mid = ((f.astype(np.float64) + nxt.astype(np.float64)) / 2).astype(np.float32)
    bits = np.concatenate([f.view(np.uint32), mid.view(np.uint32)])
    around = (bits[:, None].astype(np.int64) + np.arange(-2, 3)[None, :]).reshape(-1)
    rng = np.random.default_rng(11)
    randoms = rng.integers(0, 1 << 32, 1 << 18, dtype=np.int64)
    specials = np.array([np.inf, -np.inf, np.nan, 65504, 65519.996, 65520, 65536, 1e30,
                         -1e-45, 1e-45, 2.0**-25, 2.0**-24, 3 * 2.0**-26, 0.0, -0.0],
                        np.float32).view(np.uint32)
    out = np.concatenate([around % (1 << 32), randoms, specials]).astype(np.uint32)
    return out.view(np.float32)


def test_rounding_to_float16_is_numpys_bit_for_bit():
    """The float-to-float16 rounding (``polyc_round_f16``; a relu of a rounded value is
    not rounded again) against numpy's, bit for bit, over every float16 boundary, the
    specials and random floats -- in C and in the CUDA target (emulated)."""
    src = """
def r(float(N) X) -> (Y, Z) {
  Y(i) = float(float16(X(i)))
  Z(i) = float16(relu(float16(X(i) * 3.0)))
}"""
    x = _float32_edge_cases()
    with np.errstate(over="ignore", invalid="ignore"):
        want_y = x.astype(np.float16).astype(np.float32)
        want_z = np.maximum((x * np.float32(3.0)).astype(np.float16), np.float16(0))
    for target in ("c", "cuda"):
        y, z = polyc.define(src, target=target, emulate=target == "cuda")(x)
        assert np.array_equal(np.isnan(y), np.isnan(want_y))
        ok = ~np.isnan(want_y)
        np.testing.assert_array_equal(y[ok].view(np.uint32), want_y[ok].view(np.uint32))
        okz = ~np.isnan(want_z)
        assert np.array_equal(np.isnan(z), ~okz)
        np.testing.assert_array_equal(z[okz].view(np.uint16), want_z[okz].view(np.uint16))


@pytest.mark.parametrize("isa", [("-Wall", "-Werror"), ("-mno-avx512f",), ("-O0",)],
                         ids=["native", "no-avx512", "O0"])
@pytest.mark.parametrize("rows", [True, False], ids=["rows", "per-element"])
def test_short_vector_loops_round_their_rows_to_float16_bit_for_bit(isa, rows, monkeypatch):
    """A vector loop over a constant range (100 columns: six vectors and a masked
    tail) whose statement rounds to float16 twice rounds rows (``polyc_round_f16_row``),
    as a register tile's copy-out does: numpy's bits over the float16 boundaries, the
    specials and random floats (and no unused iterator in a row's loop: -Wall; the
    conversions' rounding an immediate even without optimisation: -O0)."""
    from polyc.codegen import c_family
    monkeypatch.setattr(c_family, "ROUND_ROWS_F16", rows)
    src = """
def f(float(M,N) X, float(N) B) -> (Y) {
  Y(m,n) = float(float16(float16(X(m,n) + B(n)) * 3.0))
}"""
    x = _float32_edge_cases()
    n = 100
    m = -(-x.size // n)
    xs = np.resize(x, m * n).reshape(m, n)
    b = np.zeros(n, np.float32)
    b[::7] = np.float32(2.0 ** -20)  # a few columns shifted off the boundaries
    op = polyc.define(src, cflags=isa)
    got = op(xs, b)
    with np.errstate(over="ignore", invalid="ignore"):
        want = ((xs + b).astype(np.float16) * np.float16(3)).astype(np.float32)
    assert ("polyc_round_f16_row(polyc_t1" in op.c_source) == rows
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))


def test_hoisted_roundings_keep_their_order_and_their_conditions():
    """``hoist_roundings`` takes the innermost rounding first, gives each its own
    temporary, and leaves a statement alone where a rounding sits under ``?:``."""
    from polyc.codegen.c_expr import hoist_roundings
    f = "polyc_round_f16"
    assert hoist_roundings(f"y = g((float){f}((float){f}(a + b) * c))", f, "t{}[i]") == (
        ["a + b", "t0[i] * c"], "y = g(t1[i])")
    assert hoist_roundings(f"y = {f}(a) + {f}(b[(i)])", f, "t{}") == (["a", "b[(i)]"],
                                                                      "y = t0 + t1")
    assert hoist_roundings(f"y = c ? {f}(X[i]) : 0.0f", f, "t{}") is None
    assert hoist_roundings("y = a + b", f, "t{}") is None


@pytest.mark.parametrize("isa", [(), ("-mno-avx512f",), ("-mno-avx",)],
                         ids=["native", "no-avx512", "no-f16c"])
@pytest.mark.parametrize("rows", [True, False], ids=["rows", "per-element"])
def test_register_tile_copy_out_rounds_to_float16_bit_for_bit(isa, rows, monkeypatch):
    """A register tile whose copy-out rounds to float16 twice (``float16(float16(C +
    R) * 3)``) rounds each row with F16C's conversions (``polyc_round_f16_row``:
    AVX-512 with a masked tail, 256-bit F16C, or the scalar helper): numpy's bits over
    the float16 boundaries, the specials and random floats, on tiles cut at every edge
    (999 columns). ``B`` is zero and ``A`` positive, so ``C`` is +0 and the first
    rounding sees ``R`` itself (a reduction of one step takes no register tile)."""
    from polyc.codegen import c_family
    monkeypatch.setattr(c_family, "ROUND_ROWS_F16", rows)
    src = """
def f(float(M,K) A, float(K,N) B, float(M,N) R) -> (Y, Z) {
  C(m,n) +=! A(m,k) * B(k,n)
  Y(m,n) = float(float16(float16(C(m,n) + R(m,n)) * 3.0))
  D(m,n) +=! A(m,k) * B(k,n)
  Z(m,n) = float(float16(D(m,n) + R(m,n)))
}"""
    x = _float32_edge_cases()
    n = 999
    m = -(-x.size // n)
    r = np.resize(x, m * n).reshape(m, n)
    a = np.random.default_rng(3).uniform(0.5, 2, (m, 2)).astype(np.float32)
    b = np.zeros((2, n), np.float32)
    op = polyc.define(src, register_tile=(4, 64), cflags=isa)
    got_y, got_z = op(a, b, r)
    with np.errstate(over="ignore", invalid="ignore"):
        first = (np.float32(0) + r).astype(np.float16)
        want_y = (first * np.float16(3)).astype(np.float32)
        want_z = first.astype(np.float32)
    assert ("polyc_round_f16_row(polyc_t1" in op.c_source) == rows
    for got, want in ((got_y, want_y), (got_z, want_z)):
        assert np.array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        np.testing.assert_array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))


@pytest.mark.parametrize("dt,zero", [(TensorProto.UINT8, 131), (TensorProto.INT8, -7),
                                     (TensorProto.UINT16, 40000), (TensorProto.INT16, 0)])
def test_quantize_clamps_before_rounding_exactly(dt, zero, monkeypatch, tmp_path):
    """``saturate(rint(x / s) + zp)`` is printed as ``rint(clamp(x / s, lo - zp, hi - zp))
    + zp`` (:data:`polyc.codegen.c_expr.CLAMP_BEFORE_ROUNDING`, faster under gcc 12): the
    same value for ties, values just inside and past the limits, infinities and NaN, as
    the plain order gives, and numpy's formula for every finite input."""
    from polyc.codegen import c_expr
    npdt = np.dtype(helper.tensor_dtype_to_np_dtype(dt))
    info = np.iinfo(npdt)
    scale = np.float32(0.25)
    g = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])], "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 61])],
        [helper.make_tensor_value_info("y", dt, [3, 61])],
        [helper.make_tensor("s", TensorProto.FLOAT, [], [float(scale)]),
         helper.make_tensor("z", dt, [], [zero])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    edges = [(b - zero + d) * scale for b in (info.min, info.max) for d in (-1, -0.5, 0, 0.5, 1)]
    special = np.array(edges + [0.125, 0.375, -0.125, -0.375, 1e30, -1e30, np.inf, -np.inf,
                                np.nan, -0.0], np.float32)
    x = np.random.default_rng(5).uniform(-2 * info.max * float(scale) - 9,
                                         2 * info.max * float(scale) + 9, 183).astype(np.float32)
    x[:special.size] = special
    x = x.reshape(3, 61)
    results = []
    for flag in (False, True):
        monkeypatch.setattr(c_expr, "CLAMP_BEFORE_ROUNDING", flag)
        compiled = polyc.compile_onnx(
            model, options=polyc.Options(cache_dir=str(tmp_path / str(flag))))
        source = open(compiled.library_path[:-3] + ".c").read()
        assert ("rintf(polyc_clamp" in source) == flag
        out = compiled(x)
        results.append(np.asarray(out[0] if isinstance(out, (tuple, list)) else out))
    np.testing.assert_array_equal(results[0], results[1])
    # the CUDA target prints the same expression (c_expr's printer), run by the emulation
    monkeypatch.setattr(c_expr, "CLAMP_BEFORE_ROUNDING", True)
    gpu = polyc.compile_onnx(model, target="cuda", emulate=True).run(None, {"x": x})[0]
    np.testing.assert_array_equal(gpu, results[1])
    finite = np.isfinite(x)
    want = np.clip(np.rint(x.astype(np.float64) / scale) + zero, info.min, info.max)
    np.testing.assert_array_equal(results[1][finite], want[finite].astype(npdt))


def _f16_model(op: str, shape, out_shape, **attrs):
    from onnx import TensorProto, helper
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT16, list(shape))], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT16, list(out_shape))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("target", ["c", "cuda"])
@pytest.mark.parametrize("op", ["AveragePool", "GlobalAveragePool"])
def test_float16_average_pool_sums_in_float32(op, target):
    """A 7x7 float16 average pool (its taps unrolled) sums in float32 and rounds once,
    as the reduction form and onnxruntime do: 1024 and 48 quarters sum to 1036 (1035
    rounded at every addition of the tree), 1036 / 49 rounds to 21.14 (not 21.12)."""
    attrs = {"kernel_shape": [7, 7]} if op == "AveragePool" else {}
    m = polyc.compile_onnx(_f16_model(op, (1, 3, 7, 7), (1, 3, 1, 1), **attrs),
                           target=target, emulate=target == "cuda" or None)
    x = np.full((1, 3, 7, 7), 0.25, np.float16)
    x[0, :, 0, 0] = 1024
    x[0, 1] = np.random.default_rng(0).standard_normal((7, 7)).astype(np.float16)
    (y,) = m(x)
    want = (x.astype(np.float32).sum(axis=(2, 3), keepdims=True) / np.float32(49))
    np.testing.assert_array_equal(y, want.astype(np.float16))
    assert y[0, 0, 0, 0] == np.float16(21.14)


@pytest.mark.parametrize("target", ["c", "cuda"])
def test_float16_copy_keeps_the_bits(target):
    """A float16 transpose copies its elements' bits: no conversion to float and back
    (7x slower on ResNet-50's last transpose), the same values, subnormals included."""
    m = polyc.compile_onnx(_f16_model("Transpose", (5, 3, 4), (4, 3, 5), perm=[2, 1, 0]),
                           target=target, emulate=target == "cuda" or None)
    bits = np.random.default_rng(1).integers(0, 1 << 16, (5, 3, 4), dtype=np.uint16)
    bits[(bits & 0x7c00) == 0x7c00] = 0x3c00  # no NaN (polyc makes them all one NaN)
    bits[0, 0, :] = [0x7c00, 0xfc00, 0x0001, 0x8000]  # infinities, a subnormal, -0
    (y,) = m(bits.view(np.float16))
    np.testing.assert_array_equal(y.view(np.uint16), bits.transpose(2, 1, 0))
    assert "polyc_f16_store(polyc_f16_load" not in m.c_source  # (the .cu for CUDA)


#: (scale, zero point, output type): the relu before each QuantizeLinear is redundant
#: where the clamp's lower bound less the zero point is at least zero
_RELU_QUANT = [(0.37, 0, TensorProto.UINT8, True), (3.6171164512634277, 0, TensorProto.UINT8, True),
               (0.5, 10, TensorProto.UINT8, False), (0.25, 0, TensorProto.INT8, False)]


@pytest.mark.parametrize("scale,zero,otype,dropped", _RELU_QUANT)
def test_relu_under_a_quantizing_clamp(monkeypatch, scale, zero, otype, dropped):
    """``QuantizeLinear(Relu(a + b))``: where the saturating clamp's lower bound less the
    zero point is at least zero (uint8 with zero point 0) the relu goes from the C
    (``c_expr._without_relu``, through the division by the scale), and the bytes are
    those of the relu kept, over negatives, +-0, denormals, +-inf, NaN, values past the
    range and ties of the rounding; a zero point of 10 or an int8 output keeps it."""
    from onnx import numpy_helper

    from polyc.codegen import c_expr
    ztype = np.uint8 if otype == TensorProto.UINT8 else np.int8
    init = [numpy_helper.from_array(np.float32(scale), "s"),
            numpy_helper.from_array(ztype(zero), "z")]
    nodes = [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4099])
                                       for n in "ab"],
                          [helper.make_tensor_value_info("y", otype, [4099])], init)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    rng = np.random.default_rng(7)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-38, -3e38, 3e38,
                        scale * 0.5, scale * 1.5, scale * 2.5, -scale * 0.5, scale * 255.5,
                        scale * 254.5, scale * 300], np.float32)
    a = np.concatenate([special, rng.standard_normal(4099 - special.size).astype(np.float32)
                        * np.float32(scale * 100)])
    b = np.where(np.arange(4099) % 3 == 0, np.float32(0), a[::-1]).astype(np.float32)
    outs, sources = [], []
    for drop in (False, True):
        monkeypatch.setattr(c_expr, "DROP_CLAMPED_RELU", drop)
        m = polyc.compile_onnx(model)
        outs.append(m(a, b)[0])
        sources.append(m.c_source)
    np.testing.assert_array_equal(outs[1], outs[0])
    # the CUDA target prints the same expressions (emulated on the CPU)
    cuda = polyc.compile_onnx(model, target="cuda", emulate=True)
    np.testing.assert_array_equal(np.asarray(cuda(a, b)[0]), outs[0])
    finite = np.isfinite(a + b)
    with np.errstate(over="ignore"):
        want = np.clip(np.rint(np.maximum(a + b, 0) / np.float32(scale)) + zero,
                       *((0, 255) if ztype is np.uint8 else (-128, 127)))
    np.testing.assert_array_equal(outs[0][finite], want[finite].astype(ztype))
    def relu_called(src):  # (the prelude defines it: ``polyc_reluf(float x)``)
        return re.search(r"polyc_reluf\((?!float )", src) is not None
    assert relu_called(sources[1]) != dropped
    assert relu_called(sources[0])
