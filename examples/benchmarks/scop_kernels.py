"""C loop nests in the Pluto/PolyBench style, each a function with a ``#pragma scop``
region (written for polyc; not PolyBench's files): the stencils jacobi-1d (float),
jacobi-2d, heat-3d and seidel-2d (in place), and gemm, atax, bicg, mvt (double). Used by
``bench_scop.py`` and by the tests (``tests/test_scop.py``, ``tests/test_pluto.py``)."""
from __future__ import annotations

JACOBI_1D = r"""
/* 3-point Jacobi, two half-steps per time step through B */
void jacobi_1d(int T, int N, float A[N], float B[N])
{
#pragma scop
  for (int t = 0; t < T; t++) {
    for (int i = 1; i < N - 1; i++)
      B[i] = 0.33333f * (A[i - 1] + A[i] + A[i + 1]);
    for (int i = 1; i < N - 1; i++)
      A[i] = 0.33333f * (B[i - 1] + B[i] + B[i + 1]);
  }
#pragma endscop
}
"""

JACOBI_2D = r"""
/* 5-point Jacobi on a square grid, A -> B -> A per time step */
void jacobi_2d(int T, int N, double A[N][N], double B[N][N])
{
  int t, i, j;
#pragma scop
  for (t = 0; t < T; t++) {
    for (i = 1; i <= N - 2; i++)
      for (j = 1; j <= N - 2; j++)
        B[i][j] = 0.2 * (A[i][j] + A[i][j - 1] + A[i][j + 1] + A[i - 1][j] + A[i + 1][j]);
    for (i = 1; i <= N - 2; i++)
      for (j = 1; j <= N - 2; j++)
        A[i][j] = 0.2 * (B[i][j] + B[i][j - 1] + B[i][j + 1] + B[i - 1][j] + B[i + 1][j]);
  }
#pragma endscop
}
"""

HEAT_3D = r"""
/* explicit heat equation on a cube, 7-point Laplacian, A -> B -> A per time step */
void heat_3d(int T, int N, double A[N][N][N], double B[N][N][N])
{
#pragma scop
  for (int t = 0; t < T; t++) {
    for (int i = 1; i < N - 1; i++)
      for (int j = 1; j < N - 1; j++)
        for (int k = 1; k < N - 1; k++)
          B[i][j][k] = A[i][j][k]
                       + 0.125 * (A[i + 1][j][k] - 2.0 * A[i][j][k] + A[i - 1][j][k])
                       + 0.125 * (A[i][j + 1][k] - 2.0 * A[i][j][k] + A[i][j - 1][k])
                       + 0.125 * (A[i][j][k + 1] - 2.0 * A[i][j][k] + A[i][j][k - 1]);
    for (int i = 1; i < N - 1; i++)
      for (int j = 1; j < N - 1; j++)
        for (int k = 1; k < N - 1; k++)
          A[i][j][k] = B[i][j][k]
                       + 0.125 * (B[i + 1][j][k] - 2.0 * B[i][j][k] + B[i - 1][j][k])
                       + 0.125 * (B[i][j + 1][k] - 2.0 * B[i][j][k] + B[i][j - 1][k])
                       + 0.125 * (B[i][j][k + 1] - 2.0 * B[i][j][k] + B[i][j][k - 1]);
  }
#pragma endscop
}
"""

SEIDEL_2D = r"""
/* Gauss-Seidel, 9 points, in place: each point reads its already-updated neighbours */
void seidel_2d(int T, int N, double A[N][N])
{
#pragma scop
  for (int t = 0; t <= T - 1; t++)
    for (int i = 1; i <= N - 2; i++)
      for (int j = 1; j <= N - 2; j++)
        A[i][j] = (A[i - 1][j - 1] + A[i - 1][j] + A[i - 1][j + 1]
                   + A[i][j - 1] + A[i][j] + A[i][j + 1]
                   + A[i + 1][j - 1] + A[i + 1][j] + A[i + 1][j + 1]) / 9.0;
#pragma endscop
}
"""

GEMM = r"""
/* C := alpha * A B + beta * C, row by row (i, k, j: unit stride innermost) */
void gemm(int NI, int NJ, int NK, double alpha, double beta,
          double C[NI][NJ], double A[NI][NK], double B[NK][NJ])
{
#pragma scop
  for (int i = 0; i < NI; i++) {
    for (int j = 0; j < NJ; j++)
      C[i][j] *= beta;
    for (int k = 0; k < NK; k++)
      for (int j = 0; j < NJ; j++)
        C[i][j] += alpha * A[i][k] * B[k][j];
  }
#pragma endscop
}
"""

ATAX = r"""
/* y := A^T (A x), through tmp = A x */
void atax(int M, int N, double A[M][N], double x[N], double y[N], double tmp[M])
{
#pragma scop
  for (int i = 0; i < N; i++)
    y[i] = 0.0;
  for (int i = 0; i < M; i++) {
    tmp[i] = 0.0;
    for (int j = 0; j < N; j++)
      tmp[i] = tmp[i] + A[i][j] * x[j];
    for (int j = 0; j < N; j++)
      y[j] = y[j] + A[i][j] * tmp[i];
  }
#pragma endscop
}
"""

BICG = r"""
/* the two products of BiCG: s := A^T r and q := A p, in one sweep over A */
void bicg(int M, int N, double A[N][M], double s[M], double q[N], double p[M], double r[N])
{
#pragma scop
  for (int i = 0; i < M; i++)
    s[i] = 0.0;
  for (int i = 0; i < N; i++) {
    q[i] = 0.0;
    for (int j = 0; j < M; j++) {
      s[j] = s[j] + r[i] * A[i][j];
      q[i] = q[i] + A[i][j] * p[j];
    }
  }
#pragma endscop
}
"""

MVT = r"""
/* x1 += A y1 and x2 += A^T y2 */
void mvt(int N, double x1[N], double x2[N], double y1[N], double y2[N], double A[N][N])
{
#pragma scop
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      x1[i] = x1[i] + A[i][j] * y1[j];
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++)
      x2[i] = x2[i] + A[j][i] * y2[j];
#pragma endscop
}
"""
