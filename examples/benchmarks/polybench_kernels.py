"""PolyBench/C 4.2 kernels (and a 9-point jacobi-2d) written in the TC language, with
their naive C loop nests (PolyBench's reference loop order) and numpy references.

Used by ``bench_polybench.py`` (speed-up of polyc over the naive loop nest compiled with
``gcc -O3 -march=native``) and by ``tests/test_polybench_kernels.py`` (correctness at
tiny odd sizes).

All fifteen kernels are expressible, with these adaptations (``NOTES`` prints them):

* PolyBench updates arrays in place (``C *= beta; C += ...``); a TC function's outputs
  are distinct from its inputs, so an in/out array is an input ``C_in`` copied into the
  output ``C`` by a first statement (``C(i,j) = beta * C_in(i,j)``) and then updated
  with a non-initialising ``+=`` (no ``!``).
* Triangular loops (syrk, syr2k: ``j <= i``; covariance: ``j >= i``) cannot be written
  as ``where j in 0:i+1``: a TC range bound is a size expression, never a loop index
  ("range bound (i + 1) uses 'i', which is not a size"). A guard ``(j <= i) ? x : 0``
  would be legal but computes the whole square. What does express the triangle is an
  ``exists`` clause on an access whose index is the difference, ``exists A(i - j, k)``:
  range inference keeps the access in bounds, i.e. ``0 <= i - j < N``, so the iteration
  domain itself is the triangle and no work is wasted.
* The time loops of jacobi-2d (5 and 9 points) and heat-3d cannot be TC loops (a
  statement's domain has no time dimension over which a tensor is overwritten);
  ``TSTEPS`` steps are unrolled into ``2 * TSTEPS`` statements over fresh temporaries
  (the borders are copied once per array). Fine for a few steps; PolyBench's 500 steps
  would be 1000 statements.
* alpha and beta are the literals 1.5 and 1.2 (PolyBench's values), in both versions.
"""
from __future__ import annotations

from collections.abc import Callable
import re
from dataclasses import dataclass, field, replace

import numpy as np

ALPHA, BETA = 1.5, 1.2

NOTES = __doc__.split("with these adaptations (``NOTES`` prints them):")[1].strip()


@dataclass
class Bench:
    name: str
    tc: str                                   #: TC source, one def
    sizes: dict[str, int]                     #: PolyBench LARGE (jacobi: fewer steps)
    inputs: Callable[[dict[str, int], np.random.Generator], list[np.ndarray]]
    numpy: Callable[..., tuple[np.ndarray, ...]]  #: inputs -> outputs (as the TC returns)
    c_body: str                               #: C statements of kernel_<name>
    c_params: list[str]                       #: C parameter declarations, in order
    #: for each C parameter: ("in", i) input i itself (read only); ("copy", i) a copy of
    #: input i made before each run (PolyBench's in/out arrays); ("out", k) a buffer
    #: shaped as the numpy reference's output k
    c_bind: list[tuple[str, int]]
    #: the C parameters that hold the outputs (in the TC's output order)
    c_outs: list[int]
    flops: Callable[[dict[str, int]], float] = lambda s: 0.0
    tiny: dict[str, int] = field(default_factory=dict)  #: odd sizes for the test
    sizes_in_tc: tuple[str, ...] = ()  #: sizes no array determines (none here)
    #: the C element type ("double"; "float": :func:`as_float32`)
    ctype: str = "double"


def as_float32(b: Bench) -> Bench:
    """``b`` in single precision: float arrays in the TC and the C (its constants
    ``1.5f``, so gcc computes in float as well), float32 inputs, and the numpy
    reference computed in double from them and rounded to float32."""
    literal = re.compile(r"(?<![\w.])(\d+\.\d+)(?![\w.])")
    return replace(
        b, tc=b.tc.replace("double(", "float("),
        c_body=literal.sub(r"\1f", b.c_body.replace("double", "float")),
        c_params=[p.replace("double ", "float ", 1) for p in b.c_params],
        inputs=lambda s, r, f=b.inputs: [x.astype(np.float32) for x in f(s, r)],
        numpy=lambda *xs, f=b.numpy: tuple(
            o.astype(np.float32) for o in f(*[x.astype(np.float64) for x in xs])),
        ctype="float")


