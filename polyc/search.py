"""Search the knobs of a schedule: ``polyc.search``.

    s = op.schedule_space().tile("S1", ("m", "n"), sizes=(polyc.knob([16, 32, 64]),
                                                          polyc.knob([32, 64, 128])))
    found = polyc.search(op, s, sizes={"M": 512, "N": 512, "K": 512}, budget=60,
                         log="mm-search.jsonl")
    print(found)                      # the best candidates, and polyc's own schedule
    fast = op.with_schedule(found.best)

Candidates (combinations of knob values) are tried in the order of the strategy --
``"exhaustive"`` (in order), ``"random"`` (shuffled), ``"model"`` (the cost model below
first) -- until every one was tried or ``budget`` seconds passed. Each is replayed on the
operator (an illegal combination is logged with the dependence it breaks), compiled,
checked against polyc's own schedule on the same random inputs and timed (median of
``repeat`` runs). Every candidate is appended to the log (JSON lines: knob values, the
trace, seconds, correctness, error), which :func:`load_search_log` reads back.

The model is polyc's own: the tile sizes its band optimisation picks for these sizes on
this machine (the cache blocks of :mod:`polyc.schedule.cache_blocks`, read from the
``tile`` steps of ``op.schedule_space(sizes, auto=True)``). Candidates are sorted by how
far (a log ratio) each tile knob is from polyc's size for the same statement and loop;
a tile knob of a loop polyc does not tile falls back to a cache rule: the product of the
candidate's tile sizes, times the element size and the number of arrays, should be
about half the L2 cache (:mod:`polyc.schedule.machine` reads its size).
"""
from __future__ import annotations

import json
import math
import random
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .compare import _inputs, _runner
from .errors import CallError, PolycError, ScheduleError
from .schedule.space import Knob, ScheduleSpace, Step

STRATEGIES = ("exhaustive", "random", "model")


@dataclass(frozen=True)
class Record:
    """One candidate: its knob values, trace, median time (None when not run), whether
    its outputs matched, and why it was refused or failed."""
    values: dict[str, Any]
    trace: list[str]
    seconds: float | None
    correct: bool
    error: str = ""

    def to_json(self) -> str:
        return json.dumps({"values": self.values, "trace": self.trace,
                           "seconds": self.seconds, "correct": self.correct,
                           "error": self.error})


@dataclass(frozen=True)
class SearchResult:
    operator: str
    records: tuple[Record, ...]
    #: the operator's own schedule, timed the same way
    baseline: float
    best: ScheduleSpace | None
    best_record: Record | None
    tried: int
    total: int
    log: str | None = None
    knobs: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        lines = [f"search of {self.operator}: {self.tried} of {self.total} candidates tried; "
                 f"polyc's own schedule {self.baseline * 1e3:.3f} ms"]
        ran = sorted((r for r in self.records if r.seconds is not None and r.correct),
                     key=lambda r: r.seconds or 0.0)
        for r in ran[:10]:
            values = ", ".join(f"{k}={v}" for k, v in r.values.items())
            lines.append(f"  {r.seconds * 1e3:10.3f} ms  {self.baseline / r.seconds:6.2f}x  "
                         f"{values}")
        bad = [r for r in self.records if r.error]
        if bad:
            lines.append(f"  {len(bad)} refused or failed, e.g. "
                         f"{', '.join(f'{k}={v}' for k, v in bad[0].values.items())}: "
                         f"{bad[0].error.splitlines()[0][:160]}")
        if self.log:
            lines.append(f"  log: {self.log}")
        return "\n".join(lines)


def load_search_log(path: str) -> list[Record]:
    """The records a search wrote to ``path``."""
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                out.append(Record(d["values"], d["trace"], d["seconds"], d["correct"],
                                  d.get("error", "")))
    return out


def search(op: Any, space: ScheduleSpace, sizes: Mapping[str, int], budget: float = 60.0,
           strategy: str = "exhaustive", repeat: int = 3, log: str | None = None,
           seed: int = 0, progress: bool = True, rtol: float = 1e-4,
           atol: float = 1e-5) -> SearchResult:
    """Try the knob values of ``space`` on ``op`` (see the module doc)."""
    if strategy not in STRATEGIES:
        raise CallError(f"unknown search strategy {strategy!r}; expected one of {STRATEGIES}")
    knobs = space.knobs()
    if not knobs:
        raise ScheduleError("the schedule has no knobs to search (give a primitive "
                            "polyc.knob([...]) as an argument)")
    sizes = dict(sizes)
    missing = [s for s in op.kernel.sizes if s not in sizes]
    if missing:
        raise CallError(f"search: give the sizes {missing} of {op.kernel.name}")
    order = _order(space, knobs, strategy, seed, op, sizes)
    data = _inputs(op, sizes, {}, np.random.default_rng(seed))
    prepare, run = _runner(op, sizes, data)
    prepare()
    reference = run()
    baseline = _time(prepare, run, repeat)
    start = time.perf_counter()
    records: list[Record] = []
    best: tuple[float, ScheduleSpace, Record] | None = None
    sink = open(log, "w") if log else None  # noqa: SIM115 -- closed below
    try:
        for n, values in enumerate(order):
            if time.perf_counter() - start > budget:
                break
            named = {k.name: v for k, v in zip(knobs, values)}
            record, concrete = _try(op, space, values, named, sizes, data, reference,
                                    repeat, rtol, atol)
            records.append(record)
            if sink:
                sink.write(record.to_json() + "\n")
                sink.flush()
            if record.correct and record.seconds is not None and concrete is not None \
                    and (best is None or record.seconds < best[0]):
                best = (record.seconds, concrete, record)
            if progress:
                shown = f"best {best[0] * 1e3:.3f} ms" if best else "no candidate yet"
                print(f"\rsearch {op.kernel.name}: [{n + 1}/{len(order)}] {shown}",
                      end="", file=sys.stderr, flush=True)
    finally:
        if sink:
            sink.close()
        if progress:
            print(file=sys.stderr)
    return SearchResult(op.kernel.name, tuple(records), baseline,
                        best[1] if best else None, best[2] if best else None,
                        len(records), len(order), log, tuple(k.name for k in knobs))


