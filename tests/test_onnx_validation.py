"""Every ONNX model is validated before code exists (frontend/onnx_validate.py): shapes
declared in the model and shapes implied by each op must agree, axes and constant
indices must be in range, the opset must be one polyc implements; and indices read at
run time are checked before the kernel that reads them (the run fails with an error
naming the node: ``RunError`` in Python, status 4 and ``<model>_last_error()`` in C)."""
from __future__ import annotations

import re
import subprocess

import numpy as np
import onnxruntime as ort
import pytest
from codegen_helpers import WARNINGS_AS_ERRORS
from onnx import TensorProto, helper, numpy_helper

import polyc
from polyc.errors import CallError, CompileError, SemanticError, UnsupportedError
from polyc.frontend.onnx_graph import UnsupportedOpError
from polyc.frontend.onnx_import import load_graph
from polyc.frontend.onnx_validate import MAX_OPSET, OnnxValidationError, UnsupportedOpsetError
from polyc.model import RunError

F, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32
OPTIONS = polyc.Options(cflags=("-O1",))


def model(nodes, inputs, outputs, inits=(), opset=17, value_info=()):
    """``inputs`` / ``outputs``: (name, elem type, shape or None); ``inits``: name -> array."""
    def vi(name, t, shape):
        return helper.make_tensor_value_info(name, t, shape)
    weights = [numpy_helper.from_array(np.asarray(v), n) for n, v in dict(inits).items()]
    g = helper.make_graph(nodes, "g", [vi(*i) for i in inputs], [vi(*o) for o in outputs],
                          weights, value_info=[vi(*v) for v in value_info])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def refused(m, *words, error=OnnxValidationError):
    """load_graph refuses ``m`` with ``error``, whose message holds every word."""
    with pytest.raises(error) as e:
        load_graph(m)
    msg = str(e.value)
    for w in words:
        assert w in msg, (w, msg)
    assert isinstance(e.value, CompileError)
    return msg


def node(op, ins, outs, name, **attrs):
    return helper.make_node(op, ins, outs, name=name, **attrs)


# -- shapes -------------------------------------------------------------------------------

def test_reshape_element_count():
    shape = {"s": np.array([4, 4], np.int64)}
    for out in ((4, 4), None):  # declared, or left to shape inference
        m = model([node("Reshape", ["x", "s"], ["y"], "reshape_1")], [("x", F, (2, 3))],
                  [("y", F, out)], shape)
        msg = refused(m, "node 'reshape_1' (Reshape)", "'x' of shape [2, 3] (6 elements)",
                      "[4, 4] (16 elements)")
        assert isinstance(OnnxValidationError(msg), SemanticError)
    # 0 copies the input's dimension, -1 is inferred: 0 -> 2, -1 -> 6 / (2 * 4) no
    m = model([node("Reshape", ["x", "s"], ["y"], "r0")], [("x", F, (2, 3))],
              [("y", F, None)], {"s": np.array([0, 4, -1], np.int64)})
    refused(m, "'r0' (Reshape)", "[2, 3] (6 elements)", "[0, 4, -1]", "not a multiple of 8")
    m = model([node("Reshape", ["x", "s"], ["y"], "r1")], [("x", F, (2, 3))],
              [("y", F, None)], {"s": np.array([-1, -1], np.int64)})
    refused(m, "'r1' (Reshape)", "more than one -1")
    # valid: 0 and -1 per the spec; allowzero=1 makes 0 a real zero
    m = model([node("Reshape", ["x", "s"], ["y"], "r2")], [("x", F, (2, 3, 4))],
              [("y", F, None)], {"s": np.array([0, -1], np.int64)})
    assert load_graph(m).tensors["y"].shape == (2, 12)
    m = model([node("Reshape", ["x", "s"], ["y"], "r3", allowzero=1)], [("x", F, (2, 3))],
              [("y", F, None)], {"s": np.array([0, 6], np.int64)}, opset=14)
    refused(m, "'r3' (Reshape)", "(6 elements)", "[0, 6] (0 elements)")


