"""Coalescing of elementwise kernels (polyc/coalesce.py): which loops merge, which do
not, results against numpy, and an ONNX model's residual requantization as one loop."""
from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import assert_matches_numpy, random_inputs
from onnx import TensorProto, helper, numpy_helper
from onnx_models import onnxruntime_outputs

import polyc
from polyc.coalesce import coalesce_elementwise
from polyc.frontend import from_tc


def _shapes(kernel):
    return {a.name: tuple(int(d.value) for d in a.shape) for a in kernel.arrays}


def test_residual_merges_past_a_per_channel_scale():
    """``w`` and ``h`` merge (every wide access walks them last); ``c`` does not, the
    scale reads it alone; the leading extent-1 ``n`` read at 0 stays."""
    k = from_tc("""def f(float(1,5,7,9) A, float(5) s, float(1,5,7,9) B) -> (Y) {
        Y(n,c,h,w) = A(n,c,h,w) * s(c) + B(0,c,h,w)
    }""")
    c = coalesce_elementwise(k)
    assert _shapes(c) == {"A": (1, 5, 63), "s": (5,), "B": (1, 5, 63), "Y": (1, 5, 63)}
    assert len(c.statements[0].iterators) == 3
    a, s, b = random_inputs([((1, 5, 7, 9), "float32"), ((5,), "float32"),
                             ((1, 5, 7, 9), "float32")], 0)
    got = polyc.Operator(c)(a.reshape(1, 5, 63), s, b.reshape(1, 5, 63))
    assert_matches_numpy(np.asarray(got).reshape(1, 5, 7, 9), a * s[:, None, None] + b)


def test_chain_of_statements_becomes_one_loop():
    k = from_tc("""def f(uint8(2,3,5,7) Q, float(2,3,5,7) R) -> (Y, Z) {
        T(a,b,c,d) = (float(Q(a,b,c,d)) - 3.0) * 0.5
        Y(a,b,c,d) = fmax(T(a,b,c,d) + R(a,b,c,d), 0.0)
        Z(a,b,c,d) = uint8(fmin(fmax(floor(Y(a,b,c,d) / 0.25), 0.0), 255.0))
    }""")
    c = coalesce_elementwise(k)
    assert {len(s.iterators) for s in c.statements} == {1}
    assert set(_shapes(c).values()) == {(210,)}
    q = np.random.default_rng(0).integers(0, 256, (2, 3, 5, 7)).astype(np.uint8)
    r = random_inputs([((2, 3, 5, 7), "float32")], 1)[0]
    y, z = polyc.Operator(c)(q.reshape(-1), r.reshape(-1))
    want_y = np.maximum((q.astype(np.float32) - 3.0) * 0.5 + r, 0.0)
    assert_matches_numpy(np.asarray(y).reshape(q.shape), want_y)
    np.testing.assert_array_equal(np.asarray(z).reshape(q.shape),
                                  np.clip(np.floor(want_y / np.float32(0.25)), 0, 255))


@pytest.mark.parametrize("src", [
    # an iterator in the value (a guard): its position matters
    """def f(float(4,6) A) -> (Y) { Y(i,j) = j < 3 ? A(i,j) : 0.0 }""",
    # a reduction
    """def f(float(4,6) A) -> (Y) { Y(i) +=! A(i,j) }""",
    # a transposed read
    """def f(float(6,6) A) -> (Y) { Y(i,j) = A(j,i) }""",
    # a broadcast along the last dimension
    """def f(float(4,6) A, float(4) b) -> (Y) { Y(i,j) = A(i,j) + b(i) }""",
    # a shifted read (not the box)
    """def f(float(4,7) A) -> (Y) { Y(i,j) = A(i,j+1) where j in 0:6 }""",
    # sizes are parameters: the kernel's shapes are its caller's
    """def f(float(N,M) A) -> (Y) { Y(i,j) = A(i,j) * 2.0 }""",
])
def test_left_alone(src):
    k = from_tc(src)
    assert coalesce_elementwise(k) is k


def test_onnx_requantized_residual_is_one_loop(tmp_path):
    """A QDQ residual sum (dequantize two uint8 maps, add, Relu, quantize) over a 7x7 map
    runs as loops over all the elements, and matches onnxruntime exactly."""
    shape = (1, 24, 7, 7)
    inits = [numpy_helper.from_array(np.array(v, dt), n) for n, v, dt in (
        ("sa", 0.05, np.float32), ("za", 120, np.uint8), ("sb", 0.07, np.float32),
        ("zb", 130, np.uint8), ("sy", 0.09, np.float32), ("zy", 0, np.uint8))]
    nodes = [helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["fa"]),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["fb"]),
             helper.make_node("Add", ["fa", "fb"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["y"])]
    g = helper.make_graph(nodes, "residual",
                          [helper.make_tensor_value_info(n, TensorProto.UINT8, shape)
                           for n in ("a", "b")],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, shape)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    rng = np.random.default_rng(3)
    feeds = {n: rng.integers(0, 256, shape).astype(np.uint8) for n in ("a", "b")}
    want = onnxruntime_outputs(model, feeds)[0]
    for target in ("c", "cuda"):
        m = polyc.compile_onnx(model, target=target, emulate=target == "cuda",
                               options=polyc.Options(cache_dir=str(tmp_path)))
        np.testing.assert_array_equal(m.run(None, feeds)[0], want)
    cpu = polyc.compile_onnx(model, options=polyc.Options(cache_dir=str(tmp_path)))
    bounds = re.findall(r"for \(int64_t (c\d+) = 0; \1 <= (\d+);", cpu.c_source)
    assert bounds and {int(hi) for _, hi in bounds} == {24 * 49 - 1}, cpu.c_source