def _rand(rng, *shape):
    return rng.random(shape)


def _tril(n):
    return np.tril(np.ones((n, n), dtype=bool))


# -- BLAS-like -----------------------------------------------------------------------------

GEMM = Bench(
    "gemm",
    """
def gemm(double(NI,NJ) C_in, double(NI,NK) A, double(NK,NJ) B) -> (C) {
    C(i,j) = 1.2 * C_in(i,j)
    C(i,j) += 1.5 * A(i,k) * B(k,j)
}""",
    dict(NI=1000, NJ=1100, NK=1200),
    lambda s, r: [_rand(r, s["NI"], s["NJ"]), _rand(r, s["NI"], s["NK"]),
                  _rand(r, s["NK"], s["NJ"])],
    lambda C, A, B: (BETA * C + ALPHA * A @ B,),
    """
  for (int i = 0; i < NI; i++) {
    for (int j = 0; j < NJ; j++)
      C[i][j] *= BETA;
    for (int k = 0; k < NK; k++)
      for (int j = 0; j < NJ; j++)
        C[i][j] += ALPHA * A[i][k] * B[k][j];
  }""",
    ["double C[NI][NJ]", "double A[NI][NK]", "double B[NK][NJ]"],
    [("copy", 0), ("in", 1), ("in", 2)], [0],
    lambda s: 2.0 * s["NI"] * s["NJ"] * s["NK"],
    dict(NI=7, NJ=9, NK=5))

MM2 = Bench(
    "2mm",
    """
def mm2(double(NI,NK) A, double(NK,NJ) B, double(NJ,NL) C, double(NI,NL) D_in) -> (D) {
    tmp(i,j) +=! 1.5 * A(i,k) * B(k,j)
    D(i,l) = 1.2 * D_in(i,l)
    D(i,l) += tmp(i,j) * C(j,l)
}""",
    dict(NI=800, NJ=900, NK=1100, NL=1200),
    lambda s, r: [_rand(r, s["NI"], s["NK"]), _rand(r, s["NK"], s["NJ"]),
                  _rand(r, s["NJ"], s["NL"]), _rand(r, s["NI"], s["NL"])],
    lambda A, B, C, D: (BETA * D + (ALPHA * A @ B) @ C,),
    """
  static double tmp[NI][NJ];
  for (int i = 0; i < NI; i++)
    for (int j = 0; j < NJ; j++) {
      tmp[i][j] = 0.0;
      for (int k = 0; k < NK; ++k)
        tmp[i][j] += ALPHA * A[i][k] * B[k][j];
    }
  for (int i = 0; i < NI; i++)
    for (int j = 0; j < NL; j++) {
      D[i][j] *= BETA;
      for (int k = 0; k < NJ; ++k)
        D[i][j] += tmp[i][k] * C[k][j];
    }""",
    ["double A[NI][NK]", "double B[NK][NJ]", "double C[NJ][NL]", "double D[NI][NL]"],
    [("in", 0), ("in", 1), ("in", 2), ("copy", 3)], [3],
    lambda s: 2.0 * s["NI"] * s["NJ"] * (s["NK"] + s["NL"]),
    dict(NI=5, NJ=7, NK=9, NL=3))

