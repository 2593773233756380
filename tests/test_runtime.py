"""Calling compiled kernels: argument checks, size binding, the toolchain and its cache.

The sanitizer test runs Python in a subprocess with ``LD_PRELOAD`` set to gcc's
``libasan.so`` (a library built with ``-fsanitize=address`` can only be loaded into a
process whose first library is the ASan runtime) and ``ASAN_OPTIONS=detect_leaks=0``
(CPython itself leaks by design at exit).
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from polyc.codegen.toolchain import asan_runtime
from codegen_helpers import (
    WARNINGS_AS_ERRORS,
    I,
    fused_matmul_schedule,
    kernel,
    matmul,
    read,
    sequence_schedule,
    statement,
)
from polyc.codegen import (
    bind_sizes,
    build_shared,
    compile_kernel,
    generate_c,
    output_shapes,
)

from polyc import expr as E
from polyc import ir
from polyc.errors import CallError, ToolchainError
from polyc.options import Options

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def options(tmp_path):
    return Options(cache_dir=str(tmp_path), cflags=WARNINGS_AS_ERRORS)


@pytest.fixture
def mm(options):
    knl = matmul()
    return compile_kernel(knl, fused_matmul_schedule(knl), options)


def f32(*shape):
    return np.ones(shape, np.float32)


@pytest.mark.parametrize("args, message", [
    ([f32(3, 4)], r"takes 2 inputs \(A, B\), got 1"),
    ([f32(3, 4), f32(4, 5).astype(np.float64)],
     r"input 'B' \(argument 1\): expected dtype float32, got float64"),
    ([f32(3, 4), f32(4)], r"input 'B' \(argument 1\): expected rank 2, got shape \(4,\)"),
    ([f32(3, 4), [[1.0]]], r"input 'B' \(argument 1\): expected a numpy array of float32, got list"),
    ([f32(3, 4), f32(5, 2)], r"size K is 4 from dimension 1 of 'A' but 5 from dimension 0 of 'B'"),
    ([f32(0, 4), f32(4, 2)], r"array 'A': dimension 0 \(M\) is 0"),
    (f32(3, 4), r"inputs must be a sequence"),
])
def test_call_errors(mm, args, message):
    with pytest.raises(CallError, match=message):
        mm(args)


def test_given_outputs_are_updated_in_place(mm):
    a, b = np.ones((3, 4), np.float32), np.ones((4, 5), np.float32)
    c = np.full((3, 5), 7.0, np.float32)
    (out,) = mm([a, b], outputs=[c])
    assert out is c and (c == 4).all()  # the init statement overwrote it
    with pytest.raises(CallError, match=r"output 'C': expected a float32\[3, 5\] array"):
        mm([a, b], outputs=[np.zeros((5, 3), np.float32)])
    with pytest.raises(CallError, match="must be C-contiguous"):
        mm([a, b], outputs=[np.zeros((5, 3), np.float32).T])
    buf = np.zeros(20, np.float32)
    with pytest.raises(CallError, match="may overlap"):
        mm([a, buf.reshape(4, 5)], outputs=[buf[5:].reshape(3, 5)])


def test_noncontiguous_inputs_are_copied(mm):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    b = np.arange(12, dtype=np.float32).reshape(3, 4).T.copy().T  # Fortran order
    np.testing.assert_allclose(mm([a, b])[0], a @ b)


def shifted_sum() -> ir.Kernel:
    """Y[i] = X[i] + X[i+1] + T[i, 0]; X has the composite extent N + 1, and K appears
    only in the temporary T[N, K] (T[i, k] = 1)."""
    sizes = ("N", "K")
    N, K = E.Size("N"), E.Size("K")
    arrays = [ir.Array("X", "float32", (E.Binary("+", N, E.Const(1)),)),
              ir.Array("Y", "float32", (N,), "output"), ir.Array("T", "float32", (N, K), "temp")]
    x1 = read("X", E.Binary("+", I, E.Const(1)))
    return kernel("shifted", sizes, arrays, [
        statement("S0", sizes, ("i", "k"), (N, K), ("T", (I, E.Index("k"))), "=", E.Const(1)),
        statement("S1", sizes, ("i",), (N,), ("Y", (I,)), "=",
                  E.Binary("+", E.Binary("+", read("X", I), x1), read("T", I, E.Const(0))))])


def test_bind_sizes_and_output_shapes():
    knl = shifted_sum()
    x = np.zeros(6, np.float32)
    with pytest.raises(CallError, match=r"cannot infer size\(s\) N, K .* sizes=\{'N': ..., 'K'"):
        bind_sizes(knl, [x])
    assert bind_sizes(knl, [x], {"N": 5, "K": 2}) == {"N": 5, "K": 2}
    with pytest.raises(CallError, match=r"dimension 0 must be \(N \+ 1\) = 5 with N=4, K=2, got 6"):
        bind_sizes(knl, [x], {"N": 4, "K": 2})
    assert output_shapes(knl, {"N": 5, "K": 2}) == [(5,)]
    mm = matmul()
    assert bind_sizes(mm, [f32(3, 4), f32(4, 5)]) == {"M": 3, "K": 4, "N": 5}
    with pytest.raises(CallError, match="no size 'Q'"):
        bind_sizes(mm, [f32(3, 4), f32(4, 5)], {"Q": 1})


def test_temporary_allocation_failure(options, monkeypatch):
    knl = shifted_sum()
    fn = compile_kernel(knl, sequence_schedule(knl), options)
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_allclose(fn([x], sizes={"N": 7, "K": 3})[0], x[:-1] + x[1:] + 1)
    with pytest.raises(CallError, match="has 2017612633061982208 elements; the limit is"):
        fn([x], sizes={"N": 7, "K": 2**58})   # refused in Python: over polyc.limits
    # within the limits polyc checks, the C allocation itself fails (30 TiB): status 2
    monkeypatch.setenv("POLYC_MAX_ARRAY_BYTES", str(2**62))
    with pytest.raises(MemoryError, match="cannot allocate"):
        fn([x], sizes={"N": 7, "K": 2**40})


def test_context_violation_reported_by_c(options):
    """A context stricter than "extents >= 1" is checked in C only (return code 1)."""
    sizes = ("N",)
    N = E.Size("N")
    st = statement("S", sizes, ("i",), (N,), ("Y", (I,)), "=", read("X", I))
    knl = kernel("even", sizes, [ir.Array("X", "int64", (N,)), ir.Array("Y", "int64", (N,), "output")],
                 [st], context="[N] -> { : N >= 2 and N mod 2 = 0 }")
    fn = compile_kernel(knl, sequence_schedule(knl), options)
    assert (fn([np.arange(4)])[0] == np.arange(4)).all()
    with pytest.raises(CallError, match=r"sizes N=3 do not satisfy"):
        fn([np.arange(3)])


def test_toolchain_error_carries_command_and_stderr(options):
    src = generate_c(matmul(), fused_matmul_schedule(matmul()), options)
    bad = options.replace(cflags=("-fno-such-flag-polyc",))
    with pytest.raises(ToolchainError) as info:
        build_shared(src, bad)
    err = info.value
    assert "-fno-such-flag-polyc" in err.command and err.command[0] == "gcc"
    assert "no-such-flag-polyc" in err.stderr and err.returncode != 0
    with open(err.source_path) as kept:
        assert kept.read() == src.text
    assert not [f for f in os.listdir(options.cache_dir) if f.endswith((".so", ".tmp"))]
    with pytest.raises(ToolchainError, match="cannot run the C compiler"):
        build_shared(src, options.replace(cc="/nonexistent/cc"))


def test_build_cache(options):
    src = generate_c(matmul(), fused_matmul_schedule(matmul()), options)
    path = build_shared(src, options)
    stamp = os.stat(path).st_mtime_ns
    assert build_shared(src, options) == path and os.stat(path).st_mtime_ns == stamp
    assert build_shared(src, options.replace(cflags=("-O2",))) != path
    assert build_shared(src.text + "\n", options) != path


_CONCURRENT = """
import sys
sys.path.insert(0, {tests!r})
from codegen_helpers import matmul, fused_matmul_schedule
from polyc.codegen import build_shared, generate_c
from polyc.options import Options
knl = matmul()
print(build_shared(generate_c(knl, fused_matmul_schedule(knl)), Options(cache_dir={cache!r})))
"""


def test_concurrent_builds_of_one_source(tmp_path):
    script = _CONCURRENT.format(tests=TESTS, cache=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    paths = {out.strip() for out, _ in results}
    assert len(paths) == 1 and os.path.exists(paths.pop())
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


_SANITIZED = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np
from codegen_helpers import matmul, fused_matmul_schedule, sequence_schedule
from test_runtime import shifted_sum, out_of_bounds
from polyc.codegen import compile_kernel
from polyc.options import Options
opts = Options(cache_dir={cache!r}, sanitize=True)
knl = matmul()
fn = compile_kernel(knl, fused_matmul_schedule(knl), opts)
a, b = np.random.rand(7, 37).astype(np.float32), np.random.rand(37, 1).astype(np.float32)
assert np.allclose(fn([a, b])[0], a @ b, rtol=1e-5)
knl = shifted_sum()
x = np.arange(8, dtype=np.float32)
assert np.allclose(compile_kernel(knl, sequence_schedule(knl), opts)([x], sizes={{"N": 7, "K": 3}})[0],
                   x[:-1] + x[1:] + 1)
print("clean")
if {bad}:
    knl = out_of_bounds()
    compile_kernel(knl, sequence_schedule(knl), opts)([x])
"""


