"""Whole programs (hand-built :class:`polyc.program.Program` s, see ``model_programs``)
compiled into one C library: numerics against numpy, buffer planning, aliases, the
weights file, concurrency, the C API from a C program, ``ldd``, and ASan/UBSan."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading

import model_programs as P
import numpy as np
import pytest
from conftest import assert_matches_numpy, random_inputs

import polyc
from polyc.codegen.memplan import Interval, check_plan, lifetimes, plan_memory
from polyc.codegen.model import kernel_key, reads_initial_values
from polyc.codegen.weights import WeightsError
from polyc.frontend import from_tc

TESTS = os.path.dirname(os.path.abspath(__file__))
WARNINGS_AS_ERRORS = ("-Wall", "-Wextra", "-Werror")
OPTIONS = polyc.Options(cflags=WARNINGS_AS_ERRORS)


def inputs_of(prog, seed=0):
    return random_inputs([(prog.buffer(n).shape, prog.buffer(n).dtype) for n in prog.inputs],
                         seed)


@pytest.fixture(scope="module")
def conv_relu():
    prog, ref = P.conv_relu()
    return polyc.build_model(prog, OPTIONS), ref


@pytest.mark.parametrize("make", [P.conv_relu, P.aliases, P.chain, P.repeated, P.odd_names],
                         ids=lambda f: f.__name__)
def test_program_matches_numpy(make):
    prog, ref = make()
    m = polyc.build_model(prog, OPTIONS)
    for seed in (0, 1):
        xs = inputs_of(prog, seed)
        assert_matches_numpy(m(*xs), ref(*xs), rtol=1e-5, atol=1e-5)
        by_name = m.run(None, dict(zip(m.input_names, xs)))
        assert_matches_numpy(tuple(by_name), ref(*xs), rtol=1e-5, atol=1e-5)


def test_two_steps_with_a_temporary(conv_relu):
    m, _ = conv_relu
    assert m.name == "tiny_net"  # from the program name "tiny/net"
    assert m.arena_bytes == 4 * 6 * 6 * 4 and m.source.plan.offsets == {"t": 0}
    assert m.c_source.count("static int polyc_k") == 2
    assert "tiny_net_model *tiny_net_init(const char *weights_path);" in m.header
    for path in (m.library_path, m.header_path, m.weights_path, m.source_path):
        assert os.path.exists(path)


def test_aliases_share_storage_and_outputs_get_copies():
    prog, _ = P.aliases()
    m = polyc.build_model(prog, OPTIONS)
    storage = m.source.storage
    assert storage["t"] == ("output", 1)  # the temporary lives in output tv
    assert "v" not in storage and m.arena_bytes == 0  # a view is its root
    copies = [line for line in m.c_source.splitlines() if "shares storage" in line]
    assert [c.split("(")[1].split(",")[0] for c in copies] == ["tv2", "xo", "wo"]


def test_arena_reuse_and_zeroing_of_accumulated_outputs():
    prog, _ = P.chain()
    m = polyc.build_model(prog, OPTIONS)
    plan = m.source.plan
    assert plan.arena_bytes < plan.temp_bytes and plan.arena_bytes == plan.lower_bound
    assert not check_plan(plan)
    # r (a `+=` without init) lands on bytes t2 used before: zeroed first, and only it
    assert plan.offsets["r"] == plan.offsets["t2"]
    steps = m.c_source[m.c_source.index("static int polyc_steps"):]
    assert steps.count("memset(") == 1 and "memset(r, 0, 64u)" in steps


def test_identical_kernels_share_one_function():
    prog, _ = P.repeated(4)
    m = polyc.build_model(prog, OPTIONS)
    assert m.source.functions == 1 and m.c_source.count("= polyc_k0_layer0(") == 4
    keys = {kernel_key(s.kernel) for s in prog.steps}
    assert len(keys) == 1
    other = from_tc("def layer(float(8,8) a) -> (float(8,8) b) { b(i,j) = a(i,j) * 0.25 + 1.0 }")
    assert kernel_key(other) not in keys


@pytest.mark.parametrize("src, array, expected", [
    ("def k(float(4,5) x) -> (float(4) y) { y(i) +=! x(i,j) }", "y", False),
    ("def k(float(4,5) x) -> (float(4) y) {\n y(i) = 0.0 where i in 0:2\n y(i) += x(i,j)\n}",
     "y", True),
    ("def k(float(4,5) x) -> (float(4) y) { y(i) max=! x(i,j) }", "y", False),
    ("def k(float(4,5) x) -> (float(4,5) y) { y(i,j) = x(i,j) where i in 0:2, j in 0:5 }",
     "y", True),
    ("def k(float(4) x) -> (float(4) y) {\n y(i) = x(i) where i in 0:2\n"
     " y(i) = 1.0 where i in 2:4\n}", "y", False),
])
def test_reads_initial_values(src, array, expected):
    assert reads_initial_values(from_tc(src), array) is expected


def test_memory_planner():
    ivs = [Interval("a", 100, 0, 1), Interval("b", 64, 1, 2), Interval("c", 128, 2, 3),
           Interval("d", 64, 3, 4), Interval("e", 256, 5, 6)]
    plan = plan_memory(ivs)
    assert not check_plan(plan)
    assert plan.arena_bytes == 256 and plan.temp_bytes == 100 + 64 + 128 + 64 + 256
    assert all(off % 64 == 0 for off in plan.offsets.values())
    got = lifetimes([(0, "x"), (3, "x"), (1, "y"), (2, "z")], {"x": 10, "y": 64})
    assert sorted((i.name, i.size, i.first, i.last) for i in got) == [
        ("x", 64, 0, 3), ("y", 64, 1, 1)]
    rng = np.random.default_rng(0)
    for _ in range(20):
        many = []
        for i in range(30):
            first = int(rng.integers(0, 20))
            many.append(Interval(f"t{i}", int(rng.integers(1, 50)) * 64, first,
                                 first + int(rng.integers(0, 5))))
        plan = plan_memory(many)
        assert not check_plan(plan) and plan.lower_bound <= plan.arena_bytes <= plan.temp_bytes


def test_concurrent_runs_from_threads(conv_relu):
    m, ref = conv_relu
    xs = [inputs_of(m.program, seed)[0] for seed in range(4)]
    want = [m(x)[0] for x in xs]
    got: dict[int, list[np.ndarray]] = {}

    def work(i):
        got[i] = [m(xs[i])[0] for _ in range(50)]
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        assert all(np.array_equal(g, want[i]) for g in got[i])
        assert_matches_numpy(want[i], ref(xs[i])[0], rtol=1e-5, atol=1e-5)


def _corrupt(path, tmp_path, edit):
    data = bytearray(open(path, "rb").read())
    edit(data)
    out = tmp_path / "bad.weights"
    out.write_bytes(bytes(data))
    return str(out)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.__delitem__(slice(len(d) - 10, None)), "expected"),
    (lambda d: d.__delitem__(slice(20, None)), "truncated"),
    (lambda d: d.__setitem__(slice(0, 8), b"NOTPOLYC"), "not a polyc weights file"),
    (lambda d: d.__setitem__(16, d[16] ^ 1), "another model"),
    (lambda d: d.extend(b"\0" * 64), "expected"),
    (lambda d: d.__setitem__(len(d) - 100, d[len(d) - 100] ^ 0x40), "refused"),  # checksum (C)
])
def test_bad_weights_file_fails_cleanly(conv_relu, tmp_path, edit, message):
    from polyc.codegen.model_runtime import ModelLibrary
    m, _ = conv_relu
    bad = _corrupt(m.weights_path, tmp_path, edit)
    with pytest.raises(WeightsError, match=message):
        ModelLibrary(m.library_path, m.source, bad)
    init = ctypes.CDLL(m.library_path).tiny_net_init  # C checks everything on its own too
    init.restype, init.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    assert init(bad.encode()) is None
    with pytest.raises(WeightsError, match="cannot read"):
        ModelLibrary(m.library_path, m.source, str(tmp_path / "missing.weights"))


@pytest.mark.parametrize("feed, message", [
    ({"x": np.zeros((1, 3, 8, 8), np.float64)}, "expected dtype float32, got float64"),
    ({"x": np.zeros((1, 3, 8, 9), np.float32)}, r"expected shape \[1, 3, 8, 8\]"),
    ({}, r"missing input\(s\) \['x'\]"),
    ({"x": np.zeros((1, 3, 8, 8), np.float32), "z": 1}, r"unknown input\(s\) \['z'\]"),
    ({"x": [[1.0]]}, "expected a numpy array"),
])
def test_call_errors(conv_relu, feed, message):
    m, _ = conv_relu
    with pytest.raises(polyc.CallError, match=message):
        m.run(None, feed)


def test_output_names_and_positional_errors(conv_relu):
    m, _ = conv_relu
    x = np.ones((1, 3, 8, 8), np.float32)
    assert m.run(["y"], {"x": x})[0].shape == (1, 4, 6, 6)
    with pytest.raises(polyc.CallError, match="unknown output"):
        m.run(["nope"], {"x": x})
    with pytest.raises(polyc.CallError, match="takes 1 inputs"):
        m(x, x)


def test_library_needs_no_python(conv_relu):
    m, _ = conv_relu
    done = subprocess.run(["ldd", m.library_path], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"ldd failed: {done.stderr}")
    names = {line.split()[0] for line in done.stdout.splitlines() if line.strip()}
    assert not any("python" in n or "polyc" in n for n in names), done.stdout
    allowed = ("linux-vdso", "libc.so", "libm.so", "libgomp.so", "ld-linux", "/lib")
    assert all(n.startswith(allowed) for n in names), done.stdout


MAIN_C = r"""
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tiny_net.h"