def test_view_ops_keep_the_element_count():
    m = model([node("Flatten", ["x"], ["y"], "flat", axis=1)], [("x", F, (2, 3, 4))],
              [("y", F, (2, 10))])
    refused(m, "'flat' (Flatten)", "[2, 3, 4] (24 elements)", "[2, 10] (20 elements)")
    m = model([node("Squeeze", ["x", "ax"], ["y"], "sq")], [("x", F, (2, 3))],
              [("y", F, None)], {"ax": np.array([1], np.int64)})
    refused(m, "'sq' (Squeeze)", "cannot squeeze axis 1", "[2, 3]", "length is 3")
    m = model([node("Unsqueeze", ["x", "ax"], ["y"], "unsq")], [("x", F, (2, 3))],
              [("y", F, None)], {"ax": np.array([5], np.int64)})
    refused(m, "'unsq' (Unsqueeze)", "axes=5", "out of range")
    m = model([node("Flatten", ["x"], ["y"], "f2", axis=-1)], [("x", F, (2, 3, 4))],
              [("y", F, None)])
    assert load_graph(m).tensors["y"].shape == (6, 4)  # negative axes count from the end


def test_matmul_and_gemm_inner_dimensions():
    m = model([node("MatMul", ["a", "b"], ["y"], "mm")], [("a", F, (2, 3)), ("b", F, (4, 5))],
              [("y", F, (2, 5))])
    refused(m, "node 'mm' (MatMul)", "inner dimensions differ", "'a' [2, 3]", "'b' [4, 5]")
    m = model([node("MatMul", ["a", "b"], ["y"], "bmm")],
              [("a", F, (2, 4, 3)), ("b", F, (3, 3, 5))], [("y", F, None)])
    refused(m, "'bmm' (MatMul)", "batch dimensions", "[2, 4, 3]", "[3, 3, 5]")
    m = model([node("Gemm", ["a", "b"], ["y"], "gemm", transB=1)],
              [("a", F, (2, 3)), ("b", F, (3, 5))], [("y", F, None)])
    refused(m, "'gemm' (Gemm)", "'a' [2, 3] gives K=3", "'b' [3, 5] (transB=1) gives K=5")
    m = model([node("Gemm", ["a", "b", "c"], ["y"], "gemm_c", transA=1)],
              [("a", F, (3, 2)), ("b", F, (3, 5)), ("c", F, (3,))], [("y", F, None)])
    refused(m, "'gemm_c' (Gemm)", "'c' [3] does not broadcast to the output [2, 5]")
    m = model([node("Gemm", ["a", "b"], ["y"], "ok", transA=1, transB=1)],
              [("a", F, (3, 2)), ("b", F, (5, 3))], [("y", F, None)])
    assert load_graph(m).tensors["y"].shape == (2, 5)


def test_elementwise_broadcasting():
    m = model([node("Add", ["a", "b"], ["y"], "add")], [("a", F, (2, 3)), ("b", F, (4,))],
              [("y", F, (2, 3))])
    refused(m, "node 'add' (Add)", "cannot broadcast 'a' [2, 3] and 'b' [4]", "3 vs 4")
    m = model([node("Where", ["c", "a", "b"], ["y"], "wh")],
              [("c", TensorProto.BOOL, (2, 1)), ("a", F, (1, 3)), ("b", F, (5, 3))],
              [("y", F, None)])
    refused(m, "'wh' (Where)", "cannot broadcast", "'c' [2, 1]", "'b' [5, 3]", "2 vs 5")
    m = model([node("Mul", ["a", "b"], ["y"], "mul")], [("a", F, (2, 1, 3)), ("b", F, (4, 1))],
              [("y", F, None)])
    assert load_graph(m).tensors["y"].shape == (2, 4, 3)


def test_declared_shape_disagrees_with_the_op():
    m = model([node("Relu", ["x"], ["y"], "relu")], [("x", F, (2, 3))], [("y", F, (3, 2))])
    refused(m, "node 'relu' (Relu)", "output 'y' has the shape [3, 2]", "'x' [2, 3]",
            "gives [2, 3]")
    m = model([node("MatMul", ["a", "b"], ["h"], "mm"), node("Relu", ["h"], ["y"], "r")],
              [("a", F, (2, 3)), ("b", F, (3, 5))], [("y", F, None)],
              value_info=[("h", F, (4, 4))])
    refused(m, "'mm' (MatMul)", "output 'h' has the shape [4, 4]", "gives [2, 5]")