MM3 = Bench(
    "3mm",
    """
def mm3(double(NI,NK) A, double(NK,NJ) B, double(NJ,NM) C, double(NM,NL) D) -> (G) {
    E(i,j) +=! A(i,k) * B(k,j)
    F(j,l) +=! C(j,m) * D(m,l)
    G(i,l) +=! E(i,j) * F(j,l)
}""",
    dict(NI=800, NJ=900, NK=1000, NL=1100, NM=1200),
    lambda s, r: [_rand(r, s["NI"], s["NK"]), _rand(r, s["NK"], s["NJ"]),
                  _rand(r, s["NJ"], s["NM"]), _rand(r, s["NM"], s["NL"])],
    lambda A, B, C, D: ((A @ B) @ (C @ D),),
    """
  static double E[NI][NJ], F[NJ][NL];
  for (int i = 0; i < NI; i++)
    for (int j = 0; j < NJ; j++) {
      E[i][j] = 0.0;
      for (int k = 0; k < NK; ++k)
        E[i][j] += A[i][k] * B[k][j];
    }
  for (int i = 0; i < NJ; i++)
    for (int j = 0; j < NL; j++) {
      F[i][j] = 0.0;
      for (int k = 0; k < NM; ++k)
        F[i][j] += C[i][k] * D[k][j];
    }
  for (int i = 0; i < NI; i++)
    for (int j = 0; j < NL; j++) {
      G[i][j] = 0.0;
      for (int k = 0; k < NJ; ++k)
        G[i][j] += E[i][k] * F[k][j];
    }""",
    ["double A[NI][NK]", "double B[NK][NJ]", "double C[NJ][NM]", "double D[NM][NL]",
     "double G[NI][NL]"],
    [("in", 0), ("in", 1), ("in", 2), ("in", 3), ("out", 0)], [4],
    lambda s: 2.0 * (s["NI"] * s["NJ"] * s["NK"] + s["NJ"] * s["NL"] * s["NM"]
                     + s["NI"] * s["NL"] * s["NJ"]),
    dict(NI=5, NJ=7, NK=9, NL=3, NM=11))


def _syrk_ref(C, A):
    out = C.copy()
    L = _tril(len(C))
    out[L] = (BETA * C + ALPHA * A @ A.T)[L]
    return (out,)


SYRK = Bench(
    "syrk",
    """
def syrk(double(N,N) C_in, double(N,M) A) -> (double(N,N) C) {
    C(i,j) = (j <= i) ? 1.2 * C_in(i,j) : C_in(i,j)
    C(i,j) += 1.5 * A(i,k) * A(j,k) where exists A(i - j, k)
}""",
    dict(N=1200, M=1000),
    lambda s, r: [_rand(r, s["N"], s["N"]), _rand(r, s["N"], s["M"])],
    _syrk_ref,
    """
  for (int i = 0; i < N; i++) {
    for (int j = 0; j <= i; j++)
      C[i][j] *= BETA;
    for (int k = 0; k < M; k++)
      for (int j = 0; j <= i; j++)
        C[i][j] += ALPHA * A[i][k] * A[j][k];
  }""",
    ["double C[N][N]", "double A[N][M]"],
    [("copy", 0), ("in", 1)], [0],
    lambda s: 2.0 * s["M"] * s["N"] * (s["N"] + 1) / 2,
    dict(N=7, M=5))


def _syr2k_ref(C, A, B):
    out = C.copy()
    L = _tril(len(C))
    out[L] = (BETA * C + ALPHA * (A @ B.T + B @ A.T))[L]
    return (out,)


SYR2K = Bench(
    "syr2k",
    """
def syr2k(double(N,N) C_in, double(N,M) A, double(N,M) B) -> (double(N,N) C) {
    C(i,j) = (j <= i) ? 1.2 * C_in(i,j) : C_in(i,j)
    C(i,j) += A(j,k) * 1.5 * B(i,k) + B(j,k) * 1.5 * A(i,k) where exists A(i - j, k)
}""",
    dict(N=1200, M=1000),
    lambda s, r: [_rand(r, s["N"], s["N"]), _rand(r, s["N"], s["M"]),
                  _rand(r, s["N"], s["M"])],
    _syr2k_ref,
    """
  for (int i = 0; i < N; i++) {
    for (int j = 0; j <= i; j++)
      C[i][j] *= BETA;
    for (int k = 0; k < M; k++)
      for (int j = 0; j <= i; j++)
        C[i][j] += A[j][k] * ALPHA * B[i][k] + B[j][k] * ALPHA * A[i][k];
  }""",
    ["double C[N][N]", "double A[N][M]", "double B[N][M]"],
    [("copy", 0), ("in", 1), ("in", 2)], [0],
    lambda s: 4.0 * s["M"] * s["N"] * (s["N"] + 1) / 2,
    dict(N=7, M=5))

