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


if __name__ == "__main__":  # the check is tests/fuzz/shrink.py's check_reproducer
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shrink
    shrink.check_reproducer(sys.modules[__name__])
    print("ok")
