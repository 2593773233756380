"""Auto-tuning (polyc/tune.py): a search picks a candidate whose results equal numpy's,
the choice is cached per machine (a second compile searches nothing), Ctrl-C keeps the
best so far, tiny kernels are never searched, a corrupt cache warns and is rewritten.

Kept fast: two or three candidates per search, small odd sizes (the cost model's
threshold is lowered so that they are searched at all)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import assert_matches_numpy, random_inputs

import polyc
from polyc import pipeline, tune
from polyc.errors import CompileError, PolycWarning
from polyc.frontend import from_tc

pytestmark = pytest.mark.filterwarnings("error::polyc.errors.PolycWarning")

MATMUL = """def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}"""
CONV = """def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
    O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw)
}"""
RELU = """def relu(float(M,N) A) -> (B) {
    B(m,n) = fmax(A(m,n), 0.0)
}"""


@pytest.fixture
def searched(monkeypatch):
    """Search small kernels (no work threshold), at most three candidates, and count
    the searches."""
    monkeypatch.setattr(tune, "MIN_WORK", 0)
    monkeypatch.setattr(tune, "MAX_CANDIDATES", 3)
    calls = []
    search = tune._search

    def counted(*args, **kwargs):
        calls.append(args[0].name)
        return search(*args, **kwargs)
    monkeypatch.setattr(tune, "_search", counted)
    return calls


def _options(tmp_cache: str, tune_value: bool | float = 20.0) -> polyc.Options:
    return polyc.Options(cache_dir=tmp_cache, tune=tune_value)


def test_matmul_tuned_equals_numpy_and_is_cached(searched, tmp_cache):
    options = _options(tmp_cache)
    A, B = random_inputs([((37, 53), "float32"), ((53, 29), "float32")])
    C = polyc.define(MATMUL, options=options)(A, B)
    assert_matches_numpy(C, A @ B)
    assert searched == ["matmul"]
    path = tune.cache_path(options)
    entries = json.load(open(path))["entries"]
    assert len(entries) == 1
    (key, entry), = entries.items()
    assert key.endswith(f"-t{tune.thread_count(options)}") and entry["kernel"] == "matmul"
    assert entry["tried"] >= 1 and entry["best_ms"] > 0
    # a second compile (a new operator: nothing cached in the process) searches nothing
    C2 = polyc.define(MATMUL, options=options)(A, B)
    assert_matches_numpy(C2, A @ B)
    assert searched == ["matmul"]
    # another thread count is another entry
    polyc.define(MATMUL, options=options.replace(threads=1))(A, B)
    assert searched == ["matmul", "matmul"]
    assert len(json.load(open(path))["entries"]) == 2


def test_conv_search_picks_a_timed_candidate(searched, tmp_cache):
    kernel = from_tc(CONV).specialize({"N": 1, "C": 5, "H": 13, "W": 11, "F": 19,
                                       "KH": 3, "KW": 3})
    r = tune.tune_kernel(kernel, _options(tmp_cache), progress=True)
    assert r.status == "searched" and 1 <= r.tried <= 3
    chosen = tune.Candidate.of(r.options)
    assert chosen in [c for c, _ in r.timings]
    assert r.options.tune is False and r.best_s <= r.default_s
    X, W = random_inputs([((1, 5, 13, 11), "float32"), ((19, 5, 3, 3), "float32")])
    got, = pipeline.compile_kernel(kernel, r.options).run([X, W])
    windows = np.lib.stride_tricks.sliding_window_view(X, (3, 3), axis=(2, 3))
    assert_matches_numpy(got, np.einsum("nchwij,fcij->nfhw", windows, W), rtol=1e-4,
                         atol=1e-4)


def test_candidates_change_only_how(tmp_cache):
    kernel = from_tc(MATMUL).specialize({"M": 64, "K": 64, "N": 64})
    options = _options(tmp_cache)
    base = tune.Candidate.of(options)
    band = tune.main_band(kernel, options)
    assert band == tune.BandShape(outer=1, reduction=1, vector=True)
    found = list(tune.candidates(kernel, options, lambda: base, band))
    assert found[0] == base and len(set(found)) == len(found) >= 10
    for c in found:
        o = c.apply(options)
        assert o.tune is False and o.replace(fusion=options.fusion, tile=options.tile,
                                             register_tile=options.register_tile,
                                             tune=options.tune) == options
        hash(o)  # options stay usable as a schedule-cache key


def test_interrupt_keeps_the_best_so_far(monkeypatch, searched, tmp_cache):
    monkeypatch.setattr(tune, "MAX_CANDIDATES", 10)
    compile_kernel = pipeline.compile_kernel
    seen = []

    def interrupted(kernel, options, **kwargs):
        seen.append(options)
        if len(seen) == 3:
            raise KeyboardInterrupt
        return compile_kernel(kernel, options, **kwargs)
    monkeypatch.setattr(pipeline, "compile_kernel", interrupted)
    kernel = from_tc(MATMUL).specialize({"M": 37, "K": 53, "N": 29})
    options = _options(tmp_cache)
    r = tune.tune_kernel(kernel, options)
    assert r.status == "interrupted" and len(seen) == 3
    assert tune.Candidate.of(r.options) in [tune.Candidate.of(o) for o in seen[:2]]
    assert not os.path.exists(tune.cache_path(options))  # a partial search is not cached


def test_model_compile_stops_searching_after_an_interrupt(monkeypatch, searched, tmp_cache):
    from onnx_models import mlp
    monkeypatch.setattr(tune, "MAX_CANDIDATES", 2)
    real = tune._Bench.time
    monkeypatch.setattr(tune._Bench, "time", lambda *a, **k: (_ for _ in ()).throw(
        KeyboardInterrupt))
    model = mlp()
    m = polyc.compile_onnx(model, options=_options(tmp_cache))
    assert len(searched) == 1  # the first searched kernel was interrupted, then none
    monkeypatch.setattr(tune._Bench, "time", real)
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    want, = polyc.compile_onnx(model, options=polyc.Options(cache_dir=tmp_cache))(x)
    assert_matches_numpy(m(x)[0], want)


def test_model_tuning_with_progress(monkeypatch, searched, tmp_cache, capsys):
    from onnx_models import mlp
    monkeypatch.setattr(tune, "MAX_CANDIDATES", 2)
    model = mlp()
    options = _options(tmp_cache)
    m = polyc.compile_onnx(model, options=options, progress=True)
    err = capsys.readouterr().err
    assert searched and "tune " in err and f"/{2}" in err
    entries = json.load(open(tune.cache_path(options)))["entries"]
    assert len(entries) == len(searched)
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    want, = polyc.compile_onnx(model, options=polyc.Options(cache_dir=tmp_cache))(x)
    assert_matches_numpy(m(x)[0], want)
    before = list(searched)
    polyc.compile_onnx(model, options=options)  # warm tuning cache: no search
    assert searched == before


def test_tiny_and_elementwise_kernels_are_not_searched(monkeypatch, tmp_cache):
    def fail(*args, **kwargs):
        raise AssertionError("searched")
    monkeypatch.setattr(tune, "_search", fail)
    options = _options(tmp_cache, True)
    tiny = from_tc(MATMUL).specialize({"M": 8, "K": 8, "N": 8})
    assert tune.tune_kernel(tiny, options).status.startswith("skipped: little work")
    relu = from_tc(RELU).specialize({"M": 4096, "N": 4096})
    assert tune.tune_kernel(relu, options).status == "skipped: no reduction"
    generic = from_tc(MATMUL)
    assert tune.tune_kernel(generic, options).status == "skipped: sizes not fixed"
    assert tune.estimated_work(from_tc(MATMUL).specialize({"M": 37, "K": 53, "N": 29})) \
        == 37 * 53 * 29
    A, B = random_inputs([((8, 8), "float32"), ((8, 8), "float32")])
    assert_matches_numpy(polyc.define(MATMUL, options=options)(A, B), A @ B)
    assert not os.path.exists(tune.cache_path(options))


def test_corrupt_cache_warns_and_is_rewritten(searched, tmp_cache):
    options = _options(tmp_cache)
    path = tune.cache_path(options)
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write("{not json")
    kernel = from_tc(MATMUL).specialize({"M": 37, "K": 53, "N": 29})
    with pytest.warns(PolycWarning, match="unreadable tuning cache"):
        r = tune.tune_kernel(kernel, options, max_candidates=1)
    assert r.status == "searched"
    assert len(json.load(open(path))["entries"]) == 1
    assert tune.tune_kernel(kernel, options).status == "cached"


def test_tune_option_values():
    assert polyc.Options(tune=True).tune is True and polyc.Options(tune=2.5).tune == 2.5
    for bad in (-1, 0, "fast"):
        with pytest.raises(CompileError, match="tune"):
            polyc.Options(tune=bad)


def test_cli_tune_flag(tmp_path, monkeypatch, capsys):
    from polyc.cli import main
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "mm.tc"
    src.write_text(MATMUL)
    assert main(["compile", str(src), "--sizes", "M=8,K=8,N=8", "--tune", "3",
                 "--emit", "c"]) == 0
    assert "matmul" in capsys.readouterr().out
    assert main(["tune", str(src), "--sizes", "M=8,K=8,N=8"]) == 0
    assert "skipped: little work" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["compile", str(src), "--tune", "-2"])