# -- matrix-vector -------------------------------------------------------------------------

ATAX = Bench(
    "atax",
    """
def atax(double(M,N) A, double(N) x) -> (y) {
    tmp(i) +=! A(i,j) * x(j)
    y(j) +=! A(i,j) * tmp(i)
}""",
    dict(M=1900, N=2100),
    lambda s, r: [_rand(r, s["M"], s["N"]), _rand(r, s["N"])],
    lambda A, x: (A.T @ (A @ x),),
    """
  static double tmp[M];
  for (int i = 0; i < N; i++)
    y[i] = 0;
  for (int i = 0; i < M; i++) {
    tmp[i] = 0.0;
    for (int j = 0; j < N; j++)
      tmp[i] = tmp[i] + A[i][j] * x[j];
    for (int j = 0; j < N; j++)
      y[j] = y[j] + A[i][j] * tmp[i];
  }""",
    ["double A[M][N]", "double x[N]", "double y[N]"],
    [("in", 0), ("in", 1), ("out", 0)], [2],
    lambda s: 4.0 * s["M"] * s["N"],
    dict(M=7, N=9))

BICG = Bench(
    "bicg",
    """
def bicg(double(N,M) A, double(M) p, double(N) r) -> (s, q) {
    s(j) +=! r(i) * A(i,j)
    q(i) +=! A(i,j) * p(j)
}""",
    dict(M=1900, N=2100),
    lambda s, r: [_rand(r, s["N"], s["M"]), _rand(r, s["M"]), _rand(r, s["N"])],
    lambda A, p, r: (r @ A, A @ p),
    """
  for (int i = 0; i < M; i++)
    s[i] = 0;
  for (int i = 0; i < N; i++) {
    q[i] = 0.0;
    for (int j = 0; j < M; j++) {
      s[j] = s[j] + r[i] * A[i][j];
      q[i] = q[i] + A[i][j] * p[j];
    }
  }""",
    ["double A[N][M]", "double p[M]", "double r[N]", "double s[M]", "double q[N]"],
    [("in", 0), ("in", 1), ("in", 2), ("out", 0), ("out", 1)], [3, 4],
    lambda s: 4.0 * s["M"] * s["N"],
    dict(M=7, N=9))

MVT = Bench(
    "mvt",
    """
def mvt(double(N) x1_in, double(N) x2_in, double(N) y1, double(N) y2, double(N,N) A)
    -> (x1, x2) {
    x1(i) = x1_in(i)
    x1(i) += A(i,j) * y1(j)
    x2(i) = x2_in(i)
    x2(i) += A(j,i) * y2(j)
}""",
    dict(N=2000),
    lambda s, r: [_rand(r, s["N"]), _rand(r, s["N"]), _rand(r, s["N"]), _rand(r, s["N"]),
                  _rand(r, s["N"], s["N"])],
    lambda x1, x2, y1, y2, A: (x1 + A @ y1, x2 + A.T @ y2),
    """
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      x1[i] = x1[i] + A[i][j] * y_1[j];
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      x2[i] = x2[i] + A[j][i] * y_2[j];""",
    ["double x1[N]", "double x2[N]", "double y_1[N]", "double y_2[N]", "double A[N][N]"],
    [("copy", 0), ("copy", 1), ("in", 2), ("in", 3), ("in", 4)], [0, 1],
    lambda s: 4.0 * s["N"] ** 2,
    dict(N=9))