int main(int argc, char **argv)
{
  float x[tiny_net_INPUT0_SIZE], y[tiny_net_OUTPUT0_SIZE], want[tiny_net_OUTPUT0_SIZE];
  const int64_t shape[] = tiny_net_OUTPUT0_SHAPE;
  FILE *f = fopen(argv[2], "rb");
  if (argc != 3 || !f || fread(x, sizeof x, 1, f) != 1 || fread(want, sizeof want, 1, f) != 1)
    return 10;
  fclose(f);
  if (tiny_net_init("/nonexistent.weights") != NULL || tiny_net_init(NULL) != NULL)
    return 11;
  tiny_net_model *m = tiny_net_init(argv[1]);
  if (!m)
    return 12;
  if (tiny_net_num_inputs() != 1 || strcmp(tiny_net_input_name(0), "x") != 0
      || tiny_net_output_rank(0) != 4 || tiny_net_output_shape(0)[3] != shape[3]
      || tiny_net_input_name(1) != NULL || tiny_net_workspace_size() != tiny_net_WORKSPACE_SIZE)
    return 13;
  if (tiny_net_run(m, x, y) != 0 || tiny_net_run(NULL, x, y) != 1)
    return 14;
  float err = 0.0f;
  for (int i = 0; i < tiny_net_OUTPUT0_SIZE; i++)
    err = fmaxf(err, fabsf(y[i] - want[i]));
  void *ws = aligned_alloc(64, tiny_net_workspace_size());
  memset(y, 0, sizeof y);
  if (tiny_net_run_with_workspace(m, ws, x, y) != 0)
    return 15;
  for (int i = 0; i < tiny_net_OUTPUT0_SIZE; i++)
    err = fmaxf(err, fabsf(y[i] - want[i]));
  free(ws);
  tiny_net_free(m);
  printf("max error %g\n", err);
  return err < 1e-4f ? 0 : 1;
}
"""


def test_c_program_against_the_header(tmp_path):
    prog, ref = P.conv_relu()
    out = tmp_path / "build"
    m = polyc.build_model(prog, OPTIONS, output_dir=str(out))
    assert {p.name for p in out.iterdir()} >= {"tiny_net.so", "tiny_net.h", "tiny_net.c",
                                               "tiny_net.weights"}
    x = inputs_of(prog, 3)[0]
    (tmp_path / "data.bin").write_bytes(x.tobytes() + ref(x)[0].astype(np.float32).tobytes())
    (tmp_path / "main.c").write_text(MAIN_C)
    exe = str(tmp_path / "main")
    build = subprocess.run(["gcc", "-std=c11", *WARNINGS_AS_ERRORS, "-I", str(out),
                            str(tmp_path / "main.c"), "-o", exe, str(out / "tiny_net.so"),
                            f"-Wl,-rpath,{out}", "-lm"],
                           capture_output=True, text=True, check=False)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([exe, m.weights_path, str(tmp_path / "data.bin")],
                         capture_output=True, text=True, check=False, timeout=60)
    assert run.returncode == 0, (run.returncode, run.stdout, run.stderr)
    assert "max error" in run.stdout


_SANITIZED_CHILD = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np
import polyc
import model_programs as P
from conftest import assert_matches_numpy, random_inputs
for make in (P.conv_relu, P.aliases, P.chain, P.odd_names):
    prog, ref = make()
    m = polyc.build_model(prog, polyc.Options(sanitize=True, cflags={cflags!r}))
    assert b"__asan_" in open(m.library_path, "rb").read(), "not instrumented"
    for seed in (0, 1):
        xs = random_inputs([(prog.buffer(n).shape, prog.buffer(n).dtype)
                            for n in prog.inputs], seed)
        assert_matches_numpy(m(*xs), ref(*xs), rtol=1e-5, atol=1e-5)
    m.close()
    print("ok", make.__name__, flush=True)

from onnx.reference import ReferenceEvaluator
from test_backend import conv_relu_model
model = conv_relu_model()
m = polyc.compile_onnx(model, options=polyc.Options(sanitize=True, cflags={cflags!r}))
x = random_inputs([((1, 3, 8, 8), "float32")], 5)[0]
assert_matches_numpy(m(x), tuple(ReferenceEvaluator(model).run(None, {{"x": x}})),
                     rtol=1e-5, atol=1e-5)
print("ok onnx conv_relu", flush=True)
"""


