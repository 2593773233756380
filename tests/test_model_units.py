"""A model's library built from several translation units compiled in parallel
(codegen/model_c.translation_units, codegen/toolchain.build_model_library): same
numerics as one unit, kernels not exported, the cache key covers every unit, the
``.c`` beside the library (and ``c_source``) is the whole library in one unit, and a
unit the compiler refuses is reported and kept."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import model_programs as P
import numpy as np
import pytest
from conftest import random_inputs

import polyc
import polyc.codegen.model as CM
from polyc.codegen.model_c import UNIT_EXTERN
from polyc.codegen.toolchain import build_model_library
from polyc.errors import ToolchainError

WARNINGS_AS_ERRORS = ("-Wall", "-Wextra", "-Werror")


def _build(prog, jobs, monkeypatch, cache):
    monkeypatch.setattr(CM.toolchain, "build_jobs", lambda: jobs)
    return polyc.build_model(prog, polyc.Options(cflags=WARNINGS_AS_ERRORS, cache_dir=cache))


def _inputs(prog, seed=0):
    return random_inputs([(prog.buffer(n).shape, prog.buffer(n).dtype) for n in prog.inputs],
                         seed)


@pytest.mark.parametrize("jobs", [2, 3, 8])
def test_split_library_matches_one_unit(jobs, monkeypatch, tmp_path):
    prog, ref = P.chain()  # five distinct kernels
    one = _build(prog, 1, monkeypatch, str(tmp_path / "one"))
    split = _build(prog, jobs, monkeypatch, str(tmp_path / "split"))
    assert len(one.source.units) == 1 and one.source.units[0] == one.c_source
    assert 2 <= len(split.source.units) <= jobs
    # every kernel is defined exactly once over the units; those outside unit 0 are
    # external (hidden) and declared in unit 0, which calls them
    names = {fn for _, fn in split.source.calls}
    assert len(names) == split.source.functions == 5
    for name in names:
        defs = [i for i, u in enumerate(split.source.units) for line in u.splitlines()
                if re.search(rf"\bint {name}\(", line) and not line.rstrip().endswith(";")]
        assert len(defs) == 1, (name, defs)
        if defs[0] != 0:
            assert re.search(rf"^{UNIT_EXTERN} int {name}\(.*\);$", split.source.units[0],
                             re.M)
    assert split.c_source == one.c_source  # c_source is the whole library, one unit
    with open(split.source_path) as f:
        assert f.read() == split.c_source
    x, = _inputs(prog)
    np.testing.assert_allclose(split(x)[0], ref(x)[0], rtol=1e-5)
    np.testing.assert_array_equal(split(x)[0], one(x)[0])


def test_kernels_are_not_exported(monkeypatch, tmp_path):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm")
    prog, _ = P.chain()
    m = _build(prog, 2, monkeypatch, str(tmp_path))
    assert len(m.source.units) == 2
    out = subprocess.run([nm, "-D", "--defined-only", m.library_path], capture_output=True,
                         text=True, check=True).stdout
    assert "chain_run" in out and "polyc_k" not in out


def test_cache_key_covers_every_unit(monkeypatch, tmp_path):
    prog, _ = P.chain()
    cache = str(tmp_path)
    a = _build(prog, 2, monkeypatch, cache)
    again = _build(prog, 2, monkeypatch, cache)
    b = _build(prog, 3, monkeypatch, cache)
    assert a.library_path == again.library_path != b.library_path
    units = list(a.source.units)
    units[-1] += "\n/* a change in the last unit only */\n"
    opts = polyc.Options(cflags=WARNINGS_AS_ERRORS, cache_dir=cache)
    changed = build_model_library(a.c_source, a.name, opts, units=units)
    assert changed not in (a.library_path, b.library_path) and os.path.exists(changed)
    # no build directories left behind
    assert not [f for f in os.listdir(cache) if f.endswith(".build")]


def test_refused_unit_is_reported_and_kept(monkeypatch, tmp_path):
    prog, _ = P.chain()
    m = _build(prog, 2, monkeypatch, str(tmp_path / "ok"))
    units = list(m.source.units)
    units[1] = units[1] + "\nint this is not C;\n"
    opts = polyc.Options(cache_dir=str(tmp_path / "bad"))
    with pytest.raises(ToolchainError) as e:
        build_model_library(m.c_source, m.name, opts, units=units)
    assert e.value.args and ".u1.c" in str(e.value)
    kept = [f for f in os.listdir(tmp_path / "bad") if f.endswith(".u1.c")]
    assert len(kept) == 1
    assert not [f for f in os.listdir(tmp_path / "bad") if f.endswith((".so", ".build"))]


def test_one_kernel_is_one_unit(monkeypatch, tmp_path):
    prog, _ = P.repeated()  # three steps, one function
    m = _build(prog, 4, monkeypatch, str(tmp_path))
    assert m.source.functions == 1 and m.source.units == (m.c_source,)