GEMVER = Bench(
    "gemver",
    """
def gemver(double(N,N) A_in, double(N) u1, double(N) v1, double(N) u2, double(N) v2,
           double(N) w_in, double(N) x_in, double(N) y, double(N) z) -> (A, x, w) {
    A(i,j) = A_in(i,j) + u1(i) * v1(j) + u2(i) * v2(j)
    x(i) = x_in(i)
    x(i) += 1.2 * A(j,i) * y(j)
    x(i) = x(i) + z(i)
    w(i) = w_in(i)
    w(i) += 1.5 * A(i,j) * x(j)
}""",
    dict(N=2000),
    lambda s, r: [_rand(r, s["N"], s["N"])] + [_rand(r, s["N"]) for _ in range(8)],
    lambda A, u1, v1, u2, v2, w, x, y, z: _gemver_ref(A, u1, v1, u2, v2, w, x, y, z),
    """
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      A[i][j] = A[i][j] + u1[i] * v1[j] + u2[i] * v2[j];
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      x[i] = x[i] + BETA * A[j][i] * y[j];
  for (int i = 0; i < N; i++)
    x[i] = x[i] + z[i];
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      w[i] = w[i] + ALPHA * A[i][j] * x[j];""",
    ["double A[N][N]", "double u1[N]", "double v1[N]", "double u2[N]", "double v2[N]",
     "double w[N]", "double x[N]", "double y[N]", "double z[N]"],
    [("copy", 0), ("in", 1), ("in", 2), ("in", 3), ("in", 4), ("copy", 5), ("copy", 6),
     ("in", 7), ("in", 8)], [0, 6, 5],
    lambda s: 10.0 * s["N"] ** 2,
    dict(N=9))


def _gemver_ref(A, u1, v1, u2, v2, w, x, y, z):
    A = A + np.outer(u1, v1) + np.outer(u2, v2)
    x = x + BETA * A.T @ y + z
    return A, x, w + ALPHA * A @ x


GESUMMV = Bench(
    "gesummv",
    """
def gesummv(double(N,N) A, double(N,N) B, double(N) x) -> (y) {
    tmp(i) +=! A(i,j) * x(j)
    y(i) +=! B(i,j) * x(j)
    y(i) = 1.5 * tmp(i) + 1.2 * y(i)
}""",
    dict(N=1300),
    lambda s, r: [_rand(r, s["N"], s["N"]), _rand(r, s["N"], s["N"]), _rand(r, s["N"])],
    lambda A, B, x: (ALPHA * A @ x + BETA * B @ x,),
    """
  static double tmp[N];
  for (int i = 0; i < N; i++) {
    tmp[i] = 0.0;
    y[i] = 0.0;
    for (int j = 0; j < N; j++) {
      tmp[i] = A[i][j] * x[j] + tmp[i];
      y[i] = B[i][j] * x[j] + y[i];
    }
    y[i] = ALPHA * tmp[i] + BETA * y[i];
  }""",
    ["double A[N][N]", "double B[N][N]", "double x[N]", "double y[N]"],
    [("in", 0), ("in", 1), ("in", 2), ("out", 0)], [3],
    lambda s: 4.0 * s["N"] ** 2,
    dict(N=9))

# -- tensor contraction, data mining, stencil -----------------------------------------------

DOITGEN = Bench(
    "doitgen",
    """
def doitgen(double(NR,NQ,NP) A, double(NP,NP) C4) -> (Out) {
    Out(r,q,p) +=! A(r,q,s) * C4(s,p)
}""",
    dict(NR=150, NQ=140, NP=160),
    lambda s, r: [_rand(r, s["NR"], s["NQ"], s["NP"]), _rand(r, s["NP"], s["NP"])],
    lambda A, C4: (A @ C4,),
    """
  static double sum[NP];
  for (int r = 0; r < NR; r++)
    for (int q = 0; q < NQ; q++) {
      for (int p = 0; p < NP; p++) {
        sum[p] = 0.0;
        for (int s = 0; s < NP; s++)
          sum[p] += A[r][q][s] * C4[s][p];
      }
      for (int p = 0; p < NP; p++)
        A[r][q][p] = sum[p];
    }""",
    ["double A[NR][NQ][NP]", "double C4[NP][NP]"],
    [("copy", 0), ("in", 1)], [0],
    lambda s: 2.0 * s["NR"] * s["NQ"] * s["NP"] ** 2,
    dict(NR=3, NQ=5, NP=7))

