"""Pools as an unrolled interior plus a reduction border (frontend/onnx_ops_nn.py), and
the vectorizable fmax/fmin of the generated C (codegen/c_expr.py): results against
onnx's reference evaluator and onnxruntime on odd sizes, and the shape of the code."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_node_harness import check_node, graph_of, lower_node, make_model, rand

import polyc
from polyc.frontend.onnx_ops_nn import POOL_UNROLL

# (input shape, attributes): interiors that end at the output's extent or stop short of
# it, in the first or a later dimension, empty interiors, windows too large to unroll
CASES = {
    "resnet_3x3_s2_p1": ((1, 3, 13, 11), dict(kernel_shape=[3, 3], strides=[2, 2],
                                              pads=[1, 1, 1, 1])),
    "asym_pads": ((2, 3, 9, 10), dict(kernel_shape=[3, 2], strides=[2, 1],
                                      pads=[0, 1, 2, 1])),
    "high_side_only_w": ((1, 2, 7, 9), dict(kernel_shape=[2, 3], pads=[0, 0, 0, 2])),
    "stride3_dilation2": ((1, 2, 15, 13), dict(kernel_shape=[3, 2], strides=[3, 2],
                                               dilations=[2, 3], pads=[2, 1, 1, 1])),
    "nopad_2x2_s2": ((1, 5, 9, 11), dict(kernel_shape=[2, 2], strides=[2, 2])),
    "ceil_mode": ((1, 2, 8, 9), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1],
                                     ceil_mode=1)),
    "same_lower": ((1, 2, 10, 6), dict(kernel_shape=[3, 3], strides=[2, 2],
                                      auto_pad="SAME_LOWER")),
    "empty_interior": ((1, 2, 3, 4), dict(kernel_shape=[3, 3], pads=[2, 2, 2, 2])),
    "too_large_to_unroll": ((1, 2, 12, 11), dict(kernel_shape=[9, 8], pads=[1, 1, 1, 1])),
    "conv1d": ((2, 3, 17), dict(kernel_shape=[4], strides=[3], pads=[2, 1])),
    "conv3d": ((1, 2, 5, 6, 7), dict(kernel_shape=[2, 3, 2], strides=[1, 2, 2],
                                     pads=[1, 1, 0, 0, 1, 1])),
}


def _cases():
    for name, (shape, attrs) in CASES.items():
        yield pytest.param("MaxPool", shape, attrs, id=f"max-{name}")
        for cip in (0, 1):
            yield pytest.param("AveragePool", shape, dict(attrs, count_include_pad=cip),
                               id=f"avg{cip}-{name}")


@pytest.mark.parametrize("op,shape,attrs", list(_cases()))
def test_pool_matches_reference(op, shape, attrs):
    # onnx's reference AveragePool has no dilations, and its SAME_LOWER pools at opset
    # 19 pad at the end: onnxruntime only there
    ref = not (op == "AveragePool" and "dilations" in attrs) and \
        attrs.get("auto_pad") != "SAME_LOWER"
    check_node(op, dict(x=rand(*shape)), opset=19, use_reference=ref, **attrs)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(1, 5, 7, 7), (2, 3, 9, 9), (2, 3, 5), (1, 2, 2, 3, 4)])
def test_global_pool_matches_reference(op, shape):
    # small planes are unrolled (7x7, 5, 2x3x4), 9x9 is beyond POOL_UNROLL
    assert (int(np.prod(shape[2:])) <= POOL_UNROLL) == (shape != (2, 3, 9, 9))
    check_node(op, dict(x=rand(*shape)), use_reference=len(shape) == 4 or op[6] != "M")


def _lowered(op, shape, **attrs) -> str:
    x = rand(*shape)
    model = make_model(op, dict(x=x), ["y"], **attrs)
    src, *_ = lower_node(graph_of(model, {}))
    return src


def test_resnet_maxpool_is_an_unrolled_interior_and_a_border():
    src = _lowered("MaxPool", (1, 4, 14, 14), kernel_shape=[3, 3], strides=[2, 2],
                   pads=[1, 1, 1, 1])
    lines = [ln.strip() for ln in src.splitlines()[1:-1]]
    # the interior: no window index, nine taps; the border: row 0, then column 0
    inner = [ln for ln in lines if " = " in ln]
    assert len(inner) == 1 and "k0" not in inner[0] and inner[0].count("t_x(") == 9
    assert inner[0].endswith("o0 in 1:7, o1 in 1:7")
    border = [ln for ln in lines if "max=!" in ln]
    assert [b.split("where ")[1] for b in border] == [
        "n in 0:1, c in 0:4, o0 in 0:1, o1 in 0:7, k0 in 0:3, k1 in 0:3",
        "n in 0:1, c in 0:4, o0 in 1:7, o1 in 0:1, k0 in 0:3, k1 in 0:3"]
    assert lines[0] == inner[0]  # it ends at the extent: it gives the output its shape


def test_border_slab_comes_first_when_the_interior_stops_short():
    # W: pads 0/2 and a 3-wide window: the interior stops 2 columns short of the extent
    src = _lowered("MaxPool", (1, 2, 7, 9), kernel_shape=[2, 3], pads=[0, 0, 0, 2])
    first = src.splitlines()[1].strip()
    assert "max=!" in first and "o0 in 0:6, o1 in 7:9" in first


def _pool_then_relu(op: str, shape, **attrs):
    """The pool's output is a temporary of the fused kernel (its consumer is elementwise),
    so its shape comes from the first statement writing it."""
    nodes = [helper.make_node(op, ["x"], ["p"], name="pool", **attrs),
             helper.make_node("Relu", ["p"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[2, 3], pads=[0, 1, 1, 2]),
    dict(kernel_shape=[2, 2], strides=[2, 2]),
], ids=["interior_first", "border_first", "no_border"])
def test_pool_inside_a_fused_kernel(op, attrs):
    import onnxruntime as rt
    model = _pool_then_relu(op, (1, 3, 11, 13), **attrs)
    x = rand(1, 3, 11, 13)
    want = rt.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got, = polyc.compile_onnx(model)(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# -- fmax/fmin in C ----------------------------------------------------------------------

def test_max_min_keep_fmax_semantics_with_nan():
    """max/min print as prelude selects with fmax/fmin's results (a NaN operand gives the
    other one), not as calls of libm's fmaxf (a call per element, never vectorized)."""
    op = polyc.define("""
def mm(float(M,N) X, float(M,N) Y) -> (A, B, C, D) {
    A(i) max=! X(i,j)
    B(i) min=! X(i,j)
    C(i,j) = max(X(i,j), Y(i,j))
    D(i,j) = fmin(X(i,j), Y(i,j))
}""")
    rng = np.random.default_rng(3)
    X = rng.standard_normal((5, 37)).astype(np.float32)
    Y = rng.standard_normal((5, 37)).astype(np.float32)
    X[1, ::3] = np.nan
    Y[2, 1::4] = np.nan
    X[3, :] = np.nan  # all NaN: the reduction's identity (as fmaxf(-inf, NaN))
    X[4, 5], Y[4, 5] = np.nan, np.nan
    A, B, C, D = op(X, Y)
    np.testing.assert_array_equal(A, np.fmax.reduce(X, axis=1, initial=-np.inf))
    np.testing.assert_array_equal(B, np.fmin.reduce(X, axis=1, initial=np.inf))
    np.testing.assert_array_equal(C, np.fmax(X, Y))
    np.testing.assert_array_equal(D, np.fmin(X, Y))
    assert "fmaxf(" not in op.c_source.replace("polyc_fmaxf(", "")
    assert "fminf(" not in op.c_source.replace("polyc_fminf(", "")