def test_conv_and_pool_windows():
    w = {"w": np.ones((1, 1, 5, 5), np.float32)}
    m = model([node("Conv", ["x", "w"], ["y"], "conv")], [("x", F, (1, 1, 3, 3))],
              [("y", F, None)], w)
    refused(m, "node 'conv' (Conv)", "kernel [5, 5] is larger than the input",
            "'x' [1, 1, 3, 3]", "length 3")
    m = model([node("Conv", ["x", "w"], ["y"], "conv_pad", pads=[1, 1, 1, 1])],
              [("x", F, (1, 1, 3, 3))], [("y", F, None)], w)
    assert load_graph(m).tensors["y"].shape == (1, 1, 1, 1)  # padded to 5: fits
    w3 = {"w": np.ones((1, 1, 3, 3), np.float32)}
    m = model([node("Conv", ["x", "w"], ["y"], "dil", dilations=[3, 3])],
              [("x", F, (1, 1, 6, 6))], [("y", F, None)], w3)
    refused(m, "'dil' (Conv)", "dilated by 3 to 7", "length 6")
    m = model([node("Conv", ["x", "w"], ["y"], "chan")], [("x", F, (1, 2, 6, 6))],
              [("y", F, None)], w3)
    refused(m, "'chan' (Conv)", "'x' [1, 2, 6, 6] has 2 channels", "'w' [1, 1, 3, 3]")
    m = model([node("MaxPool", ["x"], ["y"], "pool", kernel_shape=[4, 4])],
              [("x", F, (1, 1, 3, 3))], [("y", F, None)])
    refused(m, "node 'pool' (MaxPool)", "kernel [4, 4] is larger than the input")
    m = model([node("AveragePool", ["x"], ["y"], "ceil", kernel_shape=[2, 2], strides=[2, 2],
                    ceil_mode=1)], [("x", F, (1, 1, 5, 5))], [("y", F, None)])
    assert load_graph(m).tensors["y"].shape == (1, 1, 3, 3)


def test_concat_axes_and_dims():
    m = model([node("Concat", ["a", "b"], ["y"], "cat", axis=1)],
              [("a", F, (2, 3)), ("b", F, (4, 5))], [("y", F, (2, 8))])
    refused(m, "node 'cat' (Concat)", "'a' [2, 3] and 'b' [4, 5] differ on axis 0")
    m = model([node("Concat", ["a", "b"], ["y"], "cat2", axis=2)],
              [("a", F, (2, 3)), ("b", F, (2, 5))], [("y", F, None)])
    refused(m, "'cat2' (Concat)", "axis=2 is out of range", "rank 2")


def test_axes_in_range():
    cases = [
        (node("Gather", ["x", "i"], ["y"], "ga", axis=2), [("x", F, (3, 4))],
         {"i": np.array([0], np.int64)}, ["'ga' (Gather)", "axis=2 is out of range",
                                          "'x' [3, 4]"]),
        (node("Transpose", ["x"], ["y"], "tr", perm=[0, 2]), [("x", F, (2, 3))], {},
         ["'tr' (Transpose)", "perm=[0, 2]", "'x' [2, 3]"]),
        (node("Split", ["x", "s"], ["y", "z"], "sp", axis=0), [("x", F, (4, 3))],
         {"s": np.array([1, 2], np.int64)}, ["'sp' (Split)", "[1, 2] sum to 3",
                                             "'x' [4, 3] has length 4"]),
        (node("Split", ["x"], ["y", "z"], "sp3", axis=-3), [("x", F, (4, 3))], {},
         ["'sp3' (Split)", "axis=-3 is out of range"]),
        (node("Slice", ["x", "st", "en", "ax"], ["y"], "sl"), [("x", F, (4, 3))],
         {"st": np.array([0], np.int64), "en": np.array([2], np.int64),
          "ax": np.array([2], np.int64)}, ["'sl' (Slice)", "axes=2 is out of range"]),
        (node("Softmax", ["x"], ["y"], "sm", axis=3), [("x", F, (4, 3))], {},
         ["'sm' (Softmax)", "axis=3"]),
        (node("ReduceSum", ["x", "ax"], ["y"], "rs"), [("x", F, (4, 3))],
         {"ax": np.array([-3], np.int64)}, ["'rs' (ReduceSum)", "axes=-3"]),
        (node("GatherElements", ["x", "i"], ["y"], "ge", axis=1), [("x", F, (3, 4))],
         {"i": np.array([[0, 4]], np.int64)}, ["'ge' (GatherElements)", "index 4 at [0, 1]",
                                               "axis 1 of 'x' [3, 4]"]),
        (node("GatherND", ["x", "i"], ["y"], "gnd"), [("x", F, (3, 4))],
         {"i": np.array([[0, 1, 2]], np.int64)}, ["'gnd' (GatherND)", "address 3 axes"]),
    ]
    for n, inputs, inits, words in cases:
        refused(model([n], inputs, [(o, F, None) for o in n.output], inits), *words)


