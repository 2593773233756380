"""onnx's own node conformance cases, run through ``polyc.backend``.

The onnx wheel ships no node test data; ``collect_testcases()`` builds the cases (model,
inputs, expected outputs, tolerances) in Python. A case whose ops polyc does not lower
is skipped; a case polyc refuses with ``UnsupportedOpError`` (an attribute, a dtype) is
skipped with that message; everything else must match. The summary line of pytest gives
the counts (``-rs`` lists the reasons).

Kernels are compiled with ``-O1`` here: the semantics are the same as ``-O3`` and the
suite compiles about a thousand small models.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases

import polyc
from polyc.frontend.onnx_graph import UnsupportedOpError, supported_ops

CASES = [c for c in collect_testcases() if c.kind == "node"]
OPTIONS = polyc.Options(cflags=("-O1",))


def _ops(case) -> set[str]:
    return {n.op_type for n in case.model.graph.node}


def _array(x):
    return x if isinstance(x, (np.ndarray, np.generic)) else numpy_helper.to_array(x)


def _defined(case, inputs, want) -> np.ndarray | bool:
    """Where the expected output of ``case`` is defined: everywhere, except that a Cast
    (or CastLike) of floats to integers leaves an input outside the integer type's range
    undefined (the operator's spec: "fixed point: undefined if OOR"). onnx's expected
    outputs there are whatever its converter gives: ml_dtypes 0.7 turns -9.0 into 0 as
    an int4, where C's conversion wraps it to 7."""
    node = case.model.graph.node
    if len(node) != 1 or node[0].op_type not in ("Cast", "CastLike"):
        return True
    x = _array(inputs[0])
    if not x.dtype.name.startswith(("float", "bfloat")):
        return True
    import ml_dtypes
    try:
        info = ml_dtypes.iinfo(want.dtype)  # (int4, uint2, ... and numpy's own)
    except (ValueError, TypeError):
        return True  # not an integer type
    t = np.trunc(x.astype(np.float64))
    return (t >= int(info.min)) & (t <= int(info.max))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case):
    from polyc import backend

    missing = _ops(case) - set(supported_ops())
    if missing:
        pytest.skip(f"op not supported: {', '.join(sorted(missing))}")
    try:
        rep = backend.prepare(case.model, "CPU", options=OPTIONS)
    except UnsupportedOpError as e:
        pytest.skip(f"refused: {str(e).splitlines()[0][:160]}")
    for inputs, outputs in case.data_sets:
        try:  # a model with parameter inputs compiles at its first run
            got = rep.run([_array(x) for x in inputs])
        except UnsupportedOpError as e:
            if not rep.parameters:
                raise
            pytest.skip(f"refused at the run (parameters {', '.join(rep.parameters)}): "
                        f"{str(e).splitlines()[0][:160]}")
        assert len(got) >= len(outputs)
        for g, w in zip(got, outputs):
            w = _array(w)
            g = np.asarray(g)
            assert g.shape == w.shape, (g.shape, w.shape)
            assert g.dtype == w.dtype, (g.dtype, w.dtype)
            if w.dtype.name == "bfloat16":  # as onnx's runner: two bfloat16 ulps
                np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32),
                                           rtol=max(case.rtol, 2 ** -6), atol=case.atol)
            elif w.dtype.name.startswith(("float8", "float4")):  # codes, NaN of any sign
                np.testing.assert_array_equal(g.astype(np.float32), w.astype(np.float32))
            elif w.dtype.kind in "fc":
                atol = case.atol
                if case.name.startswith("test_dft"):
                    # the inverse cases' exact zeros come out of onnx's float32 FFT as
                    # noise of 2e-7 beside values of 45 (polyc sums in double: 3e-15):
                    # an absolute tolerance below float32's resolution at that magnitude
                    # would compare rounding noise, so it is one float32 ulp of the data
                    atol = max(atol, float(np.finfo(np.float32).eps * np.abs(w).max()))
                np.testing.assert_allclose(g, w, rtol=case.rtol, atol=atol)
            else:
                keep = _defined(case, inputs, w)
                np.testing.assert_array_equal(g[keep], w[keep])