COVARIANCE = Bench(
    "covariance",
    """
def covariance(double(N,M) data) -> (double(M,M) cov) {
    mean(j) +=! data(i,j)
    d(i,j) = data(i,j) - mean(j) / N
    cov(i,j) +=! d(k,i) * d(k,j) where exists d(0, j - i)
    cov(i,j) = cov(i,j) / (N - 1) where exists d(0, j - i)
    cov(j,i) = cov(i,j) where exists d(0, j - i - 1)
}""",
    dict(M=1200, N=1400),
    lambda s, r: [_rand(r, s["N"], s["M"])],
    lambda data: (np.cov(data, rowvar=False),),
    """
  static double mean[M];
  const double float_n = (double)N;
  for (int j = 0; j < M; j++) {
    mean[j] = 0.0;
    for (int i = 0; i < N; i++)
      mean[j] += data[i][j];
    mean[j] /= float_n;
  }
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++)
      data[i][j] -= mean[j];
  for (int i = 0; i < M; i++)
    for (int j = i; j < M; j++) {
      cov[i][j] = 0.0;
      for (int k = 0; k < N; k++)
        cov[i][j] += data[k][i] * data[k][j];
      cov[i][j] /= (float_n - 1.0);
      cov[j][i] = cov[i][j];
    }""",
    ["double data[N][M]", "double cov[M][M]"],
    # the C centres data in place: a copy
    [("copy", 0), ("out", 0)], [1],
    lambda s: 1.0 * s["N"] * s["M"] * (s["M"] + 1) + 2.0 * s["N"] * s["M"],
    dict(M=7, N=9))


#: the taps of the 5-point and 9-point Jacobi stencils, and their weights
JACOBI_TAPS = {5: ([(0, 0), (0, -1), (0, 1), (1, 0), (-1, 0)], "0.2"),
               9: ([(di, dj) for di in (-1, 0, 1) for dj in (-1, 0, 1)], "0.11111")}


def _shift(it: str, d: int) -> str:
    return it if d == 0 else f"{it}{d:+d}"


def _time_steps_tc(name: str, its: list[str], steps: int, stencil) -> str:
    """A two-array stencil (``A -> B -> A`` per time step), ``steps`` steps unrolled into
    statements over temporaries: each step's arrays first copy the inputs (the
    borders), then ``stencil(dst, src)`` (a TC right-hand side) updates the interior."""
    at = ",".join(its)
    interior = ", ".join(f"{it} in 1:N-1" for it in its)
    lines = []
    a = "A_in"
    for t in range(steps):
        b = "B" if t == steps - 1 else f"B{t}"
        a_next = "A" if t == steps - 1 else f"A{t}"
        for dst, src, init in ((b, a, "B_in"), (a_next, b, "A_in")):
            lines += [f"    {dst}({at}) = {init}({at})",
                      f"    {dst}({at}) = {stencil(src)} where {interior}"]
        a = a_next
    shape = ",".join("N" for _ in its)
    return (f"\ndef {name}(double({shape}) A_in, double({shape}) B_in) -> (A, B) {{\n"
            + "\n".join(lines) + "\n}")


def jacobi_tc(steps: int, points: int = 5) -> str:
    """jacobi-2d (5- or 9-point), ``steps`` time steps unrolled into statements over
    temporaries."""
    taps, weight = JACOBI_TAPS[points]

    def stencil(src):
        return f"{weight} * (" + " + ".join(
            f"{src}({_shift('i', di)},{_shift('j', dj)})" for di, dj in taps) + ")"
    return _time_steps_tc("jacobi2d", ["i", "j"], steps, stencil)


