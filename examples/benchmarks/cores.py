"""How far apart the host has put this machine's first two CPUs, for reading 2-thread
figures: the round trip of one cache line between two threads pinned to CPUs 0 and 1.

On the 2-vCPU KVM guests this project runs on, the host moves the two vCPUs for
seconds at a time between neighbouring cores (a round trip of 50-100 ns) and cores far
apart (about 350 ns). Far apart, what one thread wrote and the other reads crosses the
chip: polyc's ResNet-18 on 2 threads took 11 ms near and 18 ms far, its memory-bound
kernels (transforms, transpositions, 1x1 layers) 4-5x longer, in the same process with
the same code. The benchmarks print the round trip beside their 2-thread figures so
that a run can be read for what it measured.

The probe is C (a Python thread cannot answer in nanoseconds), built once into polyc's
cache by the same toolchain.
"""
from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: round trips above this many nanoseconds: the two CPUs are far apart
FAR_NS = 200.0

SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

static _Atomic long polyc_probe_line;

static double polyc_probe_now(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int polyc_probe_pin(int cpu)
{
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *polyc_probe_echo(void *arg)
{
  (void)arg;
  polyc_probe_pin(1);
  for (;;) {
    long v;
    while (((v = atomic_load_explicit(&polyc_probe_line, memory_order_acquire)) & 1) == 0)
      ;
    if (v < 0)
      return 0;
    atomic_store_explicit(&polyc_probe_line, v + 1, memory_order_release);
  }
}

/* nanoseconds per round trip over n round trips; -1 when the threads cannot be pinned */
double polyc_round_trip_ns(long n)
{
  cpu_set_t old;
  pthread_t echo;
  if (pthread_getaffinity_np(pthread_self(), sizeof old, &old) || polyc_probe_pin(0))
    return -1.0;
  atomic_store(&polyc_probe_line, 0);
  if (pthread_create(&echo, 0, polyc_probe_echo, 0)) {
    pthread_setaffinity_np(pthread_self(), sizeof old, &old);
    return -1.0;
  }
  double start = 0.0;
  for (long i = 0; i < n + 100; i++) {  /* 100 to warm up */
    if (i == 100)
      start = polyc_probe_now();
    long v = 2 * i;
    atomic_store_explicit(&polyc_probe_line, v + 1, memory_order_release);
    while (atomic_load_explicit(&polyc_probe_line, memory_order_acquire) != v + 2)
      ;
  }
  double end = polyc_probe_now();
  atomic_store(&polyc_probe_line, -1);
  pthread_join(echo, 0);
  pthread_setaffinity_np(pthread_self(), sizeof old, &old);
  return (end - start) / n * 1e9;
}
"""

_LIB: ctypes.CDLL | None = None


def round_trip_ns(trips: int = 20000) -> float | None:
    """Nanoseconds of one round trip between CPUs 0 and 1 (a few milliseconds of
    probing); None on a machine with one CPU or where the threads cannot be pinned."""
    global _LIB
    if (os.cpu_count() or 1) < 2:
        return None
    if _LIB is None:
        import polyc
        from polyc.codegen.toolchain import build_shared
        _LIB = ctypes.CDLL(build_shared(SOURCE, polyc.Options(), "round_trip"))
        _LIB.polyc_round_trip_ns.restype = ctypes.c_double
        _LIB.polyc_round_trip_ns.argtypes = [ctypes.c_long]
    ns = _LIB.polyc_round_trip_ns(trips)
    return ns if ns > 0 else None


def probed(threads: int, measure: Callable[[], T]) -> tuple[T, list[float | None]]:
    """``measure()`` and, with ``threads > 1``, the round trips probed just before and
    after it (else no samples)."""
    before = [round_trip_ns()] if threads > 1 else []
    result = measure()
    return result, before + ([round_trip_ns()] if threads > 1 else [])


def describe(samples: list[float | None]) -> str:
    """``round trip 60-340 ns (3 of 8 far)`` for the samples taken during a run."""
    got = sorted(s for s in samples if s is not None)
    if not got:
        return "round trip unknown"
    far = sum(s > FAR_NS for s in got)
    return (f"cross-core round trip {got[0]:.0f}-{got[-1]:.0f} ns "
            f"({far} of {len(got)} far apart)")
