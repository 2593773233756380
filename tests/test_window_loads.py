"""Vector loops that read one row of an array at several offsets along the loop (the
taps of a stencil, ``A(i,j-1) + A(i,j) + A(i,j+1)``) load each vector of that row once
and shift it (``codegen.c_family._Walker._window_loop``): two-vector shuffles of the
window where the plain loop loads every tap across a cache line.

Checked: against numpy and bit for bit against the plain loop (the switch off: the
same operations in the same order on every lane) at sizes around the vector widths and
below them, on every scheduler option; offsets 0..16 apart (a shuffle, the vector one
ahead) and further (a load each, no window); float64; symbolic sizes; the forms it
leaves to the plain loop; the fused jacobi-2d sweeps of the PolyBench benchmark; the C
under AddressSanitizer (every load among the elements the plain loop reads) and
``-Wall -Wextra -Werror``; the CUDA target, which has no such form."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import polyc
from polyc.codegen import c_family
from polyc.codegen.toolchain import asan_runtime, sanitizer_environment

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(TESTS), "examples", "benchmarks"))

import polybench_kernels as pk  # noqa: E402

#: (TC, numpy reference, sizes of A) -- every one reads a row of A at two or more
#: offsets; B's shape follows from range inference
CASES = {
    "taps3": ("def f({t}(N) A) -> (B) {{ B(i) = 0.25 * A(i) + 0.5 * A(i+1) + 0.25 * A(i+2) }}",
              lambda a: 0.25 * a[:-2] + 0.5 * a[1:-1] + 0.25 * a[2:]),
    "gap4": ("def f({t}(N) A) -> (B) {{ B(i) = A(i) - A(i+4) }}",
             lambda a: a[:-4] - a[4:]),
    "gap16": ("def f({t}(N) A) -> (B) {{ B(i) = A(i+16) * 2.0 + A(i) }}",
              lambda a: a[16:] * 2.0 + a[:-16]),
    "jacobi5": ("def f({t}(M,N) A) -> (B) {{ B(i,j) = 0.2 * (A(i+1,j+1) + A(i+1,j) "
                "+ A(i+1,j+2) + A(i+2,j+1) + A(i,j+1)) }}",
                lambda a: 0.2 * (a[1:-1, 1:-1] + a[1:-1, :-2] + a[1:-1, 2:] + a[2:, 1:-1]
                                 + a[:-2, 1:-1])),
    "box9": ("def f({t}(M,N) A) -> (B) {{ B(i,j) = (A(i,j) + A(i,j+1) + A(i,j+2) "
             "+ A(i+1,j) + A(i+1,j+1) + A(i+1,j+2) + A(i+2,j) + A(i+2,j+1) + A(i+2,j+2)) / 9.0 }}",
             lambda a: sum(a[di:a.shape[0] - 2 + di, dj:a.shape[1] - 2 + dj]
                           for di in range(3) for dj in range(3)) / 9.0),
    "mixed": ("def f({t}(M,N) A, {t}(M) w) -> (B) {{ B(i,j) = -A(i,j+1) + w(i) * "
              "(A(i,j+2) - A(i,j)) / 3.0 }}",
              lambda a, w: -a[:, 1:-1] + w[:, None] * (a[:, 2:] - a[:, :-2]) / 3.0),
}
TYPES = {"float": np.float32, "double": np.float64}


def _inputs(case: str, shape: tuple[int, ...], t, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(t)
    return [a, rng.standard_normal(shape[0]).astype(t)] if case == "mixed" else [a]


def _windowed(op, inputs) -> bool:
    from polyc.pipeline import bind_sizes, check_inputs
    sizes = bind_sizes(op.kernel, check_inputs(op.kernel, inputs), None)
    return "memcpy(&polyc_n0, " in op.compiled_for(sizes).c_source


def _shapes(case: str) -> list[tuple[int, ...]]:
    if case in ("jacobi5", "box9", "mixed"):
        return [(37, 131), (5, 18), (3, 19), (4, 3), (66, 34)]
    return [(1003,), (35,), (19,), (18,), (17,), (5,)]


OPTIONS = {
    "default": {},
    "pluto": dict(scheduler="pluto"),
    "fusion-min": dict(fusion="min"),
    "no-tiles": dict(tile=False),
    "tiles-8": dict(tile=(8, 8)),
    "two-threads": dict(threads=2),
    "serial": dict(parallel=False),
    # the 256-bit form (the #elif for AVX2), where the CPU has AVX-512
    "avx2": dict(cflags=("-mno-avx512f",)),
}


@pytest.mark.parametrize("opts", sorted(OPTIONS))
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", ["float", "double"])
def test_windows_match_numpy_and_the_plain_loop(dtype, case, opts, monkeypatch):
    src, ref = CASES[case]
    t = TYPES[dtype]
    options = {"threads": 1, **OPTIONS[opts]}
    op = polyc.define(src.format(t=dtype), **options)
    results = []
    for k, shape in enumerate(_shapes(case)):
        if case == "gap16" and shape[0] <= 16:
            continue
        inputs = _inputs(case, shape, t, k)
        got = op(*inputs)
        tol = 1e-5 if t == np.float32 else 1e-12
        np.testing.assert_allclose(got, ref(*[x.astype(np.float64) for x in inputs]),
                                   rtol=tol, atol=tol)
        results.append((inputs, got))
    # (pluto skews some of these nests so that no loop is a vector loop; float64
    # offsets 16 apart are two vectors apart at 512 bits, a load each)
    assert _windowed(op, results[0][0]) or opts == "pluto" \
        or (case, dtype) == ("gap16", "double"), "the big size runs the window"
    monkeypatch.setattr(c_family, "WINDOW_LOADS", False)
    plain = polyc.define(src.format(t=dtype), **options)
    for inputs, got in results:
        np.testing.assert_array_equal(got, plain(*inputs))
    assert not _windowed(plain, results[0][0])


@pytest.mark.parametrize("case", ["jacobi5", "box9", "mixed"])
def test_windows_with_symbolic_sizes(case):
    src, ref = CASES[case]
    op = polyc.define(src.format(t="float"), specialize=False)
    for k, shape in enumerate(_shapes(case)):
        inputs = _inputs(case, shape, np.float32, k)
        np.testing.assert_allclose(op(*inputs), ref(*[x.astype(np.float64) for x in inputs]),
                                   rtol=1e-5, atol=1e-5)
    assert _windowed(op, _inputs(case, _shapes(case)[0], np.float32))


@pytest.mark.parametrize("src,why", [
    ("def f(float(N) A) -> (B) { B(i) = A(i) + A(i+40) }", "offsets a vector apart and more"),
    ("def f(float(N) A) -> (B) { B(i) = exp(A(i)) + A(i+1) }", "a call"),
    ("def f(float(N) A) -> (B) { B(i) = A(i) > 0.0 ? A(i+1) : A(i) }", "a select"),
    ("def f(float(N,M) A) -> (B) { B(i,j) = A(i,j) + A(i+1,j) }", "no row read twice"),
    ("def f(int32(N) A) -> (B) { B(i) = A(i) + A(i+1) }", "integers"),
    ("def f(float(N) A) -> (B) { B(i) +=! A(i) * A(i+1) }", "a reduction statement"),
])
def test_forms_left_to_the_plain_loop(src, why):
    """What the window loop does not take runs as before, and right."""
    op = polyc.define(src)
    shape = (40, 50) if "N,M" in src else (70,)
    rng = np.random.default_rng(3)
    a = (rng.integers(-50, 50, shape).astype(np.int32) if "int32" in src
         else rng.standard_normal(shape).astype(np.float32))
    got = op(a)
    if "A(i+40)" in src:
        want = a[:-40] + a[40:]
    elif "exp" in src:
        want = np.exp(a[:-1]) + a[1:]
    elif "?" in src:
        want = np.where(a[:-1] > 0, a[1:], a[:-1])
    elif "N,M" in src:
        want = a[:-1] + a[1:]
    elif "int32" in src:
        want = a[:-1] + a[1:]
    else:
        want = a[:-1] * a[1:]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not _windowed(op, [a]), why


def test_arrays_named_like_the_window_locals():
    """User arrays named as the window loop's locals (``polyc_v0``, ``polyc_at``) are
    other C names (sanitized): a read of one and a write to one stay theirs."""
    op = polyc.define("def f(float(M,N) A, float(M) polyc_v0) -> (B) { B(i,j) = -A(i,j+1) "
                      "+ polyc_v0(i) * (A(i,j+2) - A(i,j)) / 3.0 }", threads=1)
    a, w = _inputs("mixed", (37, 131), np.float32)
    np.testing.assert_allclose(op(a, w), CASES["mixed"][1](a.astype(np.float64),
                                                           w.astype(np.float64)),
                               rtol=1e-5, atol=1e-5)
    assert _windowed(op, [a, w])
    op = polyc.define("def f(float(N) polyc_at) -> (polyc_v0) { polyc_v0(i) = polyc_at(i) "
                      "+ polyc_at(i+1) }", threads=1)
    x = np.random.default_rng(4).standard_normal(1001).astype(np.float32)
    np.testing.assert_allclose(op(x), x[:-1] + x[1:], rtol=1e-6, atol=1e-6)
    assert _windowed(op, [x])


def _random_stencil(rng: np.random.Generator) -> tuple[str, int]:
    """A TC def of a random 2-D stencil: 2 to 7 taps of A on up to 3 rows at column
    offsets 0..19 (so some 16 or more apart), joined by + - * with literals, maybe
    a unary minus and a division; and its largest column offset."""
    taps = [(int(rng.integers(0, 3)), int(rng.integers(0, 20)))
            for _ in range(int(rng.integers(2, 8)))]
    if len({t[0] for t in taps}) == len(taps):  # at least one row read twice
        taps.append((taps[0][0], (taps[0][1] + int(rng.integers(1, 17))) % 20))
    terms = []
    for di, dj in taps:
        term = f"A(i+{di},j+{dj})"
        if rng.random() < 0.3:
            term = f"{rng.choice(['0.5', '1.5', '2.0', '0.25'])} * {term}"
        if rng.random() < 0.15:
            term = f"-{term}"
        terms.append(term)
    value = terms[0]
    for t in terms[1:]:
        value = f"({value} {rng.choice(['+', '-', '*', '+'])} {t})"
    if rng.random() < 0.3:
        value = f"{value} / 3.0"
    return "def f(float(M,N) A) -> (B) { B(i,j) = " + value + " }", max(dj for _, dj in taps)


@pytest.mark.parametrize("seed", range(12))
def test_random_stencils_bit_for_bit(seed, monkeypatch):
    """Random stencils (:func:`_random_stencil`) at random sizes, the windows against
    the plain loop bit for bit (same operations in the same order on each lane)."""
    rng = np.random.default_rng(1000 + seed)
    src, reach = _random_stencil(rng)
    shapes = [(int(rng.integers(3, 12)), int(rng.integers(reach + 1, reach + 90)))
              for _ in range(3)]
    data = [np.random.default_rng(k).uniform(-2, 2, s).astype(np.float32)
            for k, s in enumerate(shapes)]
    op = polyc.define(src, threads=1)
    got = [op(a) for a in data]
    monkeypatch.setattr(c_family, "WINDOW_LOADS", False)
    plain = polyc.define(src, threads=1)
    for a, g in zip(data, got):
        np.testing.assert_array_equal(g, plain(a), err_msg=src)


def test_vectorize_off_has_no_windows():
    src, ref = CASES["jacobi5"]
    op = polyc.define(src.format(t="float"), vectorize=False)
    a = _inputs("jacobi5", (37, 131), np.float32)
    np.testing.assert_allclose(op(*a), ref(a[0].astype(np.float64)), rtol=1e-5, atol=1e-5)
    assert not _windowed(op, a)


@pytest.mark.parametrize("points", [5, 9])
def test_fused_jacobi_sweeps(points, monkeypatch):
    """The PolyBench benchmark's jacobi-2d (four steps, fused into one sweep) takes the
    window in every stencil loop, and gives the plain loops' values bit for bit."""
    bench = pk.as_float32(pk.JACOBI if points == 5 else pk.JACOBI9)
    inputs = [np.ascontiguousarray(x) for x in bench.inputs(dict(N=75), np.random.default_rng(5))]
    op = polyc.define(bench.tc, threads=1)
    got = op(*inputs)
    for g, w in zip(got, bench.numpy(*inputs)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    from polyc.pipeline import bind_sizes, check_inputs
    source = op.compiled_for(bind_sizes(op.kernel, check_inputs(op.kernel, inputs), None)).c_source
    assert source.count("__builtin_shuffle(polyc_c0, polyc_n0") >= 8
    monkeypatch.setattr(c_family, "WINDOW_LOADS", False)
    plain = polyc.define(bench.tc, threads=1)(*inputs)
    for g, p in zip(got, plain):
        np.testing.assert_array_equal(g, p)


_CHILD = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np, polyc
from test_window_loads import CASES, TYPES, _inputs, _shapes, _windowed
for dt in ("float", "double"):
    for case in sorted(CASES):
        src, ref = CASES[case]
        for specialize, extra in ((True, ()), (False, ()), (True, ("-mno-avx512f",))):
            op = polyc.define(src.format(t=dt), threads=1, sanitize=True,
                              specialize=specialize,
                              cflags=("-Wall", "-Wextra", "-Werror") + extra)
            for k, shape in enumerate(_shapes(case)):
                if case == "gap16" and shape[0] <= 16:
                    continue
                x = _inputs(case, shape, TYPES[dt], k)
                assert np.allclose(op(*x), ref(*[v.astype(np.float64) for v in x]),
                                   rtol=1e-4, atol=1e-4), (dt, case, shape)
            print("ok", dt, case, specialize, *extra, _windowed(
                op, _inputs(case, _shapes(case)[0], TYPES[dt])), flush=True)
"""


@pytest.mark.skipif(asan_runtime() is None, reason="gcc has no libasan.so")
def test_warning_free_and_sanitized():
    """The window loops compile without warnings under -Wall -Wextra -Werror and run
    clean under AddressSanitizer and UBSan: the vector one ahead never reads past what
    the plain loop reads (the arrays here are exactly the size the taps need). The
    256-bit form as well (-mno-avx512f)."""
    done = subprocess.run([sys.executable, "-c", _CHILD.format(tests=TESTS)],
                          env=sanitizer_environment(), capture_output=True, text=True,
                          timeout=900, check=False, cwd=TESTS)
    report = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"
    assert done.returncode == 0, report
    for dt in ("float", "double"):
        for case in CASES:
            for specialize in (True, False):
                # (a one-dimensional loop of symbolic length is parallel and vector
                # at once: it keeps its plain form)
                windowed = (case, dt) != ("gap16", "double") and (
                    specialize or case not in ("taps3", "gap4", "gap16"))
                assert f"ok {dt} {case} {specialize} {windowed}" in done.stdout, report
            assert f"ok {dt} {case} True -mno-avx512f " in done.stdout, report


def test_cuda_target_has_no_windows():
    """The CUDA target keeps its thread mapping (its dialect has no window loads); the
    stencil is right there too (the CPU emulation)."""
    src, ref = CASES["jacobi5"]
    op = polyc.define(src.format(t="float"), target="cuda", emulate=True)
    a = _inputs("jacobi5", (37, 131), np.float32)
    np.testing.assert_allclose(op(*a), ref(a[0].astype(np.float64)), rtol=1e-5, atol=1e-5)
    assert "__builtin_shuffle" not in (op.cuda_source or "")
