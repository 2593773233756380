"""Static planning of a model's intermediate buffers into one arena.

Every temporary buffer of a :class:`polyc.program.Program` lives from the first step
that touches it to the last one (a view extends the lifetime of its root: it *is* the
root's storage). Two temporaries whose lifetimes overlap must not share bytes; two that
never meet may. The plan gives each temporary root an offset in one arena::

    step:     0    1    2    3    4
    t0        [=========]                   offset 0
    t1             [=========]              offset 256   (meets t0 at step 1)
    t2                       [=========]    offset 0     (t0 is dead by step 3)

Offsets come from a greedy best fit (largest buffers first, each into the smallest gap
between the placed buffers it meets, as in TFLite's "greedy by size" planner), every
offset and size rounded up to :data:`ALIGN` bytes. ``arena_bytes`` is the peak the plan
needs; ``temp_bytes`` is what one allocation per temporary would need; ``lower_bound``
is the most bytes alive at any one step (no plan can do better).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: alignment of every arena offset and of every weight in the weights file (bytes)
ALIGN = 64


def round_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


@dataclass(frozen=True)
class Interval:
    """A buffer of ``size`` bytes alive from step ``first`` to step ``last`` (inclusive)."""
    name: str
    size: int
    first: int
    last: int

    def meets(self, other: Interval) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class MemoryPlan:
    """Arena offsets of the planned buffers and the sizes that describe the plan."""
    offsets: Mapping[str, int]
    intervals: tuple[Interval, ...]
    arena_bytes: int
    temp_bytes: int
    lower_bound: int

    def describe(self) -> str:
        saved = self.temp_bytes - self.arena_bytes
        return (f"arena {self.arena_bytes} bytes for {len(self.intervals)} temporaries "
                f"({self.temp_bytes} bytes unplanned, {saved} saved; "
                f"lower bound {self.lower_bound})")


def lifetimes(uses: Iterable[tuple[int, str]], sizes: Mapping[str, int]) -> list[Interval]:
    """Intervals of the buffers in ``sizes`` from ``(step, buffer)`` uses."""
    span: dict[str, list[int]] = {}
    for step, name in uses:
        if name in sizes:
            lo_hi = span.setdefault(name, [step, step])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], step), max(lo_hi[1], step)
    return [Interval(name, round_up(max(sizes[name], 1)), lo, hi)
            for name, (lo, hi) in span.items()]


def plan_memory(intervals: Iterable[Interval]) -> MemoryPlan:
    """Greedy best-fit offsets for ``intervals`` (see the module doc)."""
    todo = sorted(intervals, key=lambda b: (-b.size, b.first, b.name))
    placed: list[tuple[int, Interval]] = []
    offsets: dict[str, int] = {}
    for buf in todo:
        offset = _best_fit(buf, [(o, b) for o, b in placed if b.meets(buf)])
        offsets[buf.name] = offset
        placed.append((offset, buf))
    arena = max((o + b.size for o, b in placed), default=0)
    steps = {s for _, b in placed for s in (b.first, b.last)}
    bound = max((sum(b.size for _, b in placed if b.first <= s <= b.last) for s in steps),
                default=0)
    ordered = tuple(sorted(todo, key=lambda b: (offsets[b.name], b.first)))
    return MemoryPlan(offsets, ordered, arena, sum(b.size for b in todo), bound)


def _best_fit(buf: Interval, live: list[tuple[int, Interval]]) -> int:
    """The start of the smallest gap between ``live`` buffers that holds ``buf``, or the
    end of the highest one."""
    best, best_gap, cursor = None, None, 0
    for offset, other in sorted(live, key=lambda p: p[0]):
        gap = offset - cursor
        if gap >= buf.size and (best_gap is None or gap < best_gap):
            best, best_gap = cursor, gap
        cursor = max(cursor, offset + other.size)
    return cursor if best is None else best


def check_plan(plan: MemoryPlan) -> list[str]:
    """Pairs of planned buffers that meet in time and overlap in the arena (none in a
    correct plan); used by the tests."""
    bad = []
    items = list(plan.intervals)
    for i, a in enumerate(items):
        for b in items[i + 1:]:
            oa, ob = plan.offsets[a.name], plan.offsets[b.name]
            if a.meets(b) and oa < ob + b.size and ob < oa + a.size:
                bad.append(f"{a.name} and {b.name}")
    return bad
