"""Kernel temporaries are zeroed only when a statement may read an element before
any statement writes it (codegen/initial_values.py, shared with the model's output
zeroing): the analysis, the generated allocation, and results against numpy on odd
sizes, called repeatedly so that a wrongly skipped zeroing would read the garbage a
previous call left in reused memory."""
from __future__ import annotations

import numpy as np
import pytest
from onnx_node_harness import check_node, rand

import polyc
from polyc.codegen.initial_values import reads_before_writing, reads_initial_values
from polyc.frontend import from_tc

FULL = """
def k(float(M,N) X) -> (Y) {
    T(i,j) = X(i,j) * 2.0
    Y(i) +=! T(i,j)
}"""
ACCUMULATED = """
def k(float(M,N) X) -> (Y) {
    T(i) += X(i,j)
    Y(i) = T(i) + 1.0
}"""
INIT = """
def k(float(M,N) X) -> (Y) {
    T(i) max=! X(i,j)
    Y(i,j) = X(i,j) - T(i)
}"""
# jacobi-like: the interior written by one statement, the border by another; all read
STENCIL = """
def k(float(N,N) X) -> (Y) {
    T(i,j) = X(i,j) where i in 0:N, j in N-1:N
    T(i,j) = X(i,j) where i in 0:N, j in 0:1
    T(i,j) = 0.5 * (X(i,j-1) + X(i,j+1)) where i in 0:N, j in 1:N-1
    Y(i,j) = T(i,j) + T(i,j) where i in 0:N, j in 0:N
}"""
# the border column never written, the stencil reads it: zeroed
PARTIAL = """
def k(float(N,N) X) -> (Y) {
    T(i,j) = X(i,j) where i in 0:N, j in 1:N
    Y(i,j) = T(i,j) + X(i,j) where i in 0:N, j in 0:N
}"""
# written only after it is read (the read comes first in program order)
READ_FIRST = """
def k(float(N) X) -> (Y) {
    Y(i) = T(i) + X(i) where i in 0:N
    T(i) = X(i) where i in 0:N
}"""


@pytest.mark.parametrize("src, zeroed", [
    (FULL, False), (ACCUMULATED, True), (INIT, False), (STENCIL, False), (PARTIAL, True),
])
def test_analysis(src, zeroed):
    kernel = from_tc(src)
    temp, = (a.name for a in kernel.temporaries)
    assert reads_before_writing(kernel, temp) is zeroed


def test_unwritten_elements_matter_only_for_outputs():
    # an output left partly unwritten must be zeroed; a temporary never read there not
    src = """
def k(float(N) X) -> (Y, Z) {
    T(i) = X(i) where i in 1:N
    Y(i) = X(i) where i in 1:N
    Z(i) = T(i) where i in 1:N
}"""
    kernel = from_tc(src)
    assert [a.name for a in kernel.temporaries] == ["T"]
    assert not reads_before_writing(kernel, "T")
    assert reads_initial_values(kernel, "Y") and not reads_before_writing(kernel, "Y")


def test_read_before_the_write_in_program_order():
    with pytest.raises(polyc.CompileError):
        from_tc(READ_FIRST)  # TC refuses a read of a tensor not yet written


def _ref(name, X):
    if name == "FULL":
        return (2 * X).sum(axis=1)
    if name == "ACCUMULATED":
        return X.sum(axis=1) + 1
    if name == "INIT":
        return X - X.max(axis=1, keepdims=True)
    if name == "STENCIL":
        T = X.copy()
        T[:, 1:-1] = 0.5 * (X[:, :-2] + X[:, 2:])
        return 2 * T
    if name == "PARTIAL":
        T = X.copy()
        T[:, 0] = 0
        return T + X
    raise KeyError(name)


@pytest.mark.parametrize("name", ["FULL", "ACCUMULATED", "INIT", "STENCIL", "PARTIAL"])
def test_results_and_allocation(name):
    src = globals()[name]
    op = polyc.define(src)
    zeroed = reads_before_writing(from_tc(src), from_tc(src).temporaries[0].name)
    rng = np.random.default_rng(1)
    for shape in [(7, 7), (13, 13), (7, 7), (31, 31), (13, 13)]:
        for _ in range(3):  # repeated calls: freed memory is reused
            X = rng.standard_normal(shape).astype(np.float32)
            np.testing.assert_allclose(op(X), _ref(name, X), rtol=1e-5, atol=1e-5)
    body = op.c_source[op.c_source.rindex("int k("):]
    assert "polyc_scratch(" in body  # the thread's scratch block, kept between calls
    assert ("memset(" in body) is zeroed


