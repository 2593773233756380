"""Fuzzing the schedule workbench: random primitive sequences on random TC programs.

    python3 tests/fuzz/workbench.py -n 300 --seed 1 --steps 5

Each case is a program of the differential campaign (``gen.case(seed)``; einsum cases are
skipped). From its schedule space, ``--steps`` random primitives are tried with random
arguments drawn from the space at hand (loops, statements, arrays, sizes); a step that
the workbench refuses (:class:`ScheduleError`) is skipped -- refusing is always allowed --
and every accepted step must leave a schedule whose compiled result equals the
interpreter's. Failures: ``wrong`` (an accepted schedule computes something else),
``crash`` (a primitive or the compilation raised anything but ScheduleError). Each
failure prints the program, the steps and the message. Exit status 1 if any case failed.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import gen as G  # noqa: E402
import interp as I  # noqa: E402
import shrink as S  # noqa: E402

PRIMITIVES = ["tile", "split", "reorder", "interchange", "skew", "shift", "reverse", "fuse",
              "distribute", "parallel", "vectorize", "unroll", "unroll_and_jam", "peel",
              "split_index_set", "compute_inline", "layout", "cache_read", "cache_write",
              "rfactor", "compute_at", "reverse_compute_at", "decompose_reduction",
              "registers"]


def random_step(rng: random.Random, s) -> tuple[str, tuple] | None:
    """A primitive and arguments drawn from the space ``s`` (None: nothing applies)."""
    name = rng.choice(PRIMITIVES)
    stmts = list(s.statements)
    stmt = rng.choice(stmts)
    loops = list(s.loops(stmt))
    kernel = s.kernel
    st = kernel.statement(stmt)
    if name in ("tile", "split", "parallel", "vectorize", "unroll", "unroll_and_jam",
                "reverse", "shift", "peel", "split_index_set", "decompose_reduction",
                "registers") \
            and not loops:
        return None
    if name == "tile":
        i = rng.randrange(len(loops))
        n = rng.randint(1, min(2, len(loops) - i))
        return name, (stmt, tuple(loops[i:i + n]), tuple(rng.choice([2, 3, 4, 8])
                                                        for _ in range(n)))
    if name in ("split", "unroll_and_jam"):
        return name, (stmt, rng.choice(loops), rng.choice([2, 3, 4]))
    if name == "unroll":
        return name, (stmt, rng.choice(loops), rng.choice([2, 4]))
    if name in ("parallel", "vectorize", "reverse"):
        return name, (stmt, rng.choice(loops))
    if name == "reorder" and len(loops) >= 2:
        chosen = rng.sample(loops, rng.randint(2, min(3, len(loops))))
        return name, (stmt, *chosen)
    if name == "interchange" and len(loops) >= 2:
        a, b = rng.sample(loops, 2)
        return name, (stmt, a, b)
    if name == "skew" and len(loops) >= 2:
        i, j = sorted(rng.sample(range(len(loops)), 2))
        return name, (stmt, loops[i], loops[j], rng.choice([1, 2, -1]))
    if name == "shift":
        return name, (stmt, rng.choice(loops), rng.choice([-2, -1, 1, 2]))
    if name == "fuse" and len(stmts) >= 2:
        a, b = sorted(rng.sample(range(len(stmts)), 2))
        return name, (rng.randint(1, 2), stmts[a], stmts[b])
    if name in ("distribute", "compute_inline", "cache_write"):
        return name, (stmt,)
    if name == "peel":
        front = rng.choice([0, 1])
        return name, (stmt, rng.choice(loops), front, 1 - front)
    if name == "split_index_set":
        return name, (stmt, rng.choice(loops), rng.choice([1, 2, 3]))
    if name == "layout":
        temps = [a for a in kernel.arrays if a.role == "temp" and a.rank >= 2]
        if not temps:
            return None
        a = rng.choice(temps)
        perm = list(range(a.rank))
        rng.shuffle(perm)
        return name, (a.name, tuple(perm))
    if name == "cache_read":
        arrays = sorted({r.array for r in st.reads if r.array != st.write.array})
        if not arrays:
            return None
        return name, (stmt, rng.choice(arrays))
    if name == "rfactor":
        if not st.reduction_iterators:
            return None
        return name, (stmt, rng.choice(st.reduction_iterators), rng.choice([2, 3, 4]))
    if name in ("compute_at", "reverse_compute_at") and len(stmts) >= 2:
        a, b = rng.sample(stmts, 2)
        target_loops = s.loops(b)
        if not target_loops:
            return None
        return name, (a, b, rng.choice(target_loops))
    if name in ("decompose_reduction", "registers"):
        return name, (stmt, rng.choice(loops))
    return None


def run_case(seed: int, steps: int) -> dict:
    import polyc
    from polyc.errors import ScheduleError
    case = G.case(seed)
    if case.einsum:
        return {"seed": seed, "kind": "skip"}
    try:
        expected, stable, dtypes = S.oracle(case)
    except I.Invalid:
        return {"seed": seed, "kind": "invalid"}
    rng = random.Random(seed * 7919 + 1)
    options = {k: v for k, v in case.options.items() if k in ("specialize", "threads")}
    applied: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", polyc.errors.PolycWarning)
        try:
            op = polyc.define(case.source, name=case.entry if len(case.defs) > 1 else None,
                              **options)
            s = op.schedule_space()
        except polyc.CompileError as e:
            return {"seed": seed, "kind": "invalid", "message": str(e)}
        refused = 0
        for _ in range(steps * 3):
            if len(applied) >= steps:
                break
            drawn = random_step(rng, s)
            if drawn is None:
                continue
            name, args = drawn
            call = f"{name}{args!r}"
            try:
                s = getattr(s, name)(*args)
                applied.append(call)
            except ScheduleError:
                refused += 1
            except Exception as e:  # noqa: BLE001 -- a primitive crashed
                return {"seed": seed, "kind": "crash", "steps": applied + [call],
                        "message": f"{type(e).__name__}: {e}",
                        "detail": traceback.format_exc(limit=-3), "source": case.source}
        try:
            out = S._with_timeout(lambda: op.with_schedule(s)(*case.inputs), S.TIMEOUT_S)
        except Exception as e:  # noqa: BLE001
            return {"seed": seed, "kind": "crash", "steps": applied,
                    "message": f"{type(e).__name__}: {e}",
                    "detail": traceback.format_exc(limit=-3), "source": case.source}
    actual = [np.asarray(a) for a in (out if isinstance(out, tuple) else [out])]
    for k, (e, st, a, dt) in enumerate(zip(expected, stable, actual, dtypes)):
        bad = I.compare(e, st, a, dt) if a.shape == e.shape else [("shape", e.shape, a.shape)]
        if bad:
            return {"seed": seed, "kind": "wrong", "steps": applied, "source": case.source,
                    "message": f"output {k}: {len(bad)} of {e.size} elements differ "
                               f"({bad[:3]})"}
    return {"seed": seed, "kind": "ok", "steps": applied, "refused": refused}


def run_isolated(seed: int, steps: int) -> dict:
    """:func:`run_case` in a forked child: a case whose compiled code corrupts memory or
    dies on a signal is a crash of that case, not of the campaign."""
    import json
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        try:
            r = run_case(seed, steps)
        except BaseException as e:  # noqa: BLE001
            r = {"seed": seed, "kind": "crash", "steps": [], "source": "",
                 "message": f"{type(e).__name__}: {e}"}
        with os.fdopen(write, "w") as f:
            f.write(json.dumps(r, default=str))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    _, status = os.waitpid(pid, 0)
    if text:
        return json.loads(text)
    return {"seed": seed, "kind": "crash", "steps": [], "source": G.case(seed).source,
            "message": f"the case's process died (status {status}): memory corruption or "
                       "a signal in compiled code"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args(argv)
    os.environ.setdefault("POLYC_CACHE_DIR", tempfile.mkdtemp(prefix="polyc-wb-"))
    counts: dict[str, int] = {}
    applied = refused = 0
    t0 = time.time()
    failed = False
    for seed in range(a.seed, a.seed + a.n):
        r = run_isolated(seed, a.steps)
        counts[r["kind"]] = counts.get(r["kind"], 0) + 1
        applied += len(r.get("steps", []))
        refused += r.get("refused", 0)
        if r["kind"] in ("wrong", "crash"):
            failed = True
            print(f"--- seed {seed}: {r['kind']}: {r['message']}\n{r['source']}\nsteps:",
                  *r["steps"], r.get("detail", ""), sep="\n", flush=True)
        if (seed - a.seed + 1) % 25 == 0:
            print(f"[{seed - a.seed + 1}/{a.n}] {time.time() - t0:.0f}s {counts}",
                  file=sys.stderr, flush=True)
    print(f"SUMMARY ({time.time() - t0:.0f}s): {counts}; steps applied {applied}, "
          f"refused {refused}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