def _try(op: Any, space: ScheduleSpace, values: tuple[Any, ...], named: dict[str, Any],
         sizes: dict[str, int], data: dict[str, Any], reference: list[np.ndarray],
         repeat: int, rtol: float, atol: float) -> tuple[Record, ScheduleSpace | None]:
    try:
        concrete = space.with_values(values)
    except ScheduleError as err:
        return Record(named, [], None, False, f"illegal: {err}"), None
    trace = [str(s) for s in concrete.steps]
    try:
        prepare, run = _runner(op.with_schedule(concrete), sizes, data)
        prepare()
        got = run()
    except PolycError as err:
        return Record(named, trace, None, False, f"failed: {err}"), None
    ok = all(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
             for a, b in zip(got, reference))
    if not ok:
        return Record(named, trace, None, False, "wrong result"), None
    return Record(named, trace, _time(prepare, run, repeat), True), concrete


def _time(prepare: Any, run: Any, repeat: int) -> float:
    times = []
    for _ in range(max(1, repeat)):
        prepare()
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _order(space: ScheduleSpace, knobs: tuple[Knob, ...], strategy: str, seed: int,
           op: Any, sizes: Mapping[str, int]) -> list[tuple[Any, ...]]:
    combos = list(space.candidates())
    if strategy == "random":
        random.Random(seed).shuffle(combos)
    elif strategy == "model":
        tiles = _tile_knobs(space.pending)
        positions = [i for i, k in enumerate(knobs) if any(k is t for t in tiles)]
        from .codegen.runtime import NUMPY_DTYPES
        from .schedule import machine
        itemsize = max(NUMPY_DTYPES[a.dtype].itemsize for a in op.kernel.arrays)
        target = machine.l2_bytes() / 2
        polyc_sizes = _polyc_tiles(op, sizes)
        where = _knob_loops(space.pending)
        guided = [i for i in positions if where.get(id(knobs[i])) in polyc_sizes]
        rest = [i for i in positions if i not in guided]

        def cost(values: tuple[Any, ...]) -> float:
            total = sum(abs(math.log(int(values[i]) / polyc_sizes[where[id(knobs[i])]]))
                        for i in guided)
            if rest:
                volume = 1
                for i in rest:
                    volume *= int(values[i])
                data = volume * itemsize * len(op.kernel.arrays)
                total += abs(math.log(max(data, 1) / target))
            return total
        combos.sort(key=cost)
    return combos


def _polyc_tiles(op: Any, sizes: Mapping[str, int]) -> dict[tuple[str, str], int]:
    """(statement, loop) -> the tile size polyc's band optimisation gives that loop for
    these sizes (the ``tile`` steps of its automatic schedule); empty when it has none."""
    try:
        auto = op.schedule_space(dict(sizes), auto=True)
    except PolycError:
        return {}
    out = {}
    for step in auto.steps:
        if step.name == "tile":
            stmt, loops, tile = step.args
            for loop, t in zip(loops, tile):
                for name in auto.statements:  # the statements sharing the nest too
                    if name == stmt or loop in auto.loops(name):
                        out.setdefault((name, loop), int(t))
    return out


def _knob_loops(steps: tuple[Step, ...]) -> dict[int, tuple[str, str]]:
    """id(knob) -> (statement, loop) it is the tile size of."""
    out = {}
    for s in steps:
        if s.name == "tile" and len(s.args) > 2:
            loops = (s.args[1],) if isinstance(s.args[1], str) else tuple(s.args[1])
            sizes = s.args[2] if isinstance(s.args[2], tuple) else (s.args[2],) * len(loops)
            for loop, v in zip(loops, sizes):
                if isinstance(v, Knob):
                    out[id(v)] = (s.args[0], loop)
        elif s.name == "split" and len(s.args) > 2 and isinstance(s.args[2], Knob):
            out[id(s.args[2])] = (s.args[0], s.args[1])
    return out


def _tile_knobs(steps: tuple[Step, ...]) -> list[Knob]:
    """The knobs given as tile sizes (``tile``'s sizes, ``split``'s factor)."""
    out: list[Knob] = []
    for s in steps:
        sizes = s.args[2] if s.name in ("tile", "split") and len(s.args) > 2 else None
        for v in (sizes if isinstance(sizes, tuple) else (sizes,)):
            if isinstance(v, Knob):
                out.append(v)
    return out