def test_padded_conv_copy_is_not_zeroed():
    """The zero-padded input copy of a Conv writes every element (the padding included)."""
    from onnx_node_harness import graph_of, lower_node, make_model

    from polyc.api import Operator
    x, w = rand(1, 3, 9, 7), rand(4, 3, 3, 3)
    check_node("Conv", dict(x=x, w=w), pads=[1, 1, 1, 1], strides=[2, 1])
    src, *_ = lower_node(graph_of(make_model("Conv", dict(x=x, w=w), ["y"],
                                             pads=[1, 1, 1, 1], strides=[2, 1]), {}))
    kernel = from_tc(src, allow_indirect=True)
    assert kernel.temporaries
    for t in kernel.temporaries:
        assert not reads_before_writing(kernel, t.name)
    op = Operator(kernel)
    op(x, w)
    body = op.c_source[op.c_source.rindex("int g("):]
    assert "polyc_scratch(" in body and "memset(" not in body


def test_model_zeroing_uses_the_same_analysis():
    from polyc.codegen import model
    assert model.reads_initial_values is reads_initial_values


_KEYS_EXHAUSTED = r"""
import ctypes, sys
import numpy as np
import polyc
libc = ctypes.CDLL(None)
key = ctypes.c_uint()
taken = 0
while libc.pthread_key_create(ctypes.byref(key), None) == 0:  # what ~1000 libraries take
    taken += 1
assert taken > 100, taken
f = polyc.define(sys.argv[1])
x = np.arange(12, dtype=np.float32).reshape(3, 4)
np.testing.assert_allclose(f(x), x.sum(axis=1) + 1.0)
print("ok", taken)
"""


def test_scratch_works_when_the_process_has_no_pthread_key_left():
    """Every polyc library takes a pthread key for its scratch block; a process that
    loaded about a thousand of them (a fuzzing campaign did) has none left. The block
    is thread-local, so the kernel still runs (fuzz seed 5319: "cannot allocate")."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", _KEYS_EXHAUSTED, ACCUMULATED],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-3000:]


def test_big_scratch_blocks_take_huge_page_boundaries():
    """A scratch block of 4 MiB or more comes from ``polyc_alloc``'s huge-page path
    (2 MiB aligned, advised MADV_HUGEPAGE): results stay right when the block grows
    past the threshold, shrinks back and grows again."""
    op = polyc.define(FULL)
    rng = np.random.default_rng(2)
    for shape in [(9, 11), (1100, 1001), (9, 11), (1201, 1100)]:  # T: 4.4 and 5.3 MB
        X = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(op(X), _ref("FULL", X), rtol=1e-4, atol=1e-3)
    assert "polyc_alloc(" in op.c_source


_ALLOC_MAIN = r"""
int main(void)
{
  const size_t sizes[] = {1, 100, (size_t)4 << 20, ((size_t)5 << 20) + 3, 64};
  for (int i = 0; i < 5; i++) {
    unsigned char *p = polyc_alloc(sizes[i]);
    if (!p || (uintptr_t)p % 64 != 0)
      return 1 + i;
#ifdef POLYC_HUGE_PAGE
    if (sizes[i] >= ((size_t)4 << 20) && (uintptr_t)p % POLYC_HUGE_PAGE != 0)
      return 10 + i;
#endif
    memset(p, i, sizes[i]);
    free(p);
  }
  return 0;
}
"""


def test_polyc_alloc_alignment_under_the_sanitizers(tmp_path):
    """``polyc_alloc`` alone, under AddressSanitizer and UBSan (aligned_alloc wants a
    size that is a multiple of the alignment: both paths round up)."""
    import shutil
    import subprocess

    from polyc.codegen.c_expr import PRELUDE
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    src = tmp_path / "alloc.c"
    src.write_text(PRELUDE + _ALLOC_MAIN)
    exe = tmp_path / "alloc"
    subprocess.run(["gcc", "-std=c11", "-O1", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", str(src), "-o", str(exe), "-lm",
                    "-lpthread"], check=True, capture_output=True, timeout=120)
    done = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120,
                          env={"ASAN_OPTIONS": "detect_leaks=1:allocator_may_return_null=0"})
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