def heat_tc(steps: int) -> str:
    """heat-3d (PolyBench's 7-point update), ``steps`` time steps unrolled."""
    def stencil(src):
        c = f"{src}(i,j,k)"
        terms = [f"0.125 * ({src}({_shift('i', 1) if d == 0 else 'i'},"
                 f"{_shift('j', 1) if d == 1 else 'j'},{_shift('k', 1) if d == 2 else 'k'})"
                 f" - 2.0 * {c} + {src}({_shift('i', -1) if d == 0 else 'i'},"
                 f"{_shift('j', -1) if d == 1 else 'j'},{_shift('k', -1) if d == 2 else 'k'}))"
                 for d in range(3)]
        return " + ".join(terms) + f" + {c}"
    return _time_steps_tc("heat3d", ["i", "j", "k"], steps, stencil)


def _jacobi_ref(steps, points=5):
    taps, weight = JACOBI_TAPS[points]

    def update(src, dst):
        n = src.shape[0]
        total = None
        for di, dj in taps:
            part = src[1 + di:n - 1 + di, 1 + dj:n - 1 + dj]
            total = part if total is None else total + part
        dst[1:-1, 1:-1] = float(weight) * total
    return _steps_ref(steps, update)


def _heat_ref(steps):
    def update(s, d):
        c = s[1:-1, 1:-1, 1:-1]
        d[1:-1, 1:-1, 1:-1] = (0.125 * (s[2:, 1:-1, 1:-1] - 2.0 * c + s[:-2, 1:-1, 1:-1])
                               + 0.125 * (s[1:-1, 2:, 1:-1] - 2.0 * c + s[1:-1, :-2, 1:-1])
                               + 0.125 * (s[1:-1, 1:-1, 2:] - 2.0 * c + s[1:-1, 1:-1, :-2])
                               + c)
    return _steps_ref(steps, update)


def _steps_ref(steps, update):
    """The numpy reference of a two-array stencil: ``update(A, B)`` then ``update(B, A)``
    per time step, on copies of the inputs."""
    def ref(A, B):
        A, B = A.copy(), B.copy()
        for _ in range(steps):
            update(A, B)
            update(B, A)
        return A, B
    return ref


def _heat_c(steps: int) -> str:
    """heat-3d's naive C: PolyBench's two sweeps per time step, ``A -> B -> A``."""
    def sweep(dst, src):
        c = f"{src}[i][j][k]"
        terms = "\n                     + ".join(
            f"0.125 * ({src}{hi} - 2.0 * {c} + {src}{lo})" for hi, lo in (
                ("[i+1][j][k]", "[i-1][j][k]"), ("[i][j+1][k]", "[i][j-1][k]"),
                ("[i][j][k+1]", "[i][j][k-1]")))
        return ("    for (int i = 1; i < N - 1; i++)\n"
                "      for (int j = 1; j < N - 1; j++)\n"
                "        for (int k = 1; k < N - 1; k++)\n"
                f"          {dst}[i][j][k] = {terms}\n                     + {c};\n")
    return (f"\n  for (int t = 0; t < {steps}; t++) {{\n" + sweep("B", "A") + sweep("A", "B")
            + "  }")


def _jacobi9_c(steps: int) -> str:
    taps, weight = JACOBI_TAPS[9]

    def sweep(dst, src):
        total = " + ".join(f"{src}[i{di:+d}][j{dj:+d}]" for di, dj in taps)
        return (f"    for (int i = 1; i < N - 1; i++)\n"
                f"      for (int j = 1; j < N - 1; j++)\n"
                f"        {dst}[i][j] = {weight} * ({total});\n")
    return (f"\n  for (int t = 0; t < {steps}; t++) {{\n" + sweep("B", "A") + sweep("A", "B")
            + "  }")