def test_constant_gather_index_out_of_range():
    m = model([node("Gather", ["x", "i"], ["y"], "gather_c", axis=0)], [("x", F, (3, 4))],
              [("y", F, None)], {"i": np.array([[0, 1], [1000, 2]], np.int64)})
    refused(m, "node 'gather_c' (Gather)", "index 1000 at [1, 0]", "axis 0 of 'x' [3, 4]",
            "valid: -3 to 2")


def test_negative_and_inconsistent_declared_dims():
    m = model([node("Relu", ["x"], ["y"], "r")], [("x", F, (2, -3))], [("y", F, (2, -3))])
    refused(m, "graph input 'x'", "[2, -3]", "negative dimension")
    m = model([node("Add", ["x", "w"], ["y"], "add")], [("x", F, (2, 3)), ("w", F, (2, 3))],
              [("y", F, None)], {"w": np.ones((3, 3), np.float32)})
    refused(m, "graph input 'w' declares the shape [2, 3]", "initializer has the shape [3, 3]")


def test_opsets_and_domains():
    m = model([node("Relu", ["x"], ["y"], "r")], [("x", F, (2,))], [("y", F, (2,))], opset=99)
    msg = refused(m, "ai.onnx", "opset 99", f"up to {MAX_OPSET}", error=UnsupportedOpsetError)
    with pytest.raises(UnsupportedError):
        load_graph(m)
    assert "onnx 1.23" in msg
    m = model([node("Relu", ["x"], ["y"], "r")], [("x", F, (2,))], [("y", F, (2,))],
              opset=MAX_OPSET)
    assert load_graph(m).opset == MAX_OPSET
    custom = helper.make_node("FusedGemm", ["x"], ["y"], domain="com.microsoft", name="fg")
    m = model([custom], [("x", F, (2,))], [("y", F, (2,))])
    m.opset_import.append(helper.make_opsetid("com.microsoft", 3))
    refused(m, "node 'fg' (com.microsoft.FusedGemm)", "'com.microsoft' (opset 3)",
            f"opsets up to {MAX_OPSET}", error=UnsupportedOpError)


# -- run-time indices ---------------------------------------------------------------------

def _gather_model():
    """y0 = x[idx] (int64 indices of shape [2, 3]), y1 = x[:, j] (an int32 scalar), y2 =
    x[idx + 1] (indices computed in the model: a buffer of the workspace)."""
    nodes = [node("Gather", ["x", "idx"], ["y0"], "gather_rows", axis=0),
             node("Gather", ["x", "j"], ["y1"], "gather_col", axis=1),
             node("Add", ["idx", "one"], ["idx1"], "plus_one"),
             node("Gather", ["x", "idx1"], ["y2"], "gather_next", axis=-2)]
    return model(nodes, [("x", F, (3, 4)), ("idx", I64, (2, 3)), ("j", I32, ())],
                 [("y0", F, None), ("y1", F, None), ("y2", F, None)],
                 {"one": np.array(1, np.int64)})


@pytest.fixture(scope="module")
def gather_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("gather") / "build"
    m = _gather_model()
    compiled = polyc.compile_onnx(m, options=OPTIONS, name="gm", output_dir=str(out))
    return m, compiled, out


X = np.arange(12, dtype=np.float32).reshape(3, 4)
GOOD = np.array([[0, -1, 1], [-3, 1, -2]], np.int64)  # y2 reads GOOD + 1: in [-2, 2]