def _asan_runtime():
    out = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True,
                         check=False)
    path = out.stdout.strip()
    return path if out.returncode == 0 and os.path.isabs(path) else None


@pytest.mark.skipif(_asan_runtime() is None, reason="gcc has no libasan.so")
def test_sanitized_model_runs_clean():
    env = dict(os.environ, LD_PRELOAD=_asan_runtime(),
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    script = _SANITIZED_CHILD.format(tests=TESTS, cflags=WARNINGS_AS_ERRORS)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    report = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"
    assert done.returncode == 0, report
    assert done.stdout.count("ok ") == 5, report



def _matmul_model(m, k, n):
    from onnx import TensorProto, helper
    io = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "mm",
                          [io("a", [m, k]), io("b", [k, n])], [io("y", [m, n])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("shape,serial", [((32, 64, 48), True), ((96, 128, 80), False)])
def test_small_steps_run_on_one_thread(monkeypatch, shape, serial):
    """A step with fewer reductions than ``polyc.model.SERIAL_REDUCTIONS`` (and few other
    instances) has no parallel loop at 2 threads; with the threshold at 0 it has one.
    Both match numpy."""
    import polyc.model as PM
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape[:2]).astype(np.float32)
    b = rng.standard_normal(shape[1:]).astype(np.float32)
    model = _matmul_model(*shape)
    two = polyc.Options(threads=2)
    for threshold in (PM.SERIAL_REDUCTIONS, 0):
        monkeypatch.setattr(PM, "SERIAL_REDUCTIONS", threshold)
        m = polyc.compile_onnx(model, options=two)
        parallel = "omp parallel for num_threads(2)" in m.c_source
        assert parallel == (threshold == 0 or not serial)
        np.testing.assert_allclose(m(a, b)[0], a @ b, rtol=1e-4, atol=1e-4)