def out_of_bounds() -> ir.Kernel:
    """A wrong kernel: Y[i+1] = X[i] writes one element past Y."""
    sizes = ("N",)
    N = E.Size("N")
    st = statement("S", sizes, ("i",), (N,), ("Y", (E.Binary("+", I, E.Const(1)),)), "=",
                   read("X", I))
    return kernel("oob", sizes, [ir.Array("X", "float32", (N,)),
                                 ir.Array("Y", "float32", (N,), "output")], [st])


@pytest.mark.skipif(asan_runtime() is None, reason="gcc has no libasan.so")
def test_sanitizers(tmp_path):
    env = dict(os.environ, LD_PRELOAD=asan_runtime(), ASAN_OPTIONS="detect_leaks=0")
    for bad in (False, True):
        script = _SANITIZED.format(tests=TESTS, cache=str(tmp_path), bad=bad)
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=300, check=False)
        assert "clean" in done.stdout, done.stderr[-3000:]
        if bad:  # the sanitizer does catch errors in this setup
            assert done.returncode != 0 and "heap-buffer-overflow" in done.stderr
        else:
            assert done.returncode == 0, done.stderr[-3000:]


def test_repeated_calls_keep_their_checks():
    """A call like an earlier one (the same shapes and dtypes) skips the checks it passed
    and takes the sizes found then (runtime.call_signature); what differs is checked
    again: another dtype or rank is refused, a strided view of the same shape is made
    contiguous, and new data gives new results."""
    import polyc
    from polyc.errors import CallError
    mm = polyc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
    rng = np.random.default_rng(2)
    for _ in range(3):
        a = rng.standard_normal((7, 5), dtype=np.float32)
        b = rng.standard_normal((5, 9), dtype=np.float32)
        np.testing.assert_allclose(mm(a, b), a @ b, rtol=1e-5, atol=1e-5)
    bt = rng.standard_normal((9, 5), dtype=np.float32).T  # (5, 9), not contiguous
    np.testing.assert_allclose(mm(a, bt), a @ bt, rtol=1e-5, atol=1e-5)
    with pytest.raises(CallError, match="dtype"):
        mm(a, b.astype(np.float64))
    with pytest.raises(CallError, match="dimension|size"):
        mm(a, rng.standard_normal((6, 9), dtype=np.float32))
    with pytest.raises(CallError, match="rank"):
        mm(a, b[None])
    np.testing.assert_allclose(mm(b.T.copy(), a.T.copy()), b.T @ a.T, rtol=1e-5, atol=1e-5)
    fn = mm.compiled_for({"M": 7, "K": 5, "N": 9}).function
    assert len(fn._plans) == 1  # one signature of good calls


def test_outputs_start_at_zero_unless_every_element_is_written_first():
    """A call allocates an output uninitialised only where the kernel writes each of its
    elements with ``=`` before reading it (``initial_values.reads_initial_values``): a
    matmul's ``+=!``; an output written on a part of its box starts at zero, also when
    the call's memory is what a previous output left."""
    import polyc
    full = polyc.define("def f(float(N) X) -> (Y) { Y(i) = X(i) + 1.0 }")
    part = polyc.define("def p(float(N) X) -> (Y) { Y(i) = X(i) where i in 1:N }")
    summed = polyc.define("def s(float(N,M) X) -> (Y) { Y(i) +=! X(i,j) }")
    x = np.full(4099, 7.0, dtype=np.float32)
    for _ in range(5):  # freed outputs of nonzero values come back to the next call
        np.testing.assert_array_equal(full(x), x + 1)
        y = part(x)
        assert y[0] == 0 and (y[1:] == 7).all()
        np.testing.assert_array_equal(summed(x.reshape(4099, 1)), x)
    fresh = {op.kernel.name: op.compiled_for({"N": 4099, "M": 1}).function._fresh[0]
             for op in (full, part, summed)}
    assert fresh == {"f": np.empty, "p": np.zeros, "s": np.empty}
