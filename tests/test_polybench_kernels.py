"""The PolyBench kernels of examples/benchmarks/polybench_kernels.py (TC sources and
their naive C loop nests) against numpy at tiny odd sizes, so that the benchmark's
kernels stay correct."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples", "benchmarks"))
from polybench_kernels import BENCHES, as_float32, jacobi_tc  # noqa: E402

import polyc  # noqa: E402


def _inputs(b, seed=0):
    return [np.ascontiguousarray(x) for x in b.inputs(b.tiny, np.random.default_rng(seed))]


@pytest.mark.parametrize("b", BENCHES, ids=[b.name for b in BENCHES])
def test_tc_kernel_matches_numpy(b):
    assert all(v % 2 == 1 for v in b.tiny.values()), "tiny sizes are odd"
    inputs = _inputs(b)
    want = b.numpy(*inputs)
    for threads in (1, 2):
        got = polyc.define(b.tc, threads=threads)(*inputs)
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("b", BENCHES, ids=[b.name for b in BENCHES])
def test_naive_c_matches_numpy(b, tmp_path):
    from bench_polybench import build_naive
    inputs = _inputs(b, seed=1)
    want = b.numpy(*inputs)
    dll = build_naive(b, b.tiny, str(tmp_path))
    bufs = [inputs[i] if kind == "in" else inputs[i].copy() if kind == "copy"
            else np.zeros_like(want[i]) for kind, i in b.c_bind]
    before = [x.copy() for x in inputs]
    import ctypes
    dll.kernel((ctypes.c_void_p * len(bufs))(*[a.ctypes.data for a in bufs]))
    for k, w in zip(b.c_outs, want):
        np.testing.assert_allclose(bufs[k], w, rtol=1e-10, atol=1e-12)
    for x, y in zip(inputs, before):  # "in" arrays are read only
        np.testing.assert_array_equal(x, y)


def test_triangular_domain_is_the_triangle():
    """syrk's ``exists A(i - j, k)`` makes the update's domain the triangle j <= i (no
    guard, no wasted iterations)."""
    import islpy as isl
    syrk = next(b for b in BENCHES if b.name == "syrk")
    update = polyc.define(syrk.tc).kernel.statements[-1].domain
    fixed = update.intersect_params(isl.Set("[N, M] -> { : N = 7 and M = 5 }"))
    assert not update.is_box()
    assert fixed.count_val().to_python() == 7 * 8 // 2 * 5


@pytest.mark.parametrize("name", ["syrk", "syr2k"])
def test_triangle_tiles_go_to_the_threads_in_turn(name):
    """The row tiles of syrk's triangle carry unequal work: at 2 threads they go to the
    threads in turn (``schedule(static, 1)``), at 1 thread there is no clause, and a
    square matmul keeps OpenMP's static schedule; exact against numpy at sizes no
    multiple of a tile."""
    b = next(x for x in BENCHES if x.name == name)
    rng = np.random.default_rng(5)
    sizes = {"N": 301, "M": 97}
    inputs = [np.ascontiguousarray(x) for x in b.inputs(sizes, rng)]
    want = b.numpy(*inputs)
    for threads in (1, 2):
        op = polyc.define(b.tc, threads=threads)
        got = op(*inputs)
        got = got if isinstance(got, tuple) else (got,)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
        cyclic = "schedule(static, 1)" in op.compiled_for(sizes).c_source
        assert cyclic == (threads == 2)
    mm = polyc.define("def mm(double(M,K) A, double(K,N) B) -> (C) "
                      "{ C(m,n) +=! A(m,k) * B(k,n) }", threads=2)
    a = rng.standard_normal((301, 97))
    np.testing.assert_allclose(mm(a, a.T), a @ a.T, rtol=1e-10)
    assert "schedule(static, 1)" not in mm.compiled_for({"M": 301, "K": 97, "N": 301}).c_source


@pytest.mark.parametrize("name", ["syrk", "syr2k", "covariance"])
@pytest.mark.parametrize("scheduler", ["isl", "pluto"])
def test_triangle_register_tiles_its_full_tiles(name, scheduler, monkeypatch):
    """A triangle's register tiles that the diagonal crosses hold no box of the output:
    the full tiles are register tiled, the others in tiles of one row
    (``register_tile.apply_full_tiles``), exact against numpy at sizes no multiple of a
    tile, at 1 and 2 threads. With an L2 of 64 KB the arrays are "large" and the
    producers of the product's operands (the packing, the scaling) would fuse with it
    along its sum, one register tile per step of the sum: the product stays apart
    (``fuse._along_reuse``), and the scaling of ``A`` keeps to its rows."""
    import re

    from polyc.schedule import machine
    monkeypatch.setenv("POLYC_L2_BYTES", "65536")
    machine.l2_bytes.cache_clear()
    try:
        b = next(x for x in BENCHES if x.name == name)
        sizes = {"N": 301, "M": 97} if name != "covariance" else {"N": 97, "M": 301}
        inputs = [np.ascontiguousarray(x) for x in b.inputs(sizes, np.random.default_rng(6))]
        want = b.numpy(*inputs)
        for threads in (1, 2):
            op = polyc.define(b.tc, threads=threads, scheduler=scheduler)
            got = op(*inputs)
            got = got if isinstance(got, tuple) else (got,)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
            src = op.compiled_for({k: v for k, v in sizes.items()}).c_source
            tiled = re.findall(r"polyc_acc\[\d+\]\[\d+\] __attr", src)
            rows = re.findall(r"polyc_acc\[\d+\] __attr", src)  # the partial tiles' rows
            assert tiled and rows, (threads, tiled, rows)
            # the sum runs inside the register tile: a loop around the unrolled rows'
            # vector loops (fused along the sum, the tile held one step of it)
            at = src.index("polyc_acc[")
            tile = src[at:src.index("polyc_acc[i - polyc_lo0]", at)]
            assert len(re.findall(r"for \(\w+ c\d+ = ", tile)) >= 2, threads
            # the scaling of A (syrk's C_rowf) writes along its rows: its loop over k is
            # innermost, not fused outermost with the packing (``fuse._writes_down_columns``)
            for m in re.finditer(r"const \w+ k = (c\d+);\n\s*\w+_rowf\[", src):
                loops = re.findall(r"for \(\w+ (c\d+) = ", src[:m.start()])
                assert loops[-1] == m.group(1), (threads, loops[-3:], m.group(1))
    finally:
        monkeypatch.delenv("POLYC_L2_BYTES")
        machine.l2_bytes.cache_clear()


@pytest.mark.parametrize("name", ["syrk", "syr2k", "covariance", "atax", "bicg", "mvt"])
def test_triangles_and_matrix_vector_kernels_on_cuda_emulated(name):
    """The kernels whose C paths changed for triangles (register tiles of their full
    tiles) and for fused sums (copies per thread) on the CUDA target, emulated on the
    CPU, at odd sizes: against numpy."""
    b = next(x for x in BENCHES if x.name == name)
    sizes = {"syrk": {"N": 61, "M": 37}, "syr2k": {"N": 61, "M": 37},
             "covariance": {"N": 37, "M": 61}, "atax": {"M": 53, "N": 67},
             "bicg": {"M": 53, "N": 67}, "mvt": {"N": 67}}[name]
    inputs = [np.ascontiguousarray(x) for x in b.inputs(sizes, np.random.default_rng(7))]
    got = polyc.define(b.tc, target="cuda", emulate=True)(*inputs)
    for g, w in zip(got if isinstance(got, tuple) else (got,), b.numpy(*inputs)):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)


def test_jacobi_steps_unrolled():
    src = jacobi_tc(3)
    assert src.count("0.2 *") == 6 and "-> (A, B)" in src


@pytest.mark.parametrize("b", BENCHES, ids=[b.name for b in BENCHES])
def test_float32_kernels_match_numpy(b, tmp_path):
    """``bench_polybench.py --dtype float32``: the TC and the naive C in single
    precision against numpy's double result rounded to float32."""
    from bench_polybench import build_naive
    import ctypes
    b32 = as_float32(b)
    inputs = _inputs(b32)
    assert all(x.dtype == np.float32 for x in inputs)
    want = b32.numpy(*inputs)
    got = polyc.define(b32.tc, threads=2)(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    dll = build_naive(b32, b32.tiny, str(tmp_path))
    assert "double" not in open(tmp_path / f"{b.name}.c").read()
    bufs = [inputs[i] if kind == "in" else inputs[i].copy() if kind == "copy"
            else np.zeros_like(want[i]) for kind, i in b32.c_bind]
    dll.kernel((ctypes.c_void_p * len(bufs))(*[a.ctypes.data for a in bufs]))
    for k, w in zip(b32.c_outs, want):
        np.testing.assert_allclose(bufs[k], w, rtol=1e-5, atol=1e-5)