JACOBI_STEPS = 4
JACOBI = Bench(
    "jacobi-2d",
    jacobi_tc(JACOBI_STEPS),
    dict(N=1300),
    lambda s, r: [_rand(r, s["N"], s["N"]), _rand(r, s["N"], s["N"])],
    _jacobi_ref(JACOBI_STEPS),
    f"""
  for (int t = 0; t < {JACOBI_STEPS}; t++) {{
    for (int i = 1; i < N - 1; i++)
      for (int j = 1; j < N - 1; j++)
        B[i][j] = 0.2 * (A[i][j] + A[i][j-1] + A[i][1+j] + A[1+i][j] + A[i-1][j]);
    for (int i = 1; i < N - 1; i++)
      for (int j = 1; j < N - 1; j++)
        A[i][j] = 0.2 * (B[i][j] + B[i][j-1] + B[i][1+j] + B[1+i][j] + B[i-1][j]);
  }}""",
    ["double A[N][N]", "double B[N][N]"],
    [("copy", 0), ("copy", 1)], [0, 1],
    lambda s: 10.0 * JACOBI_STEPS * (s["N"] - 2) ** 2,
    dict(N=9))

JACOBI9 = Bench(
    "jacobi-2d-9",
    jacobi_tc(JACOBI_STEPS, points=9),
    dict(N=1300),
    lambda s, r: [_rand(r, s["N"], s["N"]), _rand(r, s["N"], s["N"])],
    _jacobi_ref(JACOBI_STEPS, points=9),
    _jacobi9_c(JACOBI_STEPS),
    ["double A[N][N]", "double B[N][N]"],
    [("copy", 0), ("copy", 1)], [0, 1],
    lambda s: 18.0 * JACOBI_STEPS * (s["N"] - 2) ** 2,
    dict(N=9))

HEAT_STEPS = 4
HEAT = Bench(
    "heat-3d",
    heat_tc(HEAT_STEPS),
    dict(N=120),
    lambda s, r: [_rand(r, s["N"], s["N"], s["N"]), _rand(r, s["N"], s["N"], s["N"])],
    _heat_ref(HEAT_STEPS),
    _heat_c(HEAT_STEPS),
    ["double A[N][N][N]", "double B[N][N][N]"],
    [("copy", 0), ("copy", 1)], [0, 1],
    lambda s: 30.0 * HEAT_STEPS * (s["N"] - 2) ** 3,
    dict(N=7))

BENCHES = [GEMM, GEMVER, MM2, MM3, SYRK, SYR2K, ATAX, BICG, MVT, GESUMMV, DOITGEN, COVARIANCE,
           JACOBI, JACOBI9, HEAT]


def c_source(b: Bench, sizes: dict[str, int]) -> str:
    """The naive C of ``b`` with the sizes as compile-time constants (as PolyBench's
    ``-DLARGE_DATASET``); function ``kernel(void **arrays)``."""
    defs = "".join(f"#define {k} {v}\n" for k, v in sizes.items())
    unpack = "".join(f"  {_ptr_decl(p, i)}\n" for i, p in enumerate(b.c_params))
    suffix = "f" if b.ctype == "float" else ""
    return (f"{defs}#define ALPHA {ALPHA}{suffix}\n#define BETA {BETA}{suffix}\n"
            f"void kernel(void **arrays)\n{{\n{unpack}{b.c_body}\n}}\n")


def _ptr_decl(param: str, i: int) -> str:
    """``double A[NI][NK]`` -> ``double (*A)[NK] = arrays[i];`` (1-D: ``double *x``)."""
    typ, rest = param.split(" ", 1)
    name, _, dims = rest.partition("[")
    dims = "[" + dims
    inner = dims[dims.index("]") + 1:]
    if inner:
        return f"{typ} (*{name}){inner} = arrays[{i}];"
    return f"{typ} *{name} = arrays[{i}];"
