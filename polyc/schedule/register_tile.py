"""Register tiling: unroll-and-jam of a leaf band with its accumulators in registers.

A contraction's point band, after cache tiling, runs (for matmul) ``m, k, n`` with ``n``
the ``omp simd`` loop, so ``C[m][n]`` is loaded and stored at every ``k``. This pass
tiles that point band once more, for registers::

    band (cache tiles)                        band (cache tiles)
      band [m, k, n]            ==>             band [m - m%MR, n - n%NR]  (register tiles;
                                                                            full ones isolated)
                                                  mark "register:S1:8,64:512"
                                                    band [k]             (the reductions)
                                                      band [m]           (fully unrolled)
                                                        mark "simd"
                                                          band [n]

The ``register:<statement>:<box sizes>:<vector bits>`` mark tells code generation to keep the
statement's write footprint of one register tile (an ``MR x NR`` box of ``C``) in a
local array: copied in before the reduction loops, updated there (``acc[m - mo][n - no]``;
gcc keeps it in vector registers once the row loop is unrolled and the column loop is
``omp simd``), copied out after them.

The band qualifies (:func:`plan`) when it has exactly one statement, a coincident
stride-1 vector member ``v`` (the write's last index), at least one reduction member
none of whose iterators the write uses, and a coincident member ``u`` that indexes a
non-last dimension of the write and no read that ``v`` walks (so each vector load is
reused by the ``MR`` unrolled rows) -- or, where none does, one that some read ``v``
walks ignores (a depthwise convolution's rows each load their input pixels and share
the weights of the tap; its accumulators then stay in registers across the taps).
:func:`apply` checks the rest on the tree it built
and keeps the old band when a check fails: only that statement touches the array, its
accesses to it all go through the written element, and the write footprint of one
register tile is exactly a box (so the copy-out never writes an element it did not
compute).

Where some tiles' write footprints are not boxes (a triangle, syrk's ``j <= i``: the
tiles its diagonal crosses), :func:`apply_full_tiles` puts the band under a sequence:
the full tiles, register tiled as above, then the others in register tiles of one row
(a row's piece of a triangle is a box).

A sum whose reduction walks the contiguous index of every operand
(``C(m,n) +=! A(m,k) * B(n,k)``, a convolution over im2col patches, a matrix-vector
product) takes the dot-product form instead (:func:`plan_dot`): the reduction runs
innermost, with the accumulators unrolled inside it; the C compiler vectorizes an
integer one as a sum (``vpdpbusd`` for int8 on a CPU with VNNI), and a float one (rows
only) runs its chains side by side.

A byte dot product (:func:`polyc.ir.quad_dot`: ``C(m,p) +=! sum_r int32(X(q,p,r)) *
int32(W(q,m,r))`` of uint8 and int8, the four bytes of a 32-bit lane) on a CPU with
AVX-512 VNNI takes the column form with its mark's bits ending in ``q``
(:func:`_quad`); code generation then runs the tile's reduction loop as one call of a
``vpdpbusd`` micro-kernel, its shape from :func:`quad_shape`, its reductions untiled so
that the copy-out can run the requantization (:func:`epilogue_of`).

Register tile sizes come from the machine (:func:`machine_shape`): as many rows as its
vector registers hold without spilling, AVX-512 ``6 x 64`` float32 / int32 and ``6 x 32``
float64 / int64 (the vector loop then spans four 512-bit registers per row: 24
accumulators), AVX2 ``6 x 16`` / ``6 x 8``; :func:`fit_shape` fits them to the loops.
``Options.register_tile``
overrides them (``(MR, NR)``) or turns the pass off (``False``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import islpy as isl

from .. import dtypes as D
from .. import expr as E
from ..ir import (QUAD_LANES, Kernel, Statement, access_relation, element_iterators, row_dot,
                  quad_dot)
from ..marks import REGISTER, RegisterMark, register_mark
from ..options import Options
from . import machine, tiling
from .vector import member_iterators

SIMD = "simd"

#: vectors of a register tile's row (its column loop's vectors) per vector width in bits
_ROW_VECTORS = {512: 4, 256: 2, 128: 2}


def _element_bytes(dtype: str) -> int | None:
    """Bytes of an accumulator element of ``dtype`` (it holds the type arithmetic is done
    in: float for float16, int32 for int8); None where no register tile is made."""
    d = D.get(D.get(dtype).compute)
    return d.itemsize if d.kind != "b" and d.itemsize in (4, 8) else None


@functools.lru_cache(maxsize=1)
def vector_bits() -> int:
    """The widest vector unit of this CPU (read once from /proc/cpuinfo)."""
    flags = machine.cpu_flags()
    if "avx512f" in flags:
        return 512
    if "avx2" in flags and "fma" in flags:
        return 256
    return 128


@functools.lru_cache(maxsize=1)
def vector_registers() -> int:
    """The vector registers of this CPU's widest unit: 32 with AVX-512, else 16."""
    return 32 if vector_bits() == 512 else 16


def machine_shape(dtype: str, options: Options) -> tuple[int, int] | None:
    """``(MR, NR)`` for an accumulator of ``dtype`` (None: no register tiling).

    As many rows as the vector registers hold without spilling: ``MR`` rows of ``NV``
    accumulator vectors, one row of loaded column vectors and the broadcast value
    (``MR * NV + NV + 1`` registers): 6 x 64 float32 on AVX-512 (4 vectors a row; 8 rows
    spilled five accumulators, each then loaded and stored at every step: matmul
    1.3x slower on a Sapphire Rapids class Xeon), 6 x 16 on AVX2."""
    if options.register_tile is False:
        return None
    if isinstance(options.register_tile, tuple):
        mr, nr = options.register_tile
        return int(mr), int(nr)
    size = _element_bytes(dtype)
    if size is None:
        return None
    bits = vector_bits()
    nv = _ROW_VECTORS[bits]
    return (vector_registers() - nv - 1) // nv, nv * (bits // 8 // size)


