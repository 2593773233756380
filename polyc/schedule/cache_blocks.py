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

* the ``A`` block of a cache tile (``mc x kc``) stays in L2 beside the panel: at most
  half of it (:data:`ROW_BLOCK_L2_FRACTION`; 256 float32 rows of 512 on a 1 MB L2);
* when the row member is the band's outermost (the ``omp parallel for`` loop), every thread
  gets the same number of equally sized row blocks, so bigger blocks never starve a core;
  where the rows carry unequal work (syrk's triangle ``j <= i``: a statement's first
  and last row span boxes of different sizes, :func:`_unequal_rows`), each thread gets at least :data:`UNEQUAL_BLOCKS_PER_THREAD` blocks, which the
  threads then take in turn (``optimize._cyclic_pays``). syrk at 301 x 97 on a Zen 2
  EPYC (512 KB L2) took one block of 154 rows a thread: a quarter and three quarters of
  the triangle.

Only kernels whose sizes are fixed get the rule (the extent is needed for the balance);
explicit ``Options.tile`` sizes are never changed (the caller only applies it by default).
"""
from __future__ import annotations


import islpy as isl

from .. import dtypes as D
from .. import expr as E
from ..ir import Kernel
from ..options import Options
from . import machine, register_tile, tiling
from .vector import member_iterators

#: the share of the L2 the A block of one cache tile may take (the panel takes half).
#: Half rather than a quarter: twice the rows, so each thread streams its panels from
#: the L3 and memory half as often per flop. Measured on a Zen 5 EPYC, A/B in one
#: process: 2 threads, matmul 4096 456 -> 484 GFLOP/s, 2048 460 -> 474, 1024, the
#: rectangular shapes, the ResNets, BERT and MobileNetV2 unchanged within noise; one
#: thread, matmul 3000 234 -> 239 GFLOP/s (twice), 4096 241 -> 244, 4096x1024x256
#: 262 -> 265, the others within 1%; ResNet-18 0.99x of the time, MobileNetV2 0.98x,
#: BERT 0.99x, ResNet-50 1.01x
ROW_BLOCK_L2_FRACTION = 2
#: row blocks each thread gets at least where the rows carry unequal work (module doc)
UNEQUAL_BLOCKS_PER_THREAD = 4


def fit_rows(sizes: list[int], node: isl.ScheduleNode, kernel: Kernel,
             reg: register_tile.Plan, options: Options) -> list[int]:
    """``sizes`` with the register tile's row member (``reg.u``) resized (module doc);
    unchanged for a tile without one."""
    if reg.u is None:
        return sizes
    ext = member_extent(node, kernel, reg.u)
    if ext is None or ext <= 0:
        return sizes
    itemsize = D.itemsize(kernel.array(reg.array).dtype)
    depth = reduction_depth(sizes, node, kernel)
    cores = machine.threads(options.threads) if options.parallel else 1
    budget = machine.l2_bytes() // ROW_BLOCK_L2_FRACTION // max(1, depth * itemsize)
    budget = max(reg.mr, budget // reg.mr * reg.mr)
    threads = cores if reg.u == 0 else 1
    blocks = UNEQUAL_BLOCKS_PER_THREAD if threads > 1 and \
        _unequal_rows(node, kernel, reg.u) else 1
    sizes = list(sizes)
    sizes[reg.u] = balanced_rows(ext, budget, threads, reg.mr, blocks)
    return sizes


def _unequal_rows(node: isl.ScheduleNode, kernel: Kernel, member: int) -> bool:
    """Whether the rows of band member ``member`` carry unequal work: some statement's
    instances on its first row and on its last span boxes of different sizes (syrk's
    triangle ``j <= i``; not a packed matmul's partial last column block, the same on
    every row)."""
    its = member_iterators(node, member)
    sets: list[isl.Set] = []
    node.get_domain().intersect_params(kernel.context).foreach_set(sets.append)
    for x in sets:
        it = its.get(x.get_tuple_name())
        pos = x.find_dim_by_name(isl.dim_type.set, it) if it is not None else -1
        if pos < 0:
            continue
        lo, hi = x.dim_min_val(pos), x.dim_max_val(pos)
        if not (lo.is_int() and hi.is_int()):
            continue
        first = tiling.box_volume(x.fix_val(isl.dim_type.set, pos, lo))
        last = tiling.box_volume(x.fix_val(isl.dim_type.set, pos, hi))
        if first is None or first != last:
            return True
    return False


def balanced_rows(extent: int, budget: int, threads: int, mr: int, per_thread: int = 1
                  ) -> int:
    """Rows per block: the fewest blocks of at most ``budget`` rows (give or take a
    register tile), at least ``per_thread`` a thread, whose count is a multiple of
    ``threads``, all of about the same size, rounded up to a multiple of ``mr`` (so
    register tiles stay whole inside a block)."""
    per_thread = max(per_thread, -(-extent // (threads * budget)))
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
    """Values the band member takes when it is one fixed-size iterator of each
    statement, of the same extent in all; else None."""
    its = list(member_iterators(node, member).items())
    if not its or any(it is None for _, it in its):
        return None
    extents = {register_tile.extent(kernel.statement(name), kernel, it) for name, it in its}
    return extents.pop() if len(extents) == 1 else None


def whole_tile(node: isl.ScheduleNode, kernel: Kernel, member: int) -> int | None:
    """A tile size along ``member`` that puts all its values in one tile (tiles start at
    multiples of the size: ``hi + 1`` where no value is negative; a range from ``-3``
    takes two tiles whatever the size, and gets its extent); None where the member is
    not one fixed-size iterator of each statement."""
    size = 0
    for name, it in member_iterators(node, member).items():
        b = None if it is None else register_tile.bounds(kernel.statement(name), kernel, it)
        if b is None:
            return None
        lo, hi = b
        size = max(size, hi + 1 if lo >= 0 else hi - lo + 1)
    return size or None


#: the share of the L2 the rows a streaming band reuses may take (:func:`streams`)
STREAM_L2_FRACTION = 4


def streams(node: isl.ScheduleNode, kernel: Kernel) -> bool:
    """Would tiles of this band reuse nothing that its rows do not keep in cache already?

    So for a band whose every access is pointwise along the band -- each member
    iterator in at most one index, as ``it + c``, the innermost in the last index
    (contiguous) -- such as an elementwise operation or a Jacobi stencil
    (``A(i-1,j) + A(i,j) + A(i+1,j)``): its only reuse is between accesses that differ
    by a constant along the outermost member, and if those rows of every array
    (``spread + 1`` rows each) fit in a quarter of the L2 (:data:`STREAM_L2_FRACTION`),
    the untiled loops keep them as well as tiles would. Tiles would only cut the rows
    into short runs (the hardware prefetcher streams whole rows best) and add halo
    reads: jacobi-2d at 1300 ran 0.8x of gcc tiled, 1.04x untiled. A reduction, a
    transposed or strided access, an unknown extent: tiles stay."""
    n = node.band_n_member()
    if not all(tiling.coincident_flags(node)):
        return False
    members = [member_iterators(node, m) for m in range(n)]
    rows: dict[str, tuple[int, int, int]] = {}  # array -> (lowest, highest offset, row bytes)
    for name in members[0]:
        its = [m.get(name) for m in members]
        if None in its or len(set(its)) < n:
            return False
        s = kernel.statement(name)
        extents = [register_tile.extent(s, kernel, it) for it in its]
        if None in extents:
            return False
        for access in (s.write, *s.reads):
            placed = _pointwise(access, its, dict(kernel.fixed_sizes))
            if placed is None:
                return False
            row = D.itemsize(kernel.array(access.array).dtype)
            for m in range(1, n):
                row *= extents[m] if its[m] in placed else 1
            offset = placed.get(its[0], 0)
            lo, hi, _ = rows.get(access.array, (offset, offset, row))
            rows[access.array] = (min(lo, offset), max(hi, offset), row)
    need = sum((hi - lo + 1) * row for lo, hi, row in rows.values())
    return need * STREAM_L2_FRACTION <= machine.l2_bytes()


#: the share of the L1 the sums of a band summing down columns may take
#: (:func:`sums_down_columns`)
COLUMN_SUMS_L1_FRACTION = 2


def sums_down_columns(node: isl.ScheduleNode, kernel: Kernel) -> bool:
    """Does this band add whole rows into a few sums that stay in the L1?

    So for a band whose innermost member is coincident and walks the last index of
    every access that holds it, with reductions before it, each statement's write
    holding none of the reduction iterators and every access pointwise along the band
    (:func:`_pointwise`), and whose writes over the coincident members fit in a half of
    the L1 (:data:`COLUMN_SUMS_L1_FRACTION`): ``x(i) +=! A(j,i) * y(j)``, a vector-matrix
    product down the columns of a row-major ``A`` (bicg's ``s``, mvt's ``x2``, atax's
    ``y``). Untiled, each step of the sum streams a whole row of ``A`` while the sums
    stay in the L1; tiles of 512 columns cut every row into 2 KB pieces 8 KB apart
    (float 2000x2000, one thread: 0.39 -> 0.28 ms; OpenBLAS ``y @ A`` 0.17 ms)."""
    n = node.band_n_member()
    flags = tiling.coincident_flags(node)
    if n < 2 or all(flags) or not flags[-1]:
        return False
    members = [member_iterators(node, m) for m in range(n)]
    budget = machine.l1d_bytes() // COLUMN_SUMS_L1_FRACTION
    for name in members[0]:
        its = [m.get(name) for m in members]
        if None in its or len(set(its)) < n:
            return False
        s = kernel.statement(name)
        sums = {it for it, f in zip(its, flags) if not f}
        if any(sums & E.free_names(ix)[0] for ix in s.write.indices):
            return False
        if any(_pointwise(a, its, dict(kernel.fixed_sizes)) is None
               for a in (s.write, *s.reads)):
            return False
        size = D.itemsize(kernel.array(s.write.array).dtype)
        for it, f in zip(its, flags):
            extent = register_tile.extent(s, kernel, it)
            if extent is None:
                return False
            size *= extent if f else 1
        budget -= size
        if budget < 0:
            return False
    return True


def _pointwise(access, its: list[str], sizes: dict[str, int]) -> dict[str, int] | None:
    """``{iterator: offset}`` of the band iterators ``its`` in ``access`` when each is
    in one index as ``it + offset`` and the innermost (``its[-1]``), if there, in the
    last; None otherwise."""
    from .. import expr as E
    placed: dict[str, int] = {}
    for d, ix in enumerate(access.indices):
        names = E.free_names(ix)[0] & set(its)
        if not names:
            continue
        if len(names) > 1 or not E.is_affine(ix) or any(
                isinstance(x, E.Binary) and x.op in ("//", "%") for x in E.walk(ix)):
            return None
        it = next(iter(names))
        env = dict.fromkeys(E.free_names(ix)[0] | E.free_names(ix)[1], 0)
        env.update({k: v for k, v in sizes.items() if k in env})
        base = E.evaluate(ix, env)
        env[it] = 1
        if it in placed or E.evaluate(ix, env) - base != 1 \
                or (it == its[-1] and d != len(access.indices) - 1):
            return None
        placed[it] = base
    return placed
