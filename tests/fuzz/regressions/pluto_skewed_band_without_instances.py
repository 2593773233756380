"""polyc fuzz reproducer (crash): the points of a tiled skewed band put in program order
(optimize._program_order_points) for a band with no instance for these sizes: isl cannot
build a schedule from an empty map.

Fixed: such a band keeps its point band.

seed 13525 (--scheduler pluto); found by tests/fuzz (python3 tests/fuzz/campaign.py).
"""
import numpy as np

SOURCE = 'def f(int64(P, M, M) A, float(M, 4) B, float32(M, P) X) -> O1 {\n  O1(i, j) = acosh(fabs(sinh(X(j, j))) + 1) where exists A(i, i, i), i in 0:M - 1\n}\n'
ENTRY = 'f'
EINSUM = None
OPTIONS = {'fusion': 'smart', 'tile': True, 'specialize': True, 'threads': 2, 'register_tile': False, 'scheduler': 'pluto'}
INPUTS = [np.array([[[2]], [[-2]], [[-6]], [[-2]], [[-4]], [[-3]]], dtype='int64'), np.array([[1.75, 1.75, 0.875, 1.0]], dtype='float32'), np.array([[1.125, 0.875, 0.875, -1.5, 1.875, -1.375]], dtype='float32')]
#: the interpreter's outputs (tests/fuzz/interp.py) and where they are numerically stable
EXPECTED = [np.array([], dtype='float32').reshape((0, 1))]
STABLE = [np.array([], dtype='bool').reshape((0, 1))]
KIND = 'crash'
MESSAGE = 'Error: call to isl_multi_union_pw_aff_from_union_map failed: cannot extract range space from empty input in /project/isl/isl_aff.c:8771'
#: set to a string while the bug is known and not fixed (the regression test then xfails)
OPEN = None


def run():
    import polyc
    if EINSUM:
        return [polyc.einsum(EINSUM, *INPUTS, **OPTIONS)]
    out = polyc.define(SOURCE, name=ENTRY, **OPTIONS)(*INPUTS)
    return list(out) if isinstance(out, tuple) else [out]


def check():
    """Raises AssertionError (or polyc's error) while the bug is there."""
    actual = run()
    assert len(actual) == len(EXPECTED), (len(actual), len(EXPECTED))
    for k, (e, s, a) in enumerate(zip(EXPECTED, STABLE, actual)):
        a = np.asarray(a)
        assert a.shape == e.shape, f"output {k}: shape {a.shape}, expected {e.shape}"
        assert a.dtype == e.dtype, f"output {k}: dtype {a.dtype}, expected {e.dtype}"
        if e.dtype.kind == "f":
            ok = np.isclose(a, e, rtol=2e-3, atol=1e-4, equal_nan=True) | (a == e) | ~s
        else:
            ok = (a == e) | ~s
        assert ok.all(), f"output {k}: expected\n{e}\ngot\n{a}"


if __name__ == "__main__":
    check()
    print("ok")