def test_max_double():
    op = polyc.define("""
def mx(double(N) X, double(N) Y) -> (Z) {
    Z(i) = max(X(i), Y(i)) + min(X(i), Y(i))
}""")
    X = np.array([1.0, np.nan, 3.0, np.nan, -0.5])
    Y = np.array([2.0, 4.0, np.nan, np.nan, -1.5])
    np.testing.assert_array_equal(op(X, Y), np.fmax(X, Y) + np.fmin(X, Y))


@pytest.mark.parametrize("reads,parallel", [(1, False), (3, True)])
def test_parallel_threshold_weighs_the_reads(reads, parallel):
    """100k instances: a copy stays sequential (below TINY_WORK), the same loop reading
    three arrays is three times the work and runs on 2 threads (a 3x3 pool reads nine)."""
    from polyc.schedule.optimize import TINY_WORK
    assert 100_352 < TINY_WORK <= 3 * 100_352
    args = ", ".join(f"float(32,56,56) X{i}" for i in range(reads))
    value = " + ".join(f"X{i}(c,i,j)" for i in range(reads))
    op = polyc.define(f"def k({args}) -> (Y) {{\n  Y(c,i,j) = {value}\n}}", threads=2)
    xs = [rand(32, 56, 56) for _ in range(reads)]
    np.testing.assert_allclose(op(*xs), sum(xs), rtol=1e-6)
    assert ("omp parallel" in op.c_source[op.c_source.rindex("int k("):]) is parallel
