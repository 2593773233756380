"""polyc fuzz reproducer (crash): timeout: polyc takes about 60-180 s to compile this 5-statement kernel (fusion='max', specialize=False)

Fixed: isl's scheduler runs within an operation budget (polyc/schedule/scheduler.py);
past it the statements are scheduled one at a time, with a PolycWarning. About 3 s now.

seed 5003; found by tests/fuzz (python3 tests/fuzz/campaign.py). Run: python3 {this file}
"""
import numpy as np

SOURCE = 'def f(float32(R, N, R) A) -> (O1, O2, float32(1) O3) {\n  O1(i, j, h) +=! log(fabs(A(r + 2, h, j)) + 0.5) where i in 0:N - 1\n  O1(i, j, h) min=! log2(fabs(A(r, v0, h)) + 0.5) where v0 = j + 2, h in 0:3\n  O2(i) +=! A(i, r, r) where i in 0:3\n  O2(i) min= expm1(O1(i, r, s + r) <= O1(s + r, 2 * i, 2 * i + s) ? 0.125 : -O1(r, s, i)) where exists A(i, r, s)\n  O3(i) *=! O2(s) + s - A(s, r, s - 1) / R + (s + O2(r) + atanh(sin(A(s, r, R - 1 - r)) * 0.875)) where exists A(s, r, s)\n}\n'
ENTRY = 'f'
EINSUM = None
OPTIONS = {'fusion': 'max', 'tile': False, 'specialize': False, 'threads': 1, 'register_tile': True}
INPUTS = [np.array([[[-0.125], [0.375]]], dtype='float32')]
#: the interpreter's outputs (tests/fuzz/interp.py) and where they are numerically stable
EXPECTED = [np.array([[[-0.4700036346912384, -0.133531391620636]]], dtype='float32'), np.array([-0.125, 0.0, 0.0], dtype='float32'), np.array([1.0], dtype='float32')]
STABLE = [np.array([[[True, True]]], dtype='bool'), np.array([True, True, True], dtype='bool'), np.array([True], dtype='bool')]
KIND = 'crash'
MESSAGE = "timeout: polyc takes about 60-180 s to compile this 5-statement kernel (fusion='max', specialize=False)"
#: set to a string while the bug is known and not fixed (the regression test then xfails)
OPEN = None

SLOW = False


if __name__ == "__main__":  # the check is tests/fuzz/shrink.py's check_reproducer
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shrink
    shrink.check_reproducer(sys.modules[__name__])
    print("ok")
