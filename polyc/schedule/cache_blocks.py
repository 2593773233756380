"""Cache-tile rows of a register-tiled contraction, from the L2 size and the thread count.

After register tiling, one cache tile of matmul ``C(m,n) +=! A(m,k) * B(k,n)`` runs its
register tiles row block by row block: for each ``MR``-row strip of ``A`` (kept in L1), it
sweeps the whole ``B`` panel of the tile (``kc x nc``, sized by ``_fit_panel`` to half the
L2). The panel comes from L3 or memory once per cache tile and is reused once per row
strip, so the number of rows ``mc`` in a cache tile sets how much memory traffic each
panel load is amortised over: ``2 / mc`` bytes per flop. The old fixed 32 rows left float32
matmul at 2048 at 0.6x of OpenBLAS (its 8 MB ``B`` no longer fits next to the working set
in L3, and the 8 KB row stride makes the panel conflict in L2); 256 rows reach 0.9x.

The rows are bounded by two things:

* the ``A`` block of a cache tile (``mc x kc``) stays in L2 beside the panel: at most a
  quarter of it (:data:`ROW_BLOCK_L2_FRACTION`; 256 float32 rows of 256 on a 1 MB L2);
* when the row member is the band's outermost (the ``omp parallel for`` loop), every thread
  gets the same number of equally sized row blocks, so bigger blocks never starve a core.

Only kernels whose sizes are fixed get the rule (the extent is needed for the balance);
explicit ``Options.tile`` sizes are never changed (the caller only applies it by default).
"""
from __future__ import annotations


import islpy as isl

from .. import dtypes as D
from ..ir import Kernel
from ..options import Options
from . import machine, register_tile, tiling
from .vector import member_iterators

#: the share of the L2 the A block of one cache tile may take (the panel takes half)
ROW_BLOCK_L2_FRACTION = 4


def fit_rows(sizes: list[int], node: isl.ScheduleNode, kernel: Kernel,
             reg: register_tile.Plan, options: Options) -> list[int]:
    """``sizes`` with the register tile's row member (``reg.u``) resized (module doc)."""
    ext = member_extent(node, kernel, reg.u)
    if ext is None or ext <= 0:
        return sizes
    itemsize = D.itemsize(kernel.array(reg.array).dtype)
    depth = reduction_depth(sizes, node, kernel)
    budget = machine.l2_bytes() // ROW_BLOCK_L2_FRACTION // max(1, depth * itemsize)
    budget = max(reg.mr, budget // reg.mr * reg.mr)
    threads = machine.threads(options.threads) if reg.u == 0 and options.parallel else 1
    sizes = list(sizes)
    sizes[reg.u] = balanced_rows(ext, budget, threads, reg.mr)
    return sizes


def balanced_rows(extent: int, budget: int, threads: int, mr: int) -> int:
    """Rows per block: the fewest blocks of at most ``budget`` rows (give or take a
    register tile) whose count is a multiple of ``threads``, all of about the same size,
    rounded up to a multiple of ``mr`` (so register tiles stay whole inside a block)."""
    per_thread = -(-extent // (threads * budget))
    rows = -(-extent // (threads * per_thread))
    return max(mr, -(-rows // mr) * mr)


def reduction_depth(sizes: list[int], node: isl.ScheduleNode, kernel: Kernel) -> int:
    """Reduction instances in one cache tile (the panel's depth, ``kc`` of a matmul)."""
    flags = tiling.coincident_flags(node)
    depth = 1
    for i, t in enumerate(sizes):
        if not flags[i]:
            ext = member_extent(node, kernel, i)
            depth *= t if ext is None else min(t, ext)
    return depth


def member_extent(node: isl.ScheduleNode, kernel: Kernel, member: int) -> int | None:
    """Values the band member takes when it is one fixed-size iterator; else None."""
    its = list(member_iterators(node, member).items())
    if len(its) != 1 or its[0][1] is None:
        return None
    return register_tile.extent(kernel.statement(its[0][0]), kernel, its[0][1])