def test_negative_indices_match_onnxruntime(gather_build):
    m, compiled, _ = gather_build
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for j in (-4, -1, 0, 3):
        feed = {"x": X, "idx": GOOD, "j": np.array(j, np.int32)}
        for got, want in zip(compiled.run(None, feed), session.run(None, feed)):
            np.testing.assert_array_equal(got, want)
    consts = model([node("Gather", ["x", "i"], ["y"], "g", axis=1)], [("x", F, (3, 4))],
                   [("y", F, None)], {"i": np.array([[-1, 0], [-4, 2]], np.int64)})
    feed = {"x": X}
    want = ort.InferenceSession(consts.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feed)
    np.testing.assert_array_equal(polyc.compile_onnx(consts, options=OPTIONS).run(None, feed)[0],
                                  want[0])


def test_index_out_of_range_raises_run_error(gather_build):
    _, compiled, _ = gather_build
    bad = GOOD.copy()
    bad[1, 2] = 1000
    with pytest.raises(RunError) as e:
        compiled.run(None, {"x": X, "idx": bad, "j": np.array(0, np.int32)})
    assert isinstance(e.value, CallError) and e.value.status == 4
    msg = str(e.value)
    for w in ("node 'gather_rows' (Gather)", "index 1000 at [1, 2]", "'idx' [2, 3]",
              "axis 0 of 'x' [3, 4]", "valid: -3 to 2"):
        assert w in msg, (w, msg)
    with pytest.raises(RunError, match=r"'gather_col' \(Gather\): index -5 at \[\] .*axis 1 "
                                       r"of 'x' \[3, 4\] \(valid: -4 to 3\)"):
        compiled(X, GOOD, np.array(-5, np.int32))
    edge = GOOD.copy()
    edge[0, 0] = 2  # valid for gather_rows, but 2 + 1 = 3 is not for gather_next
    with pytest.raises(RunError, match=r"'gather_next' \(Gather\): index 3 at \[0, 0\] of "
                                       r"the indices 'idx1'"):
        compiled(X, edge, np.array(0, np.int32))
    # the model still runs after a failed run
    feed = {"x": X, "idx": GOOD, "j": np.array(1, np.int32)}
    np.testing.assert_array_equal(compiled.run(["y1"], feed)[0], X[:, 1])


MAIN_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gm.h"

