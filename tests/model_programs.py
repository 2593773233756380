"""Hand-built :class:`polyc.program.Program` s for the model code generator's tests, each
with a numpy reference ``ref(inputs) -> outputs``."""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from polyc.frontend import from_tc
from polyc.program import Buffer, Program, Step

CONV = """def conv(float(1,3,8,8) x, float(4,3,3,3) w) -> (float(1,4,6,6) y) {
    y(n,o,h,ww) +=! x(n,c,h+kh,ww+kw) * w(o,c,kh,kw)
}"""
RELU = """def relu(float(1,4,6,6) a) -> (float(1,4,6,6) b) {
    b(n,c,h,w) = fmax(a(n,c,h,w), 0.0)
}"""


def conv_relu(name: str = "tiny/net", seed: int = 0):
    """x -> Conv (weight w) -> temp t -> Relu -> y: two steps with a temporary."""
    w = np.random.default_rng(seed).standard_normal((4, 3, 3, 3)).astype(np.float32)
    prog = Program(
        name,
        (Buffer("x", "float32", (1, 3, 8, 8), "input"),
         Buffer("w", "float32", (4, 3, 3, 3), "weight"),
         Buffer("t", "float32", (1, 4, 6, 6), "temp"),
         Buffer("y", "float32", (1, 4, 6, 6), "output")),
        ("x",), ("y",), (("w", w),),
        (Step(from_tc(CONV), ("x", "w", "t"), ("Conv_0",)),
         Step(from_tc(RELU), ("t", "y"), ("Relu_1",))))

    def ref(x):
        win = sliding_window_view(x[0], (3, 3), axis=(1, 2))  # c, 6, 6, 3, 3
        return (np.maximum(np.einsum("chwij,ocij->ohw", win, w), 0)[None],)
    return prog, ref


MM = """def mm(float(2,6) a, float(6,3) b) -> (float(2,3) c) {
    c(i,j) +=! a(i,k) * b(k,j)
}"""
NEG = """def neg(float(3,2) a) -> (float(3,2) b) {
    b(i,j) = -a(i,j)
}"""


def aliases(seed: int = 1):
    """Views everywhere: ``t = x @ w`` is read through a view ``v`` (3,2) by the second
    step, and is itself the storage of output ``tv`` (a view); ``tv2`` is a second output
    with that storage, ``xo``/``wo`` are outputs that are views of the input/weight."""
    w = np.random.default_rng(seed).standard_normal((6, 3)).astype(np.float32)
    f = "float32"
    prog = Program(
        "aliases",
        (Buffer("x", f, (2, 6), "input"), Buffer("w", f, (6, 3), "weight"),
         Buffer("t", f, (2, 3), "temp"), Buffer("v", f, (3, 2), "temp"),
         Buffer("u", f, (3, 2), "output"), Buffer("tv", f, (6,), "output"),
         Buffer("tv2", f, (2, 3), "output"), Buffer("xo", f, (12,), "output"),
         Buffer("wo", f, (18,), "output")),
        ("x",), ("u", "tv", "tv2", "xo", "wo"), (("w", w),),
        (Step(from_tc(MM), ("x", "w", "t")), Step(from_tc(NEG), ("v", "u"))),
        (("v", "t"), ("tv", "t"), ("tv2", "tv"), ("xo", "x"), ("wo", "w")))

    def ref(x):
        t = x @ w
        return (-t.reshape(3, 2), t.reshape(6), t, x.reshape(12), w.reshape(18))
    return prog, ref


def chain():
    """Temporaries that die early (the arena reuses their bytes) and a kernel that writes
    half of its output, which lands on reused (dirty) arena bytes: it must be zeroed
    before its step."""
    f = "float32"
    k = [from_tc(s) for s in (
        "def a(float(16,16) x) -> (float(16,16) y) { y(i,j) = x(i,j) * 2.0 + 3.0 }",
        "def b(float(16,16) x) -> (float(16,16) y) { y(i,j) = x(i,j) + 1.0 }",
        "def c(float(16,16) x) -> (float(16,16) y) { y(i,j) = x(i,j) * x(i,j) }",
        "def d(float(16,16) x) -> (float(16) y) { y(i) +=! x(i,j) where i in 0:8 }",
        "def e(float(16) x) -> (float(16) y) { y(i) = x(i) * 0.5 }")]
    prog = Program(
        "chain",
        (Buffer("x", f, (16, 16), "input"), Buffer("t1", f, (16, 16)),
         Buffer("t2", f, (16, 16)), Buffer("t3", f, (16, 16)), Buffer("r", f, (16,)),
         Buffer("y", f, (16,), "output")),
        ("x",), ("y",), (),
        (Step(k[0], ("x", "t1")), Step(k[1], ("t1", "t2")), Step(k[2], ("t2", "t3")),
         Step(k[3], ("t3", "r")), Step(k[4], ("r", "y"))))

    def ref(x):
        r = ((2 * x + 4) ** 2).sum(axis=1)
        r[8:] = 0
        return (0.5 * r,)
    return prog, ref


def repeated(n: int = 3):
    """``n`` steps whose kernels differ only in names: one C function serves them all."""
    f = "float32"
    steps, bufs = [], [Buffer("x", f, (8, 8), "input")]
    for i in range(n):
        src = f"def layer{i}(float(8,8) in{i}) -> (float(8,8) out{i}) " \
              f"{{ out{i}(a,b) = in{i}(a,b) * 0.5 + 1.0 }}"
        dst = "y" if i == n - 1 else f"t{i}"
        bufs.append(Buffer(dst, f, (8, 8), "output" if i == n - 1 else "temp"))
        steps.append(Step(from_tc(src), ("x" if i == 0 else f"t{i - 1}", dst)))
    prog = Program("repeated", tuple(bufs), ("x",), ("y",), (), tuple(steps))

    def ref(x):
        for _ in range(n):
            x = x * 0.5 + 1.0
        return (x,)
    return prog, ref


def odd_names():
    """Model, input and output names that are not C identifiers, mixed dtypes."""
    k = from_tc("def k(float(2,3) a, int64(2,3) b) -> (double(2,3) c, int64(2) s) {\n"
                "    c(i,j) = double(a(i,j)) + double(b(i,j))\n"
                "    s(i) +=! b(i,j)\n}")
    prog = Program(
        "gpu_0/data_0",
        (Buffer("gpu_0/data_0", "float32", (2, 3), "input"),
         Buffer("int:idx", "int64", (2, 3), "input"),
         Buffer("out/sum", "float64", (2, 3), "output"),
         Buffer("2count", "int64", (2,), "output")),
        ("gpu_0/data_0", "int:idx"), ("out/sum", "2count"), (),
        (Step(k, ("gpu_0/data_0", "int:idx", "out/sum", "2count")),))

    def ref(a, b):
        return (a.astype(np.float64) + b, b.sum(axis=1))
    return prog, ref
