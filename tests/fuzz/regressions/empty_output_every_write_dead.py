"""polyc fuzz reproducer (refusal): SemanticError: kernel 'g' has no statements: there is nothing to schedule

Fixed: at N = 1 the output ``O1(i, j)`` over ``j in 0:N-1`` has no elements, so no
instance of either statement is live, and the dead-write pass dropped them both; it now
keeps a kernel's statements when none would be left (they write nothing).

seed 3855; found by tests/fuzz (python3 tests/fuzz/campaign.py --sanitize). Run: python3 {this file}
"""
import numpy as np

SOURCE = 'def g(float(N) A, float32(N) X) -> O1 {\n  O1(i, j) = min(A(i), X(j + 1))\n  O1(i, j) = N\n}\n'
ENTRY = 'g'
EINSUM = None
OPTIONS = {'fusion': 'smart', 'tile': True, 'specialize': True, 'threads': 1, 'register_tile': True}
INPUTS = [np.array([1.0], dtype='float32'), np.array([1.0], dtype='float32')]
#: the interpreter's outputs (tests/fuzz/interp.py) and where they are numerically stable
EXPECTED = [np.array([[]], dtype='float32').reshape((1, 0))]
STABLE = [np.array([[]], dtype='bool').reshape((1, 0))]
KIND = 'refusal'
MESSAGE = "SemanticError: kernel 'g' has no statements: there is nothing to schedule"
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
