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
as 1-D transforms along the tile's rows, then its columns: sums of a few values
with small constant coefficients (:func:`linear`).

The results differ from the direct convolution's by rounding only: the transforms add
and subtract inputs before the products. ``F(2x2, 3x3)``'s coefficients are 0, +-1 and
+-1/2 (exact in binary): on a 56x56x64 layer its largest difference from
onnxruntime's direct convolution was 3e-7 of the output's range, the direct
convolution's own 8e-7. ``F(4x4, 3x3)``'s 1/24, 4 and 8 lose more: 4e-6 there, 1.3e-5
on a 7x7x512 layer. Which one a layer gets: :func:`tile_for`.

In the ONNX path (:mod:`.onnx_layout`) a convolution becomes three kernels: the input
transform (:func:`.onnx_ops_nn.winograd_input`), a batched MatMul over the flattened
tiles (the contraction polyc's register tiles already serve) and the output transform
with the bias and the fused epilogue (:func:`.onnx_ops_nn.winograd_output`).
"""
from __future__ import annotations

from fractions import Fraction as Fr

import numpy as np

#: the output tile ``m`` of ``F(m x m, 3 x 3)`` of a layer narrower than :data:`WIDE`
TILE = 2
#: layers whose output is at least this wide and high use ``F(4x4, 3x3)``: 1.78x fewer
#: multiplications than ``F(2x2, 3x3)`` and transformed tiles 0.56x the size; on
#: narrower ones the 4x4 tiles overhang the output more (7x7: 8x8 computed either way)
#: and the transformed weights (2.25x larger) dominate. Measured on a Zen 4 EPYC, one
#: thread, against the direct convolution: 56x56x64 0.75 -> 0.60, 28x28x128 0.59 ->
#: 0.39, 14x14x256 0.50 -> 0.47, 7x7x512 0.70 -> 0.66 (weights 37 MB: left at 2)
WIDE = 14
#: the tiles implemented
TILES = (2, 4)


def tile_for(out_h: int, out_w: int, choice: bool | int = True) -> int:
    """The output tile ``m`` of a layer with an ``out_h x out_w`` output: ``choice``
    2 or 4 forces it, ``True`` picks 4 from :data:`WIDE` on, else :data:`TILE`."""
    if choice is True:
        return 4 if min(out_h, out_w) >= WIDE else TILE
    if choice not in TILES:
        raise ValueError(f"Winograd tile {choice!r} (implemented: {TILES})")
    return int(choice)

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


def matrices(m: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(BT, G, AT)`` of ``F(m, 3)`` (default :data:`TILE`) as float64 arrays:
    ``(alpha, alpha)``, ``(alpha, 3)``, ``(m, alpha)``."""
    m = TILE if m is None else m
    if m not in _MATRICES:
        raise ValueError(f"F({m}, 3) is not implemented (tiles: {sorted(_MATRICES)})")
    mat = _MATRICES[m]
    return tuple(np.array([[float(v) for v in row] for row in mat[k]])
                 for k in ("BT", "G", "AT"))


def filter_transform(w: np.ndarray, m: int | None = None) -> np.ndarray:
    """``(M, C, 3, 3)`` weights -> ``U`` of shape ``(alpha, alpha, M, C)``, ``U[a, b] = G
    w G^T`` for ``F(m, 3)`` (default :data:`TILE`; computed in float64, then stored in
    ``w``'s type)."""
    _, g, _ = matrices(m)
    u = np.einsum("ai,mcij,bj->abmc", g, w.astype(np.float64), g)
    return u.astype(w.dtype)


def linear(coefficients: np.ndarray, terms: list[str]) -> str:
    """``sum_k coefficients[k] * terms[k]`` as an expression, zero terms left out, +-1
    written without a product: ``(d0 - d2)``."""
    from .onnx_ops_shape import signed_sum
    out = signed_sum(zip(coefficients, terms), lambda c, t: f"{float(c)!r} * {t}")
    return f"({out})" if out else "0.0"
