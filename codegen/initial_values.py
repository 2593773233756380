"""Which arrays of a kernel must start at zero: the analysis shared by the kernel
functions (temporaries, :mod:`.c_family`) and the model library (outputs,
:mod:`.model`).

Statements run in program order (the schedule preserves every dependence, anti and
output dependences included), so it is enough to follow, statement by statement, the
set of elements written with ``=``: a read of an element outside that set reads the
array's initial value. The sets are over-approximations where they must be (a read
under ``?:`` counts, an indirect read may touch any element of its dimension) and
under-approximations for writes (an indirect write counts for nothing), so the answer
"no initial value is read" is always safe.
"""
from __future__ import annotations

import islpy as isl

from polyc.ir import Access, Kernel, Statement, array_box


def reads_before_writing(kernel: Kernel, array: str) -> bool:
    """Does ``kernel`` read some element of ``array`` before writing it with ``=`` (a
    ``+=`` without init, a ``max=`` ..., a read of an element nothing wrote)? A
    temporary needs zeroing exactly then."""
    return _follow(kernel, array)[0]


def reads_initial_values(kernel: Kernel, array: str) -> bool:
    """Does ``kernel`` read an element of its output ``array`` before writing it with
    ``=``, or leave an element unwritten? Then the caller must zero it first (outputs
    start at zero, as ``np.zeros`` in the runtime)."""
    reads, written, box = _follow(kernel, array)
    return reads or not box.is_subset(written)


def _follow(kernel: Kernel, array: str) -> tuple[bool, isl.Set, isl.Set]:
    """(an initial value is read, the elements written with ``=``, the array's box)."""
    box = array_box(kernel, array)
    written = box.subtract(box)  # empty, same space
    for s in kernel.statements:
        for r in s.reads:
            if r.array == array and not _touched(s, r, box).is_subset(written):
                return True, written, box
        if s.write.array == array and s.op == "=" and s.write.is_affine:
            written = written.union(_touched(s, s.write, box))
    return False, written, box


def _touched(s: Statement, access: Access, box: isl.Set) -> isl.Set:
    return access.relation(s.domain).range().intersect(box)
