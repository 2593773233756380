"""A differential fuzzing campaign: random TC programs and einsums, polyc vs the interpreter.

    python3 tests/fuzz/campaign.py -n 10000 -j 2 --seed 1 --out fuzz-out/
    python3 tests/fuzz/campaign.py -n 300 --sanitize      # every case under ASan/UBSan
    python3 tests/fuzz/campaign.py -n 300 --target cuda   # the CUDA target, emulated
    POLYC_TEST_ON_GPU=sm_90 python3 tests/fuzz/campaign.py --target cuda   # on a real GPU
    python3 tests/fuzz/campaign.py -n 300 --scheduler pluto   # the Pluto-style scheduler

Cases ``seed .. seed+n-1`` are split between ``-j`` worker processes (a worker that dies,
e.g. on a segfault in compiled code, is reported as a crash of the case it was running
and restarted after it). Every failure (wrong result, crash, refusal of a valid program)
is shrunk (unless ``--no-shrink``) and written to ``--out`` as a self-contained
reproducer. Progress lines go to stderr; the last line is the summary. Exit status: 0 if
no case failed, 1 otherwise. Compiled libraries go to a fresh ``POLYC_CACHE_DIR``.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gen as G  # noqa: E402
import shrink as S  # noqa: E402


def worker(seeds, out_dir, do_shrink, shrink_s):
    """Runs cases; one JSON line per case on stdout ("start" lines before each)."""
    for seed in seeds:
        print(json.dumps({"start": seed}), flush=True)
        t0 = time.time()
        try:
            case = G.case(seed)
        except Exception as e:  # noqa: BLE001
            print(json.dumps({"seed": seed, "kind": "gen-error", "message": repr(e)}), flush=True)
            continue
        out = S.execute(case)
        rec = {"seed": seed, "kind": out.kind, "message": out.message,
               "einsum": case.einsum is not None, "t": round(time.time() - t0, 2)}
        if out.failed:
            path = None
            try:
                if do_shrink:
                    case, out = S.shrink(case, out, budget_s=shrink_s)
                path = S.write_reproducer(case, out, out_dir)
            except Exception as e:  # noqa: BLE001
                rec["shrink_error"] = repr(e)
            rec["reproducer"] = path
            rec["source"] = case.source or case.einsum
            rec["detail"] = out.detail[-600:]
        print(json.dumps(rec), flush=True)


def campaign(n, jobs, seed, out_dir, do_shrink=True, shrink_s=90.0, quiet=False,
             sanitize=False, target="c", scheduler="isl"):
    os.makedirs(out_dir, exist_ok=True)
    cache = tempfile.mkdtemp(prefix="polyc-fuzz-cache-")
    env = dict(os.environ, POLYC_CACHE_DIR=cache, OMP_NUM_THREADS="2",
               POLYC_FUZZ_TARGET=target, POLYC_FUZZ_SCHEDULER=scheduler)
    if sanitize:  # every library built with ASan/UBSan; a report kills the worker (a crash)
        from polyc.codegen.toolchain import sanitizer_environment
        env = sanitizer_environment(env)
        if env is None:
            raise SystemExit("--sanitize: gcc has no ASan runtime (libasan.so)")
        env["POLYC_SANITIZE"] = "1"
    seeds = list(range(seed, seed + n))
    shards = [seeds[k::jobs] for k in range(jobs)]
    results: list[dict] = []
    procs = {}

    def start(shard):
        p = subprocess.Popen([sys.executable, __file__, "--worker", ",".join(map(str, shard)),
                              "--out", out_dir, "--shrink-seconds", str(shrink_s)]
                             + ([] if do_shrink else ["--no-shrink"]),
                             stdout=subprocess.PIPE, text=True, env=env)
        procs[p] = {"pending": list(shard), "current": None}

    for sh in shards:
        if sh:
            start(sh)
    t0 = time.time()
    log = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    while procs:
        for p in list(procs):
            st = procs[p]
            line = p.stdout.readline()
            if not line:
                p.wait()
                del procs[p]
                if st["current"] is not None:   # the worker died running this case
                    results.append({"seed": st["current"], "kind": "crash",
                                    "message": f"worker died (exit status {p.returncode})"})
                    log(f"seed {st['current']}: CRASH worker died ({p.returncode})")
                    rest = [s for s in st["pending"] if s != st["current"]]
                    if rest:
                        start(rest)
                continue
            rec = json.loads(line)
            if "start" in rec:
                st["current"] = rec["start"]
                continue
            st["current"] = None
            st["pending"] = [s for s in st["pending"] if s != rec["seed"]]
            results.append(rec)
            if rec["kind"] not in ("ok", "invalid"):
                log(f"seed {rec['seed']}: {rec['kind'].upper()} {rec['message'][:200]}"
                    f" -> {rec.get('reproducer')}")
            if len(results) % 50 == 0:
                log(f"[{len(results)}/{n}] {time.time() - t0:.0f}s " + summary(results))
    shutil_rm(cache)
    return results


def shutil_rm(path):
    import shutil
    shutil.rmtree(path, ignore_errors=True)


def summary(results) -> str:
    c = collections.Counter(r["kind"] for r in results)
    valid = sum(c[k] for k in ("ok", "wrong", "crash", "refusal"))
    s = (f"cases {len(results)}, valid {valid}, ok {c['ok']}, wrong {c['wrong']}, "
         f"crashes {c['crash']}, refusals {c['refusal']}, invalid {c['invalid']}")
    if c["gen-error"]:
        s += f", generator errors {c['gen-error']}"
    return s


def grouped(results) -> str:
    groups = collections.defaultdict(list)
    for r in results:
        if r["kind"] in ("wrong", "crash", "refusal", "gen-error"):
            groups[(r["kind"], S.normalize(r["message"]))].append(r["seed"])
    lines = []
    for (kind, msg), seeds in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {len(seeds):5d} {kind:8s} {msg}   (seeds {', '.join(map(str, seeds[:6]))}"
                     f"{', ...' if len(seeds) > 6 else ''})")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=100, help="number of cases")
    ap.add_argument("-j", type=int, default=2, help="worker processes")
    ap.add_argument("--seed", type=int, default=1, help="first seed")
    ap.add_argument("--out", default="fuzz-out", help="directory for reproducers")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--shrink-seconds", type=float, default=90.0)
    ap.add_argument("--sanitize", action="store_true",
                    help="build every case with ASan/UBSan (a report is a crash)")
    ap.add_argument("--target", choices=("c", "cuda"), default="c",
                    help="cuda: every case on the CUDA target, run by the CPU emulation")
    ap.add_argument("--scheduler", choices=("isl", "pluto"), default="isl",
                    help="pluto: every case with Options(scheduler='pluto')")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker([int(x) for x in a.worker.split(",")], a.out, not a.no_shrink, a.shrink_seconds)
        return 0
    t0 = time.time()
    results = campaign(a.n, a.j, a.seed, a.out, not a.no_shrink, a.shrink_seconds,
                       sanitize=a.sanitize, target=a.target, scheduler=a.scheduler)
    with open(os.path.join(a.out, "results.jsonl"), "w") as f:
        for r in sorted(results, key=lambda r: r["seed"]):
            f.write(json.dumps(r) + "\n")
    g = grouped(results)
    if g:
        print("failures by message:\n" + g)
    print(f"SUMMARY ({time.time() - t0:.0f}s): " + summary(results))
    return 1 if any(r["kind"] not in ("ok", "invalid") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
