"""Winograd's minimal filtering for 3x3 convolutions, ``F(m x m, 3 x 3)``.

A stride-1 3x3 convolution computes each ``m x m`` tile of its output from an
``(m + 2) x (m + 2)`` tile of its input. Winograd's algorithm (Lavin and Gray, "Fast
Algorithms for Convolutional Neural Networks", 2016) does it as::

    Y_tile = A^T [ (G g G^T)  (.)  (B^T d B) ] A

with ``(.)`` the elementwise product over the ``alpha x alpha`` positions (``alpha =
m + 2``). Summed over the input channels, the elementwise products are ``alpha**2``
independent matrix products, one per position: ``M[a,b](tile, m) = sum_c V[a,b](tile,
c) * U[a,b](c, m)`` -- ``alpha**2 / (m*m)`` multiplications an output instead of 9
(16/4: 2.25x fewer for ``F(2x2, 3x3)``, 36/16: 4x for ``F(4x4, 3x3)``). The filter
transform ``U = G g G^T`` of a model's constant weights is done here, once, at compile
time; the input transform ``V = B^T d B`` and the output transform run in the kernel
as sums of a few input values with small constant coefficients (:func:`transform`).

The results differ from the direct convolution's by rounding only: the transforms add
and subtract inputs before the products. ``F(2x2, 3x3)``'s coefficients are 0, +-1 and
+-1/2 (exact in binary): on a 56x56x64 layer its largest difference from
onnxruntime's direct convolution was 3e-7 of the output's range, the direct
convolution's own 8e-7. ``F(4x4, 3x3)``'s 1/24 and 8 lose more; polyc uses
``F(2x2, 3x3)`` (:data:`TILE`).

In the ONNX path (:mod:`.onnx_layout`) a convolution becomes three kernels: the input
transform (:func:`.onnx_ops_nn.winograd_input`), a batched MatMul over the flattened
tiles (the contraction polyc's register tiles already serve) and the output transform
with the bias and the fused epilogue (:func:`.onnx_ops_nn.winograd_output`).
"""
from __future__ import annotations

from fractions import Fraction as Fr

import numpy as np

#: the output tile ``m`` (``F(m x m, 3 x 3)``), 2 or 4
TILE = 2

# The matrices of F(m, 3) for the interpolation points 0, 1, -1 (and 2, -2 for m=4)
# and infinity, as in Lavin and Gray's paper.
_MATRICES = {
    2: dict(
        BT=[[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        G=[[1, 0, 0], [Fr(1, 2), Fr(1, 2), Fr(1, 2)], [Fr(1, 2), Fr(-1, 2), Fr(1, 2)],
           [0, 0, 1]],
        AT=[[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: dict(
        BT=[[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
            [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        G=[[Fr(1, 4), 0, 0], [Fr(-1, 6), Fr(-1, 6), Fr(-1, 6)],
           [Fr(-1, 6), Fr(1, 6), Fr(-1, 6)], [Fr(1, 24), Fr(1, 12), Fr(1, 6)],
           [Fr(1, 24), Fr(-1, 12), Fr(1, 6)], [0, 0, 1]],
        AT=[[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
            [0, 1, -1, 8, -8, 1]]),
}


def matrices(m: int = TILE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(BT, G, AT)`` of ``F(m, 3)`` as float64 arrays: ``(alpha, alpha)``, ``(alpha,
    3)``, ``(m, alpha)``."""
    if m not in _MATRICES:
        raise ValueError(f"F({m}, 3) is not implemented (tiles: {sorted(_MATRICES)})")
    mat = _MATRICES[m]
    return tuple(np.array([[float(v) for v in row] for row in mat[k]])
                 for k in ("BT", "G", "AT"))


def filter_transform(w: np.ndarray, m: int = TILE) -> np.ndarray:
    """``(M, C, 3, 3)`` weights -> ``U`` of shape ``(alpha, alpha, M, C)``, ``U[a, b] = G
    w G^T`` (computed in float64, then stored in ``w``'s type)."""
    _, g, _ = matrices(m)
    u = np.einsum("ai,mcij,bj->abmc", g, w.astype(np.float64), g)
    return u.astype(w.dtype)


def _coefficient(v: float) -> str:
    return repr(abs(float(v)))


def linear(coefficients: np.ndarray, terms: list[str]) -> str:
    """``sum_k coefficients[k] * terms[k]`` as an expression, zero terms left out, +-1
    written without a product: ``(d0 - d2)``."""
    out = ""
    for c, t in zip(coefficients, terms):
        if c == 0:
            continue
        body = t if abs(c) == 1 else f"{_coefficient(c)} * {t}"
        if not out:
            out = body if c > 0 else f"-{body}"
        else:
            out += f" + {body}" if c > 0 else f" - {body}"
    return f"({out})" if out else "0.0"


def transform(left: np.ndarray, right: np.ndarray, a: int, b: int, value) -> str:
    """``(left X right^T)[a, b]`` for ``X[i, j] = value(i, j)`` (an expression string):
    ``sum_i left[a, i] * (sum_j right[b, j] * X[i, j])``, the inner sums written the same
    way for every ``a`` (so a C compiler can share them between the positions of a
    tile)."""
    rows = [linear(right[b], [value(i, j) for j in range(right.shape[1])])
            for i in range(left.shape[1])]
    return linear(left[a], rows)
