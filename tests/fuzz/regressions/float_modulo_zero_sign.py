"""polyc fuzz reproducer (wrong): output 0: 1 of 4 elements differ

Fixed: a float floor modulo that is zero has the divisor's sign (-0.5 % 0.5 is +0.0, as
in Python and numpy); polyc_mod returned fmod's -0.0, which copysign saw.

seed 50175; found by tests/fuzz (python3 tests/fuzz/campaign.py). Run: python3 {this file}

    (1,): expected 4.0, got 2.0
"""
import numpy as np

SOURCE = 'def f(float32(Q, Q) B, float(Q) X) -> O2 {\n  O2(i) +=! copysign(X(i), B(i, r) % 0.5)\n}\n'
ENTRY = 'f'
EINSUM = None
OPTIONS = {'fusion': 'smart', 'tile': True, 'specialize': True, 'threads': 1, 'register_tile': True}
INPUTS = [np.array([[0.5, 0.25, 0.375, -1.375], [-0.75, 2.0, -1.375, -0.5], [-0.875, 2.0, 0.75, 0.75], [0.625, -1.875, 0.375, -0.25]], dtype='float32'), np.array([1.0, 1.0, 1.0, 1.0], dtype='float32')]
#: the interpreter's outputs (tests/fuzz/interp.py) and where they are numerically stable
EXPECTED = [np.array([4.0, 4.0, 4.0, 4.0], dtype='float32')]
STABLE = [np.array([True, True, True, True], dtype='bool')]
KIND = 'wrong'
MESSAGE = 'output 0: 1 of 4 elements differ'
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
