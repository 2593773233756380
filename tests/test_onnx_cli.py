"""``polyc compile model.onnx``: a small ONNX model with a symbolic batch size, built
with onnx.helper, compiled from the command line (``--shape``), then linked into a C
program whose result is compared with onnx's reference evaluator."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

BATCH = 2


def small_net(path):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("W", (4, 3, 3, 3)), ("B", (4,)), ("W2", (5, 4)))]
    nodes = [helper.make_node("Conv", ["data/0", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "W2"], ["prob:0"], transB=1)]
    graph = helper.make_graph(
        nodes, "small net",
        [helper.make_tensor_value_info("data/0", TensorProto.FLOAT, ["N", 3, 6, 6])],
        [helper.make_tensor_value_info("prob:0", TensorProto.FLOAT, ["N", 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return model


def polyc(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "polyc", *args], capture_output=True,
                          text=True, timeout=300, check=False, cwd=cwd)


def clean_failure(done):
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    assert "polyc: error" in done.stderr, done.stderr


MAIN_C = r"""
#include <stdio.h>
#include "small_net.h"

int main(int argc, char **argv)
{
  float x[small_net_INPUT0_SIZE], y[small_net_OUTPUT0_SIZE];
  FILE *f = fopen(argv[2], "rb");
  if (argc != 4 || !f || fread(x, sizeof x, 1, f) != 1)
    return 10;
  fclose(f);
  small_net_model *m = small_net_init(argv[1]);
  if (!m)
    return 11;
  int status = small_net_run(m, x, y);
  small_net_free(m);
  if (status != 0 || !(f = fopen(argv[3], "wb")) || fwrite(y, sizeof y, 1, f) != 1)
    return 12;
  fclose(f);
  return 0;
}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    model = small_net(str(tmp / "small_net.onnx"))
    done = polyc("compile", str(tmp / "small_net.onnx"), "-o", str(tmp / "build"),
                 "--shape", f"data/0={BATCH},3,6,6")
    return tmp, model, done


def test_compile_writes_the_library_header_source_and_weights(built):
    tmp, _, done = built
    assert done.returncode == 0, done.stderr
    files = {p.name for p in (tmp / "build").iterdir()}
    assert {"small_net.so", "small_net.h", "small_net.c", "small_net.weights"} <= files
    assert "wrote" in done.stdout and "small_net.weights" in done.stdout
    for stage in ("loaded", "lowering", "scheduled", "built"):  # progress on stderr
        assert stage in done.stderr, done.stderr
    header = (tmp / "build" / "small_net.h").read_text()
    assert f"#define small_net_INPUT0_SHAPE {{{BATCH}, 3, 6, 6}}" in header
    assert '#define small_net_OUTPUT0_NAME "prob:0"' in header
    assert "int small_net_run(const small_net_model *model, const float *data_0, " \
           "float *prob_0);" in header


def test_c_program_matches_the_reference(built):
    tmp, model, done = built
    assert done.returncode == 0, done.stderr
    out = tmp / "build"
    (tmp / "main.c").write_text(MAIN_C)
    exe = str(tmp / "main")
    cc = subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", "-I", str(out),
                         str(tmp / "main.c"), str(out / "small_net.so"), f"-Wl,-rpath,{out}",
                         "-o", exe], capture_output=True, text=True, check=False)
    assert cc.returncode == 0, cc.stderr
    x = np.random.default_rng(1).standard_normal((BATCH, 3, 6, 6)).astype(np.float32)
    (tmp / "x.bin").write_bytes(x.tobytes())
    run = subprocess.run([exe, str(out / "small_net.weights"), str(tmp / "x.bin"),
                          str(tmp / "y.bin")], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run
    got = np.frombuffer((tmp / "y.bin").read_bytes(), np.float32).reshape(BATCH, 5)
    (want,) = ReferenceEvaluator(model).run(None, {"data/0": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_emit_header_and_quiet(built):
    tmp, _, _ = built
    done = polyc("compile", str(tmp / "small_net.onnx"), "--emit", "header", "-q",
                 "--shape", "data/0=1,3,6,6")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "#define small_net_INPUT0_SHAPE {1, 3, 6, 6}" in done.stdout


@pytest.mark.parametrize("args", [
    [],                                    # symbolic batch size, no --shape
    ["--shape", "data/0=2,3,x,6"],
    ["--shape", "data/0"],
    ["--shape", "data/0=0,3,6,6"],
    ["--shape", "data/0=2,3,6,6", "--emit", "schedule"],
])
def test_usage_errors_are_clean(built, args):
    tmp, _, _ = built
    clean_failure(polyc("compile", str(tmp / "small_net.onnx"), "-o", str(tmp / "x"), *args))


def test_truncated_model_file_is_a_clean_error(built, tmp_path):
    tmp, _, _ = built
    data = (tmp / "small_net.onnx").read_bytes()
    (tmp_path / "cut.onnx").write_bytes(data[:len(data) // 2])
    clean_failure(polyc("compile", str(tmp_path / "cut.onnx"), "-o", str(tmp_path / "b")))
    clean_failure(polyc("compile", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "b")))
    assert not os.path.exists(tmp_path / "b" / "cut.so")
