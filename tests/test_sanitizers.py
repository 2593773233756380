"""Every end-to-end case (``test_e2e_numpy.CASES``), under every fusion mode, compiled with
``-fsanitize=address,undefined`` and ``-Wall -Wextra -Werror``, runs clean and matches numpy.

A library built with ``-fsanitize=address`` can only be loaded into a process whose first
library is the ASan runtime, so the compiling *and* running happen in one child Python
started with ``LD_PRELOAD`` set to gcc's ``libasan.so`` (see ``test_runtime.py``).
``detect_leaks=0``: CPython leaks by design at exit. ``abort_on_error`` and
``halt_on_error``: the first report ends the child with a non-zero status.

The child reuses the session's compile cache (``POLYC_CACHE_DIR``, set by conftest), so a
second run only loads the sanitized libraries.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from polyc.codegen.toolchain import asan_runtime, sanitizer_environment
from test_e2e_numpy import CASES, FUSIONS

TESTS = os.path.dirname(os.path.abspath(__file__))
WARNINGS_AS_ERRORS = ("-Wall", "-Wextra", "-Werror")

_CHILD = """
import sys, traceback
sys.path.insert(0, {tests!r})
import numpy as np
import polyc
from polyc.pipeline import bind_sizes
from conftest import assert_matches_numpy, input_dtypes, random_inputs
from test_e2e_numpy import CASES

failed = []
for case in sorted(CASES):
    src, shape_sets, ref = CASES[case]
    for fusion in {fusions!r}:
        try:
            op = polyc.define(src, fusion=fusion, sanitize=True, cflags={cflags!r})
            for seed, shapes in enumerate(shape_sets):
                inputs = random_inputs(list(zip(shapes, input_dtypes(op))), seed)
                assert_matches_numpy(op(*inputs), ref(*inputs), rtol=1e-4, atol=1e-4)
            sizes = bind_sizes(op.kernel, inputs)
            with open(op.compiled_for(sizes).library_path, "rb") as lib:  # flags took effect
                code = lib.read()
            assert b"__asan_" in code and b"__ubsan_handle" in code, "not instrumented"
        except Exception:
            failed.append((case, fusion))
            print(f"FAILED {{case}} fusion={{fusion}}", flush=True)
            traceback.print_exc()
        else:
            print(f"ok {{case}} fusion={{fusion}}", flush=True)
print("SUMMARY cases=" + ",".join(sorted(CASES)) + f" failed={{len(failed)}}", flush=True)
sys.exit(1 if failed else 0)
"""


@pytest.mark.skipif(asan_runtime() is None, reason="gcc has no libasan.so")
def test_every_case_is_sanitizer_and_warning_clean():
    env = sanitizer_environment()
    assert env.get("POLYC_CACHE_DIR"), "conftest sets POLYC_CACHE_DIR"
    script = _CHILD.format(tests=TESTS, fusions=FUSIONS, cflags=WARNINGS_AS_ERRORS)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    report = f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-6000:]}"
    assert done.returncode == 0, report
    summary = [line for line in done.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert summary, report
    assert summary[-1].split()[1] == "cases=" + ",".join(sorted(CASES)), report
    assert summary[-1].endswith("failed=0"), report
    for case in CASES:
        for fusion in FUSIONS:
            assert f"ok {case} fusion={fusion}" in done.stdout, report