def mark_name(stmt: str, box: tuple[int, ...], init: str = "", epilogue: str = "",
              bits: int | None = None, quad: bool = False) -> str:
    """``"register:S1:8,64:512"``: the statement, its accumulator box, the vector bits
    (:mod:`polyc.marks`; code generation parses it); with
    ``init`` a fifth part ``":S0"``: the accumulator starts from the value of the
    reduction's initialisation ``S0`` (a constant), which leaves the schedule
    (:func:`first_visit_init`); with ``epilogue`` a sixth ``":S2"``: the copy-out runs
    the pointwise statement ``S2`` on the accumulator instead of storing it, and ``S2``
    leaves the schedule (:func:`epilogue_of`). ``quad`` appends ``q`` to the vector
    bits (``"512q"``): the statement is a byte dot product (:func:`polyc.ir.quad_dot`)
    whose column loop code generation writes as ``vpdpbusd`` instructions."""
    bits = vector_bits() if bits is None else bits
    return RegisterMark(stmt, tuple(box), bits, init, epilogue, quad).name


@dataclass(frozen=True)
class Plan:
    """How to register-tile one band (member positions are the band's)."""
    stmt: str
    array: str
    #: None in a byte dot product's tile of one row where the band has no row member
    #: (:func:`_quad_row`)
    u: int | None
    #: None in a dot-product tile of rows only
    v: int | None
    mr: int
    nr: int
    #: the box of the write footprint of one register tile, per array dimension
    box: tuple[int, ...]
    #: the dot-product form (:func:`plan_dot`): the reduction member run last of the
    #: reductions as the vector loop, with ``u`` (and ``v``, when there is one) unrolled
    #: inside it; None: the column form
    dot: int | None = None
    #: the column form of a byte dot product, its columns written with VNNI (:func:`_quad`)
    quad: bool = False

    def round_sizes(self, sizes: list[int]) -> list[int]:
        """Cache tile sizes rounded up to multiples of the register tile."""
        sizes = list(sizes)
        for i, r in ((self.u, self.mr), (self.v, self.nr)):
            if i is not None:
                sizes[i] = -(-sizes[i] // r) * r
        return sizes


#: a register tile's rows are the candidate member the write's innermost index walks
#: (see :func:`plan`), not just the band's last
ROWS_ALONG_WRITE = True


def plan(node: isl.ScheduleNode, kernel: Kernel, options: Options, vec: int | None) -> Plan | None:
    """Whether (and how) to register-tile the permutable band ``node`` (see the module doc)."""
    if vec is None or options.register_tile is False:
        return None
    found = _one_statement(node, kernel)
    if found is None:
        return None
    s, its = found
    flags = tiling.coincident_flags(node)
    reductions = [i for i in range(len(its)) if not flags[i]]
    write = s.write
    if not reductions or not flags[vec] or not write.is_affine or len(write.indices) < 2:
        return None
    uses = [E.free_names(ix)[0] for ix in write.indices]
    # the vector member walks the last write index only; the write ignores every reduction
    if its[vec] not in uses[-1] or any(its[vec] in x for x in uses[:-1]):
        return None
    if any(its[r] in x for r in reductions for x in uses):
        return None
    # every read of the written array is the written element itself
    for r in E.reads(s.value):
        if r.array == write.array and tuple(r.indices) != tuple(write.indices):
            return None
    vector_reads = [r for r in E.reads(s.value)
                    if r.array != write.array
                    and any(its[vec] in E.free_names(ix)[0] for ix in r.indices)]
    rows = [i for i in range(len(its)) if flags[i] and i != vec
            and any(its[i] in x for x in uses[:-1]) and its[i] not in uses[-1]]

    def indexes(i: int, r: E.Read) -> bool:
        return any(its[i] in E.free_names(ix)[0] for ix in r.indices)
    # rows that share every vector load; else (a depthwise convolution: its rows read
    # their own input pixels and share the taps' weights) rows that share one of them;
    # else (a GEMV over column blocks: each block its own weights) any rows: the
    # accumulators stay in registers across the reduction instead of being loaded and
    # stored at each step
    candidates = [i for i in rows if not any(indexes(i, r) for r in vector_reads)] or \
        [i for i in rows if not all(indexes(i, r) for r in vector_reads)] or rows
    if not candidates:
        return _quad_row(s, kernel, its, vec, uses, options)
    # of those, the one the write's innermost index walks (its rows then write runs of
    # the tile's columns: a stem over an NCHW input, band [ow, oh], wrote 14 output rows
    # one pixel each); on a tie, the last in the band
    u = max(candidates, key=lambda i: (ROWS_ALONG_WRITE and
                                       max(d for d, x in enumerate(uses) if its[i] in x), i))
    shape = machine_shape(kernel.array(write.array).dtype, options)
    if shape is None:
        return None
    mr, nr = shape
    quad = _quad(s, kernel, its[vec], options)
    if quad and options.register_tile is True:
        mr, nr = quad_shape(extent(s, kernel, its[u]), extent(s, kernel, its[vec]))
    elif options.register_tile is True:
        lanes = max(1, vector_bits() // 8 // (_element_bytes(kernel.array(write.array).dtype) or 4))
        mr, nr = fit_shape(mr, nr, lanes, extent(s, kernel, its[u]), extent(s, kernel, its[vec]))
    box = tuple(mr if its[u] in x else nr if its[vec] in x else 1 for x in uses)
    return Plan(s.name, write.array, u, vec, mr, nr, box, quad=quad)


#: a byte dot product with no row member (a batch-1 fully connected layer, ``y(m) +=!
#: x(k) * W(k,m)`` in quads) gets a tile of one row (:func:`_quad_row`; a switch for
#: measurements)
QUAD_ONE_ROW = True


def _quad_row(s: Statement, kernel: Kernel, its: list[str | None], vec: int,
              uses: list[set[str]], options: Options) -> Plan | None:
    """The one-row tile of a byte dot product whose band has no row member: each step
    of the sum broadcasts one quad of the input and ``vpdpbusd``-s it into up to four
    vectors of columns (:func:`quad_shape` with one row), the tile's sums staying in
    registers across the whole reduction. Without it gcc widens the bytes into 32-bit
    products lane by lane (ResNet-50's int8 classifier, 2048 x 1000 at batch 1, took
    0.34 ms on a Zen 4 EPYC where onnxruntime took 0.15). None where the statement is
    not such a product or the register tile is set by hand."""
    if not QUAD_ONE_ROW or options.register_tile is not True or \
            not _quad(s, kernel, its[vec], options):
        return None
    _, nr = quad_shape(1, extent(s, kernel, its[vec]))
    box = tuple(nr if its[vec] in x else 1 for x in uses)
    return Plan(s.name, s.write.array, None, vec, 1, nr, box, quad=True)


#: accumulator registers of a byte dot product's tile on AVX-512 VNNI: 24 of the 32
#: (its loaded vectors and each row's broadcast weights take the rest)
QUAD_ACCUMULATORS = 24


#: a byte dot product's tile may cover this many times the fewest lane slots, when it
#: is larger (6 x 64 over 3136 pixels, not 4 x 64: 10 loads per 24 vpdpbusd, not 8 per 16)
QUAD_COVER_SLACK = 1.05


def quad_shape(ext_u: int | None, ext_v: int | None) -> tuple[int, int]:
    """``(MR, NR)`` of a byte dot product's tile for extents ``ext_u x ext_v`` (None:
    unknown): of the tiles of up to 4 vectors a row and :data:`QUAD_ACCUMULATORS`
    vectors in all whose tiles cover at most :data:`QUAD_COVER_SLACK` times the fewest
    lane slots (a 196-pixel layer gets 1 x 16 lanes per row: 13 vectors, not 4 tiles of
    64), the largest tile (fewer loads per product), then the widest. Partial tiles are
    masked, so they cost their whole tile."""
    shapes = {}
    for nv in range(1, 5):
        nr = QUAD_LANES * nv
        for mr in range(1, min(MAX_ROWS, QUAD_ACCUMULATORS // nv) + 1):
            cover = (-(-ext_u // mr) * mr if ext_u else mr) * \
                (-(-ext_v // nr) * nr if ext_v else nr)
            shapes[(mr, nr)] = cover if ext_u and ext_v else 0
    least = min(shapes.values())
    return min((shape for shape, cover in shapes.items() if cover <= least * QUAD_COVER_SLACK),
               key=lambda sh: (-sh[0] * sh[1], -sh[1], shapes[sh]))


def _quad(s: Statement, kernel: Kernel, lane: str, options: Options) -> bool:
    """Whether the column loop of ``s`` along ``lane`` is written with ``vpdpbusd``: a
    C target on a CPU with 512-bit AVX-512 VNNI, ``s`` a byte dot product
    (:func:`polyc.ir.quad_dot`) writing ``lane`` as its last index, over a box domain
    (so every row and reduction step of a tile starts its columns where the tile does)."""
    if options.target != "c" or not machine.has_vnni512():
        return False
    if s.write.indices[-1] != E.Index(lane) or quad_dot(s, kernel, lane) is None:
        return False
    dom = s.domain.intersect_params(kernel.context)
    if dom.n_basic_set() != 1:
        return False
    n = dom.dim(isl.dim_type.set)
    flat = [c for c in dom.get_basic_set_list().get_at(0).get_constraints()
            if sum(not c.get_coefficient_val(isl.dim_type.set, i).is_zero()
                   for i in range(n)) > 1]
    return not flat


#: dot-product register tiles (rows x columns of accumulators) per vector width in bits
_DOT_SHAPES = {512: (6, 4), 256: (2, 4), 128: (2, 2)}
#: a float rows-only dot tile that the C target sums on in-register transposes
#: (``polyc.ir.row_dot``) takes :data:`MAX_ROWS` rows, whole vectors of them
ROW_VECTORS = True
#: architectural vector registers per vector width (AVX-512: 32 zmm; AVX2, SSE: 16)
_VECTOR_REGISTERS = {512: 32, 256: 16, 128: 16}


def plan_dot(node: isl.ScheduleNode, kernel: Kernel, options: Options, r: int) -> Plan | None:
    """The dot-product form of a register tile, for a sum whose reduction member
    ``r`` walks the last (contiguous) index of every read it appears in -- a matmul with
    both operands contiguous along the reduction (``C(m,n) +=! A(m,k) * B(n,k)``), or a
    convolution over im2col patches::

        band [m, n, k]         ==>   band [m - m%MR, n - n%NR]
                                       mark "register:S1:6,4:512"
                                         band [k]       (the vector loop: gcc's dot product)
                                           band [m, n]  (both fully unrolled)

    The ``MR x NR`` accumulators are independent reductions over ``k``; the C compiler
    vectorizes the ``k`` loop into one vector accumulator each (on a CPU with VNNI, int8
    products become ``vpdpbusd``) and sums the lanes once per tile. ``u`` and ``v`` are
    coincident members indexing two dimensions of the write and two different reads, so
    each loaded vector serves ``MR`` or ``NR`` products; where no such pair exists (a
    matrix-vector product ``y(i) +=! A(i,j) * x(j)``) the tile has rows only (``v`` is
    None).

    A float sum keeps its order (gcc does not reassociate it: with one reduction member,
    each accumulator adds its terms in ``k`` order, bit for bit as the untiled loop; with
    several, as any reduction tiling orders them) and stays scalar; it gets the
    rows-only tile, whose ``MR`` independent chains run side by side instead of one
    after another (PolyBench's gesummv 1.6x faster than gcc's loop, from 0.6x). Its
    two-sided tile measured slower than the untiled loop (syrk 0.75x vs 1.17x of gcc),
    so a float sum never gets one."""
    if options.register_tile is False or not options.vectorize:
        return None
    found = _one_statement(node, kernel)
    if found is None:
        return None
    s, its = found
    flags = tiling.coincident_flags(node)
    write = s.write
    dtype = D.get(kernel.array(write.array).dtype)
    if flags[r] or s.op != "+" or dtype.kind not in "iuf" or dtype.itemsize not in (4, 8) \
            or not write.is_affine or not write.indices:
        return None
    uses = [E.free_names(ix)[0] for ix in write.indices]
    if any(its[r] in x for x in uses):
        return None
    reads = [a for a in E.reads(s.value) if a.array != write.array]
    if any(a.array == write.array and tuple(a.indices) != tuple(write.indices)
           for a in E.reads(s.value)):
        return None
    walked = [a for a in reads if any(its[r] in E.free_names(ix)[0] for ix in a.indices)]
    if not walked or not all(E.unit_last(a.indices, its[r]) for a in walked):
        return None

    def served(i: int) -> set[int]:
        return {j for j, a in enumerate(walked)
                if any(its[i] in E.free_names(ix)[0] for ix in a.indices)}
    cols = [i for i in range(len(its)) if flags[i] and served(i)
            and sum(its[i] in x for x in uses) == 1]
    pairs = [(u, v) for v in reversed(cols) for u in reversed(cols)
             if u != v and not served(u) & served(v)
             and next(d for d, x in enumerate(uses) if its[u] in x)
             != next(d for d, x in enumerate(uses) if its[v] in x)]
    if pairs and dtype.kind != "f":
        u, v = pairs[0]
    elif cols:  # rows only (a matrix-vector product): v = None
        u, v = cols[-1], None
    else:
        return None
    ext_u = extent(s, kernel, its[u])
    ext_v = extent(s, kernel, its[v]) if v is not None else 1
    if isinstance(options.register_tile, tuple):
        shape = tuple(int(x) for x in options.register_tile)
        mr, nr = fit_registers(shape[0], shape[1] if v is not None else 1)
        mr = max(1, min(mr, ext_u or mr))
        nr = max(1, min(nr, ext_v or nr))
    elif v is None and ROW_VECTORS and options.target == "c" and vector_bits() >= 256 and \
            row_dot(s, kernel, its[u], its[r]) is not None:
        # rows only, summed on in-register transposes (polyc.codegen.c_family): the
        # accumulators are vectors of rows, not one register each; whole vectors of
        # rows, the last tile partial (a 7-row tile of 203 rows took a whole transpose)
        mr, nr = min(MAX_ROWS, ext_u or MAX_ROWS), 1
    elif v is None and not ext_u:  # rows only, sizes unknown: as many rows as fit
        mr, nr = fit_registers(MAX_ROWS, 1)
    else:
        mr, nr = dot_shape(ext_u, ext_v)
    if v is None:
        nr = 1
    if mr * nr == 1:  # one accumulator: nothing to gain over the plain loop
        return None
    box = tuple(mr if its[u] in x else nr if v is not None and its[v] in x else 1
                for x in uses)
    return Plan(s.name, write.array, u, v, mr, nr, box, dot=r)


def fit_registers(mr: int, nr: int) -> tuple[int, int]:
    """``mr x nr`` shrunk until its accumulators (each a whole vector register in the dot
    form; a column-form shape such as the tuner's 8 x 64 counts lanes) and one operand
    vector of each row fit the CPU's vector registers."""
    regs = _VECTOR_REGISTERS[vector_bits()]
    mr, nr = max(1, mr), max(1, nr)
    while mr * nr + min(mr, nr) + 1 > regs and mr * nr > 1:
        if mr >= nr:
            mr -= 1
        else:
            nr -= 1
    return mr, nr


#: the cost of an accumulator of a partial register tile against one of a full tile:
#: partial tiles keep bound checks, and where those fall inside the reduction loop the C
#: compiler leaves it scalar
PARTIAL_TILE_COST = 8


def dot_shape(ext_u: int | None, ext_v: int | None) -> tuple[int, int]:
    """The dot-product tile for extents ``ext_u x ext_v`` (None: unknown): of the shapes
    that fit the registers (:func:`fit_registers`), the cheapest -- per tile its
    accumulators plus half its operand loads, an accumulator of a partial tile
    :data:`PARTIAL_TILE_COST` times one of a full tile -- preferring the larger tile on
    ties. A 64-channel conv over 14 columns gets ``2 x 14``, not ``6 x 4`` with a scalar
    corner of 4 x 2 (extents without a fitting divisor, primes, still get partial tiles).
    Unknown extents get the machine's default."""
    default = _DOT_SHAPES[vector_bits()]
    if not ext_u or not ext_v:
        mr, nr = default
        return max(1, min(mr, ext_u or mr)), max(1, min(nr, ext_v or nr))
    best = None
    for mr in range(1, min(ext_u, MAX_ROWS) + 1):
        for nr in range(1, min(ext_v, MAX_ROWS) + 1):
            if fit_registers(mr, nr) != (mr, nr):
                continue
            fu, fv = ext_u // mr, ext_v // nr
            cost = fu * fv * (mr * nr + (mr + nr) / 2)
            partial = ext_u * ext_v - fu * fv * mr * nr
            cost += partial * PARTIAL_TILE_COST
            key = (cost, -mr * nr)
            if best is None or key < best[0]:
                best = (key, (mr, nr))
    return best[1] if best else default


def _one_statement(node: isl.ScheduleNode, kernel: Kernel
                   ) -> tuple[Statement, list[str]] | None:
    """The statement of a permutable band over one statement, and the iterator each
    member equals; None for another band."""
    dom = node.get_domain()
    if not node.band_get_permutable() or dom.n_set() != 1:
        return None
    its = []
    for i in range(node.band_n_member()):
        found = list(member_iterators(node, i).values())
        if len(found) != 1 or found[0] is None:
            return None
        its.append(found[0])
    return kernel.statement(dom.get_set_list().get_at(0).get_tuple_name()), its


#: the most unrolled rows of a register tile (a one-vector-wide tile could take more)
MAX_ROWS = 16


def fit_shape(mr: int, nr: int, lanes: int, ext_u: int | None,
              ext_v: int | None) -> tuple[int, int]:
    """The machine's ``MR x NR`` tile fitted to the extents of its row and column loops
    (None: unknown). Columns shrink to the vectors the column extent fills (a 32-channel
    layer gets 2 vectors, not 4); the registers this frees go to rows (up to
    :data:`MAX_ROWS`; the machine's shape is taken as using all its registers, ``MR * NV
    + NV + 1``). Rows are then the count that needs the fewest tiles, preferring one that
    divides the extent (no partial tile), then the larger; one row more than the
    registers hold is a candidate where it divides the extent (one accumulator spilled
    costs less than a partial tile: ResNet's widths 7, 14, 28, 56 get 7 rows)."""
    nv = max(1, nr // lanes)
    registers = mr * nv + nv + 1
    if ext_v is not None and ext_v < nr:
        nr = max(lanes, -(-ext_v // lanes) * lanes)
    nv = max(1, nr // lanes)
    cap = max(1, min(MAX_ROWS, (registers - nv - 1) // nv))
    if ext_u is None:
        return min(mr, cap), nr
    rows = list(range(1, cap + 1))
    if cap < MAX_ROWS and ext_u % (cap + 1) == 0:
        rows.append(cap + 1)
    best = min(rows, key=lambda r: (-(-ext_u // r), ext_u % r != 0, -r))
    return best, nr


def bounds(s: Statement, kernel: Kernel, it: str) -> tuple[int, int] | None:
    """The least and the greatest value of iterator ``it`` of ``s``, when the sizes are
    fixed (None otherwise, or where ``s`` runs nothing)."""
    if len(kernel.fixed_sizes) != len(kernel.sizes) or it not in s.iterators:
        return None
    dom = s.domain.intersect_params(kernel.context)
    dom = dom.project_out(isl.dim_type.param, 0, dom.dim(isl.dim_type.param))
    if dom.is_empty():
        return None
    i = s.iterators.index(it)
    lo, hi = dom.dim_min_val(i), dom.dim_max_val(i)
    if not (lo.is_int() and hi.is_int()):
        return None
    return lo.to_python(), hi.to_python()


def extent(s: Statement, kernel: Kernel, it: str) -> int | None:
    """The number of values iterator ``it`` of ``s`` takes, when the sizes are fixed."""
    b = bounds(s, kernel, it)
    return None if b is None else max(0, b[1] - b[0] + 1)


def _val(v: int) -> isl.Val:
    # an explicit isl.Val: islpy converts a Python int by trying overloads, which throws
    # (and is caught) in C++ -- fatal under an LD_PRELOADed AddressSanitizer
    return isl.Val.int_from_si(isl.DEFAULT_CONTEXT, v)


def _upa_band(upas: list[isl.UnionPwAff]) -> isl.MultiUnionPwAff:
    mupa = isl.MultiUnionPwAff.from_union_pw_aff(upas[0])
    for upa in upas[1:]:
        mupa = mupa.flat_range_product(isl.MultiUnionPwAff.from_union_pw_aff(upa))
    return mupa


def _strip(upa: isl.UnionPwAff, size: int) -> isl.UnionPwAff:
    """``size * floor(upa / size)``: the first point of ``upa``'s register tile."""
    val = isl.Val.int_from_si(upa.get_ctx(), size)
    return upa.scale_down_val(val).floor().scale_val(val)


def _insert_band(node: isl.ScheduleNode, upas: list[isl.UnionPwAff],
                 coincident: list[bool]) -> isl.ScheduleNode:
    node = node.insert_partial_schedule(_upa_band(upas)).band_set_permutable(1)
    for i, c in enumerate(coincident):
        node = node.band_member_set_coincident(i, int(c))
    return node


def apply(node: isl.ScheduleNode, p: Plan, kernel: Kernel) -> isl.ScheduleNode | None:
    """Register-tile the point band ``node`` by plan ``p``; the node at the same position
    (the register tile band), or None when a safety check fails (``node`` is unchanged)."""
    top = _register_tree(node, p)
    if check_mark(top.child(0), kernel, budgeted=True) is not None:
        return None
    return _finish(top, p, kernel, node.band_n_member(), tiling.coincident_flags(node))


#: the tiles that are not full take register tiles of one row (:func:`apply_full_tiles`)
PARTIAL_TILES_BY_ROWS = True
#: where some register tiles' write footprints are not boxes (a triangle's diagonal),
#: the full tiles alone are register-tiled (:func:`apply_full_tiles`)
FULL_TILES_APART = True


def apply_full_tiles(node: isl.ScheduleNode, p: Plan, kernel: Kernel
                     ) -> tuple[isl.ScheduleNode, bool] | None:
    """Where :func:`apply` fails because some tiles' footprints are not boxes (syrk's
    ``j <= i``: the tiles the diagonal crosses hold a triangle), the point band ``node``
    under a sequence of two filters: the points of the full ``MR x NR`` tiles, register
    tiled, then the others, in register tiles of one row where those are boxes (a row's
    piece of a triangle is), else their band left as it was (the caller then marks its
    vector loop). The sequence node (at ``node``'s position) and whether the others
    were register tiled, or None (``node`` unchanged).

    Legal because every dependence among the band's points joins two points of one
    element: the band has one statement, which writes one array at an element none of
    the reductions index and reads that array only at that element (:func:`plan`), so
    splitting the points by element keeps each element's points in their order. Syrk
    (float, 1200 x 1000, one thread) ran its triangle at 37 GFLOP/s without register
    tiles; the diagonal tiles are 6% of its points."""
    if not FULL_TILES_APART or p.v is None or p.quad or p.dot is not None:
        return None
    top = _register_tree(node, p)
    flags = tiling.coincident_flags(node)
    coincident = [i for i in range(len(flags)) if flags[i]]
    full = _full_tiles(top, p, coincident.index(p.u), coincident.index(p.v))
    prefix = top.child(0).get_prefix_schedule_union_map()
    inside = prefix.intersect_range(isl.UnionSet.from_set(full)).domain()
    domain = node.get_domain()
    inside = inside.intersect(domain)
    rest = domain.subtract(inside)
    if inside.is_empty() or rest.is_empty():
        return None
    filters = isl.UnionSetList.alloc(node.get_ctx(), 2).add(inside).add(rest)
    seq = node.insert_sequence(filters)
    tiled = apply(seq.child(0).child(0), p, kernel)
    if tiled is None:
        return None
    seq = tiled.parent().parent()
    # one row: the vector member walks the write's last index only, the rows the others
    row = replace(p, mr=1, box=(1,) * (len(p.box) - 1) + p.box[-1:])
    rest = apply(seq.child(1).child(0), row, kernel) if PARTIAL_TILES_BY_ROWS else None
    return (seq, False) if rest is None else (rest.parent().parent(), True)


def _register_tree(node: isl.ScheduleNode, p: Plan) -> isl.ScheduleNode:
    """The register tile band, its mark, the reductions and the unrolled rows in place of
    the point band ``node`` (unchecked); the register tile band."""
    n = node.band_n_member()
    flags = tiling.coincident_flags(node)
    mupa = node.band_get_partial_schedule()
    upas = [mupa.get_union_pw_aff(i) for i in range(n)]
    outer = [_strip(upas[i], p.mr) if i == p.u else _strip(upas[i], p.nr) if i == p.v
             else upas[i] for i in range(n) if flags[i]]
    # the dot form runs its vector reduction innermost of the reductions
    reductions = [upas[i] for i in range(n) if not flags[i] and i != p.dot] + \
        ([upas[p.dot]] if p.dot is not None else [])
    leaf = node.delete()
    tiled = [i for i in (p.u, p.v) if i is not None]
    inner = _insert_band(leaf, [upas[i] for i in tiled], [True] * len(tiled))
    # unrolled: a dot tile's rows and columns, a column tile's rows (none in one row)
    unrolled = len(tiled) if p.dot is not None else int(p.u is not None)
    for i in range(unrolled):
        inner = inner.band_member_set_ast_loop_type(i, isl.ast_loop_type.unroll)
    red = _insert_band(inner, reductions, [False] * len(reductions))
    mark = red.insert_mark(isl.Id(mark_name(p.stmt, p.box, quad=p.quad)))
    return _insert_band(mark, outer, [True] * len(outer))


def _finish(top: isl.ScheduleNode, p: Plan, kernel: Kernel, n: int,
            flags: list[bool]) -> isl.ScheduleNode:
    """The checked register tree ``top`` with its initialisation and epilogue in the mark,
    its full tiles isolated and its vector loop marked."""
    init = first_visit_init(top.child(0), kernel, top.get_schedule().get_map())
    if init:
        renamed = top.child(0).delete().insert_mark(
            isl.Id(mark_name(p.stmt, p.box, init, quad=p.quad)))
        top = renamed.parent()
        epilogue = epilogue_of(top.child(0), kernel)
        if epilogue:
            renamed = top.child(0).delete().insert_mark(
                isl.Id(mark_name(p.stmt, p.box, init, epilogue, quad=p.quad)))
            top = renamed.parent()
    coincident = [i for i in range(n) if flags[i]]
    full = _full_tiles(top, p, None if p.u is None else coincident.index(p.u),
                       None if p.v is None else coincident.index(p.v))
    top = top.band_set_ast_build_options(
        tiling.isolate_option(full, top.get_schedule_depth()))
    if p.dot is not None:  # no simd loop: the C compiler vectorizes the reduction
        return top
    # the simd mark on the column loop (split off the unrolled rows; a one-row tile's
    # band is the column loop alone)
    depth = top.get_tree_depth()
    node = tiling.split_last(top.child(0).child(0).child(0)).insert_mark(isl.Id(SIMD))
    while node.get_tree_depth() > depth:
        node = node.parent()
    return node


def check_mark(mark: isl.ScheduleNode, kernel: Kernel, budgeted: bool = False
               ) -> str | None:
    """Why the ``register`` mark at ``mark`` is unsafe, or None when it is safe: only
    its statement runs below it, every access of that statement to the array is the
    written element, and the elements written in one iteration of the loops above form
    exactly a box no larger than the mark's (so the copy-out writes only what the
    statement computed, and the accumulator holds it). ``budgeted``: the box test gets
    :data:`FOOTPRINT_OPERATIONS` isl operations, and a mark it cannot decide within them
    is unsafe (the band then keeps no register tile)."""
    parsed = parse_mark(mark.mark_get_id().get_name())
    if parsed is None:
        return "malformed register mark"
    stmt, box = parsed
    dom = mark.get_domain()
    names = {dom.get_set_list().get_at(i).get_tuple_name() for i in range(dom.n_set())}
    if names != {stmt} or stmt not in {s.name for s in kernel.statements}:
        return f"the statements below it are {sorted(names)}, not just {stmt}"
    s = kernel.statement(stmt)
    if len(box) != len(s.write.indices) or not s.write.is_affine:
        return f"its box {box} does not fit the write of {stmt}"
    if any(r.array == s.write.array and tuple(r.indices) != tuple(s.write.indices)
           for r in E.reads(s.value)):
        return f"{stmt} reads {s.write.array} elsewhere than where it writes"
    if not _footprint_is_box(mark, s, box, kernel,
                             FOOTPRINT_OPERATIONS if budgeted else None):
        return f"the elements of {s.write.array} written below it do not form a box of {box}"
    init = mark_init(mark.mark_get_id().get_name())
    if init and first_visit_init(mark, kernel, mark.get_schedule().get_map()) != init:
        return f"its accumulator may not start from {init}'s value"
    epilogue = mark_epilogue(mark.mark_get_id().get_name())
    if epilogue and epilogue_of(mark, kernel) != epilogue:
        return f"its copy-out may not run {epilogue}"
    return None


def parse_mark(name: str) -> tuple[str, tuple[int, ...]] | None:
    """``("S1", (8, 64))`` for the mark ``"register:S1:8,64:512"`` (or ``...:512:S0``);
    None for others."""
    m = register_mark(name)
    return None if m is None else (m.stmt, m.box)


def mark_quad(name: str) -> bool:
    """Whether a register mark's statement is a byte dot product written with VNNI."""
    m = register_mark(name)
    return m is not None and m.quad


def mark_init(name: str) -> str:
    """The initialisation statement a register mark's accumulator starts from, or ""."""
    m = register_mark(name)
    return "" if m is None else m.init


def mark_epilogue(name: str) -> str:
    """The statement a register mark's copy-out runs (:func:`epilogue_of`), or ""."""
    m = register_mark(name)
    return "" if m is None else m.epilogue


def dropped_inits(schedule: isl.Schedule) -> set[str]:
    """The statements that register marks of ``schedule`` start from or end with (run
    by the marks' code, not scheduled themselves)."""
    found: set[str] = set()

    def visit(node: isl.ScheduleNode) -> bool:
        if node.get_type() == isl.schedule_node_type.mark:
            name = node.mark_get_id().get_name()
            found.update(s for s in (mark_init(name), mark_epilogue(name)) if s)
        return True
    schedule.get_root().foreach_descendant_top_down(visit)
    return found


def register_marks(schedule: isl.Schedule) -> list[str]:
    """The names of the register marks of ``schedule``."""
    found: list[str] = []

    def visit(node: isl.ScheduleNode) -> bool:
        if node.get_type() == isl.schedule_node_type.mark and \
                parse_mark(node.mark_get_id().get_name()) is not None:
            found.append(node.mark_get_id().get_name())
        return True
    schedule.get_root().foreach_descendant_top_down(visit)
    return found


#: the element indices of a register tile's array, as the epilogue's iterators see them
#: (code generation names them so: :func:`polyc.codegen.c_family`)
ELEMENT = "polyc_i"


def epilogue_of(mark: isl.ScheduleNode, kernel: Kernel) -> str:
    """The statement ``S2`` the copy-out of the register ``mark`` may run on its
    accumulator instead of storing it, or "".

    Below the mark the reduction ``S`` sums into the temporary ``A``, starting from its
    initialisation's constant (so every element is complete when its tile is copied
    out: :func:`first_visit_init`). ``S2`` qualifies when it is a plain assignment to an
    array ``W`` of ``A``'s type (no conversion: a requantization to int8 ran slower at
    the copy-out of a dot-product tile than in its own pass; a byte dot product's tile,
    :func:`mark_quad`, takes one), the only statement besides ``S`` (and its
    initialisation) that touches ``A``, and the only one that writes ``W``, one element
    per instance, which no statement before ``S2`` reads; it reads ``A`` at one
    element, a one-to-one image of its instance whose
    inverse :func:`polyc.ir.element_iterators` gives (``yt(n, h, w, m / 64, m % 64)``:
    ``m = 64*e3 + e4``), over exactly the elements ``S`` writes; and everything else it
    reads, no statement writes (the kernel's inputs). Then ``S2`` running at each
    element's copy-out computes what it computed in its own loop nest after ``S``, and
    ``A`` is never stored: one pass over it fewer, out of the cache the tile is in."""
    name = mark.mark_get_id().get_name()
    parsed = parse_mark(name)
    if parsed is None or not mark_init(name):
        return ""
    s = kernel.statement(parsed[0])
    a = kernel.array(s.write.array)
    if a.role != "temp":
        return ""
    touching = [t for t in kernel.statements if t.name != s.name and t.kind != "init"
                and (t.write.array == a.name or any(r.array == a.name for r in t.reads))]
    if len(touching) != 1:
        return ""
    e = touching[0]
    if e.op != "=" or e.write.array == a.name or not e.write.is_affine:
        return ""
    out_dtype = kernel.array(e.write.array).dtype
    if out_dtype != a.dtype and not mark_quad(name) \
            and not (D.get(out_dtype).storage_only and D.get(out_dtype).compute == a.dtype) \
            and not (a.dtype == "float32" and e.op == "=" and
                     E.clamped_narrowing(e.value, out_dtype) is not None):
        # a conversion (int32 sums requantized to uint8 in double) ran 7% slower at the
        # copy-out of a dot-product tile than in its own vectorized pass (ResNet-50 int8);
        # a byte dot product's column tile saves its sums' passes over memory, and a
        # float16 store (the float32 sums rounded, a few bit operations) its own pass
        # over them (ResNet-50 float16: each residual block's sums went through memory),
        # and so does a float32 tile clamped into bytes (the exact float sums of a
        # quantized convolution, requantized in float: ResNet-50 int8 on AVX2)
        return ""
    order = [t.name for t in kernel.statements]
    written = {t.write.array for t in kernel.statements}
    if any(t.write.array == e.write.array and t.name != e.name for t in kernel.statements):
        return ""
    if any(r.array == e.write.array for t in kernel.statements[:order.index(e.name)]
           for r in t.reads):
        return ""
    reads = E.reads(e.value)
    mine = [r for r in reads if r.array == a.name]
    if not mine or any(tuple(r.indices) != tuple(mine[0].indices) for r in mine) or             any(r.array in written for r in reads if r.array != a.name):
        return ""
    ctx = kernel.context
    element = tuple(E.Index(f"{ELEMENT}{d}") for d in range(a.rank))
    if element_iterators(tuple(mine[0].indices), e.iterators, element,
                         e.domain.intersect_params(ctx)) is None:
        return ""
    r = access_relation(e.domain, a.name, tuple(mine[0].indices), a.shape).intersect_params(ctx)
    w = s.write.relation(s.domain).intersect_params(ctx)
    if not r.is_injective() or not r.range().is_equal(w.range()):
        return ""
    # its instances write distinct elements: running them inside the reduction's
    # (maybe parallel) loops adds no dependence between those loops' iterations
    out = access_relation(e.domain, e.write.array, tuple(e.write.indices),
                          kernel.array(e.write.array).shape).intersect_params(ctx)
    if not out.is_injective():
        return ""
    return e.name


def first_visit_init(mark: isl.ScheduleNode, kernel: Kernel, schedule_map: isl.UnionMap) -> str:
    """The init statement ``S0`` whose constant the accumulator of the register ``mark``
    may start from instead of loading the array -- after which ``S0`` is dead -- or "".

    Below the mark runs the reduction ``S`` (writing ``A``). ``S0`` may be dropped when
    ``S0`` (``kind == "init"``, a constant value) and ``S`` are the only statements that
    write ``A``; every element ``S0`` writes, ``S`` writes too; all the updates of one
    element run in one instance of the mark (the schedule above the mark maps each
    element to one point: the reduction is not tiled above it); and every other
    statement reading ``A`` reads an element after the last update of it in
    ``schedule_map`` (the full schedule). Then the first visit of an element would have
    loaded ``S0``'s constant, and nothing else reads what ``S0`` wrote."""
    parsed = parse_mark(mark.mark_get_id().get_name())
    if parsed is None:
        return ""
    s = kernel.statement(parsed[0])
    a = s.write.array
    if not s.is_reduction or not s.write.is_affine:
        return ""
    writers = [t for t in kernel.statements if t.write.array == a]
    inits = [t for t in writers if t.kind == "init"]
    if len(inits) != 1 or {t.name for t in writers} != {s.name, inits[0].name}:
        return ""
    s0 = inits[0]
    if s0.op != "=" or not s0.write.is_affine or E.reads(s0.value):
        return ""
    ctx = kernel.context
    w = s.write.relation(s.domain).intersect_params(ctx)
    w0 = s0.write.relation(s0.domain).intersect_params(ctx)
    if not w0.range().is_subset(w.range()):
        return ""
    prefix = mark.get_prefix_schedule_union_map().intersect_params(ctx).intersect_domain(
        isl.UnionSet.from_set(s.domain))
    if not isl.UnionMap.from_map(w).reverse().apply_range(prefix).is_single_valued():
        return ""
    updates = isl.UnionMap.from_map(w).reverse()  # A[e] -> S[i]
    smap = schedule_map.intersect_params(ctx)
    later = None  # schedule points -> the earlier ones (computed once, when needed)
    for r_stmt in kernel.statements:
        if r_stmt.name == s.name:
            continue
        for acc in r_stmt.reads:
            if acc.array != a:
                continue
            if not acc.is_affine:
                return ""
            pairs = isl.UnionMap.from_map(acc.relation(r_stmt.domain).intersect_params(ctx)) \
                .apply_range(updates)  # R[j] -> S[i] on one element
            times = pairs.apply_domain(smap).apply_range(smap)  # t(R[j]) -> t(S[i])
            if times.is_empty():
                continue
            if later is None:
                later = smap.range().lex_gt_union_set(smap.range())
            if not times.is_subset(later):
                return ""
    return s0.name


#: isl operations the box test of a register mark may take when it decides whether to
#: place the mark (:func:`check_mark`): ten times the most that the marks of matmuls,
#: PolyBench's nests and the benchmark models' layers (ResNets, MobileNetV2, BERT, int8,
#: float16) were measured to need (92,046: MobileNetV2's stem conv; about 0.06 s). Fuzz
#: case 16003's accesses ``j / 2`` and ``2 * s + i`` under a skewed schedule took 29 s in
#: six tests, and 65 s to compile in all; 28 s with the budget (its dependences: 15 s)
FOOTPRINT_OPERATIONS = 1_000_000


def _footprint_is_box(mark: isl.ScheduleNode, s: Statement, box: tuple[int, ...],
                      kernel: Kernel, budget: int | None = None) -> bool:
    """Whether the elements ``s`` writes in one iteration of the loops above ``mark``
    form a box of at most ``box`` (:func:`check_mark`); with ``budget``, computed in an
    isl context of its own with that many operations, and False past them."""
    prefix = mark.get_prefix_schedule_union_map().intersect_params(kernel.context)
    write = isl.UnionMap.from_map(s.write.relation(s.domain))
    if budget is None:
        return _is_box(prefix, write, box)
    private = isl.Context()
    try:
        own = (isl.UnionMap.read_from_str(private, prefix.to_str()),
               isl.UnionMap.read_from_str(private, write.to_str()))
    except isl.Error:  # a text isl cannot read back: decided in the kernel's context
        return _is_box(prefix, write, box)
    private.set_max_operations(budget)
    private.reset_operations()
    try:
        return _is_box(*own, box)
    except isl.Error as e:
        if "maximal number of operations" not in str(e):
            raise
        return False  # undecided within the budget: no register tile


def _is_box(prefix: isl.UnionMap, write: isl.UnionMap, box: tuple[int, ...]) -> bool:
    fp_u = prefix.reverse().apply_range(write)
    if fp_u.n_map() != 1:
        return False
    fp = fp_u.get_map_list().get_at(0)
    one, minus_one = isl.Val.int_from_si(fp.get_ctx(), 1), isl.Val.int_from_si(fp.get_ctx(), -1)
    rank = fp.dim(isl.dim_type.out)
    fp = fp.reset_tuple_id(isl.dim_type.out)
    product = None
    for d in range(rank):
        proj = fp.project_out(isl.dim_type.out, d + 1, rank - d - 1).project_out(
            isl.dim_type.out, 0, d)
        lo = isl.Map.from_pw_multi_aff(proj.lexmin_pw_multi_aff())
        hi = isl.Map.from_pw_multi_aff(proj.lexmax_pw_multi_aff())
        space = isl.Space.alloc(fp.get_ctx(), 0, 1, 1)
        ge = isl.Map.universe(space)
        ge = ge.add_constraint(isl.Constraint.alloc_inequality(isl.LocalSpace.from_space(space))
                               .set_coefficient_val(isl.dim_type.out, 0, one)
                               .set_coefficient_val(isl.dim_type.in_, 0, minus_one))
        interval = lo.apply_range(ge).intersect(hi.apply_range(ge.reverse()))
        if not interval.is_equal(proj):
            return False  # a hole or a stride in this dimension
        spread = proj.reverse().apply_range(proj).deltas()
        limit = isl.Set.universe(spread.get_space())
        limit = limit.add_constraint(isl.Constraint.alloc_inequality(isl.LocalSpace.from_space(
            spread.get_space())).set_coefficient_val(isl.dim_type.set, 0, minus_one)
            .set_constant_val(isl.Val.int_from_si(fp.get_ctx(), box[d] - 1)))
        if not spread.is_subset(limit):
            return False
        product = proj if product is None else product.flat_range_product(proj)
    return product is not None and product.is_equal(fp)


def _full_tiles(top: isl.ScheduleNode, p: Plan, iu: int | None, iv: int | None
                ) -> isl.Set:
    """The register tiles (values of the schedule above and of the register tile band
    ``top``) whose ``MR x NR`` rows and columns all exist."""
    d = top.get_schedule_depth()
    r = top.band_n_member()
    q = top.child(0).child(0).band_n_member()
    leaf = top.child(0).child(0).child(0).child(0)
    flat = leaf.get_prefix_schedule_union_map().intersect_domain(leaf.get_domain())
    # [prefix(d), tiles(r), reductions(q), u, v] (no v in a rows-only dot tile, no u in
    # a one-row byte tile)
    pts = flat.range().get_set_list().get_at(0)
    pts = pts.project_out(isl.dim_type.set, d + r, q)
    have = isl.Map.from_range(pts).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, d + r)
    present = [(at, size) for at, size in ((iu, p.mr), (iv, p.nr)) if at is not None]
    blocks = [(out, d + at, 1, size) for out, (at, size) in enumerate(present)]
    return tiling.full_blocks(have, blocks).reset_tuple_id()