int main(int argc, char **argv)
{
  float x[gm_INPUT0_SIZE], y0[gm_OUTPUT0_SIZE], y1[gm_OUTPUT1_SIZE], y2[gm_OUTPUT2_SIZE];
  int64_t idx[gm_INPUT1_SIZE] = {0, -1, 1, -3, 1, -2};
  int32_t j = 3;
  for (int i = 0; i < gm_INPUT0_SIZE; i++)
    x[i] = (float)i;
  gm_model *m = argc == 2 ? gm_init(argv[1]) : NULL;
  if (!m)
    return 10;
  int status = gm_run(m, x, idx, &j, y0, y1, y2);
  printf("good %d [%s]\n", status, gm_last_error());
  idx[4] = 1000;
  status = gm_run(m, x, idx, &j, y0, y1, y2);
  printf("bad %d [%s]\n", status, gm_last_error());
  void *ws = aligned_alloc(64, gm_workspace_size() ? gm_workspace_size() : 64);
  idx[4] = 1;
  j = -5;
  status = gm_run_with_workspace(m, ws, x, idx, &j, y0, y1, y2);
  printf("workspace %d [%s]\n", status, gm_last_error());
  status = gm_run(m, NULL, idx, &j, y0, y1, y2);
  printf("null %d [%s]\n", status, gm_last_error());
  free(ws);
  gm_free(m);
  return 0;
}
"""


def test_index_out_of_range_from_c(gather_build, tmp_path):
    _, compiled, out = gather_build
    header = (out / "gm.h").read_text()
    assert "const char *gm_last_error(void);" in header
    assert "4 when an" in header and "gm_last_error() returns" in header
    (tmp_path / "main.c").write_text(MAIN_C)
    exe = str(tmp_path / "main")
    cc = subprocess.run(["gcc", "-std=c11", *WARNINGS_AS_ERRORS, "-I", str(out),
                         str(tmp_path / "main.c"), str(out / "gm.so"), f"-Wl,-rpath,{out}",
                         "-o", exe], capture_output=True, text=True, check=False)
    assert cc.returncode == 0, cc.stderr
    run = subprocess.run([exe, compiled.weights_path], capture_output=True, text=True,
                         check=False, timeout=60)
    assert run.returncode == 0, (run.returncode, run.stdout, run.stderr)
    lines = run.stdout.splitlines()
    assert lines[0] == "good 0 []", lines
    assert lines[1].startswith("bad 4 [node 'gather_rows' (Gather): index 1000 at [1, 1] "
                               "of the indices 'idx' [2, 3] is out of range"), lines
    assert lines[2].startswith("workspace 4 [node 'gather_col' (Gather): index -5 at []"), \
        lines
    assert lines[3].startswith("null 1 [gm_run: an argument is NULL"), lines


def test_indices_computed_in_the_same_kernel_are_checked_after_it():
    """Where the indices are computed by the Gather's own kernel (a fusion group that
    holds their producer), they become a buffer of the step and the check follows it."""
    from polyc.frontend.onnx_lower import lower_graph
    nodes = [node("Add", ["idx", "one"], ["idx1"], "plus_one"),
             node("Gather", ["x", "idx1"], ["y"], "gather_fused", axis=1)]
    m = model(nodes, [("x", F, (3, 4)), ("idx", I64, (5,))], [("y", F, None)],
              {"one": np.array(1, np.int64)})
    graph = load_graph(m)
    program = lower_graph(graph, groups=[list(graph.nodes)])
    (check,) = program.checks
    assert (check.buffer, check.step, check.after_step) == ("idx1", 0, True)
    compiled = polyc.build_model(program, OPTIONS)
    idx = np.array([-5, -1, 0, 1, 2], np.int64)
    np.testing.assert_array_equal(compiled(X, idx)[0], X[:, [0, 0, 1, 2, 3]])
    idx[4] = 3
    with pytest.raises(RunError, match=r"'gather_fused' \(Gather\): index 4 at \[4\] of the "
                                       r"indices 'idx1' \[5\] .*valid: -4 to 3"):
        compiled(X, idx)


def test_gather_elements_and_nd_check_their_indices():
    m = model([node("GatherElements", ["x", "i"], ["y"], "ge", axis=1),
               node("GatherND", ["x", "k"], ["z"], "gnd")],
              [("x", F, (3, 3)), ("i", I64, (3, 2)), ("k", I64, (2, 2))],
              [("y", F, None), ("z", F, None)])
    compiled = polyc.compile_onnx(m, options=OPTIONS)
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    i = np.array([[0, -1], [2, 1], [-3, 0]], np.int64)
    k = np.array([[0, -1], [2, 1]], np.int64)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]) \
        .run(None, {"x": x, "i": i, "k": k})
    for got, w in zip(compiled.run(None, {"x": x, "i": i, "k": k}), want):
        np.testing.assert_array_equal(got, w)
    for bad_i, bad_k, who in ((np.where(i == 2, 3, i), k, "'ge' (GatherElements)"),
                              (i, np.where(k == 2, -4, k), "'gnd' (GatherND)")):
        with pytest.raises(RunError, match=re.escape(f"node {who}: index")):
            compiled.run(None, {"x": x, "i": bad_i, "k": bad_k})
    # run-time indices over addressed axes of different extents: refused by name
    uneven = model([node("GatherND", ["x", "k"], ["z"], "gnd")],
                   [("x", F, (3, 4)), ("k", I64, (2, 2))], [("z", F, None)])
    with pytest.raises(UnsupportedOpError, match="axes of different extents"):
        polyc.compile_onnx(uneven, options=OPTIONS)


def test_loss_targets_are_checked_except_the_ignore_index():
    m = model([node("NegativeLogLikelihoodLoss", ["x", "t"], ["y"], "nll", ignore_index=-1,
                    reduction="mean"),
               node("SoftmaxCrossEntropyLoss", ["x", "t"], ["z", "lp"], "sce",
                    ignore_index=-1, reduction="none")],
              [("x", F, (4, 5)), ("t", I64, (4,))],
              [("y", F, ()), ("z", F, (4,)), ("lp", F, (4, 5))])
    compiled = polyc.compile_onnx(m, options=OPTIONS)
    x = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    t = np.array([0, -1, 4, 2], np.int64)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]) \
        .run(None, {"x": x, "t": t})
    for got, w in zip(compiled.run(None, {"x": x, "t": t}), want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)
    with pytest.raises(RunError, match=re.escape("node 'nll' (NegativeLogLikelihoodLoss): "
                                                 "target 5 at [2]")):
        compiled.run(None, {"x": x, "t": np.array([0, -1, 5, 2], np.int64)})
