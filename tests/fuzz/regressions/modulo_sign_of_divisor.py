"""polyc fuzz reproducer (wrong): output 0: 2 of 4 elements differ

Resolved as a semantics decision: polyc's ``%`` is the floor modulo (the result has the
divisor's sign) for integers and floats, as in index expressions (isl), Python and
ONNX's Mod; ``/`` on integers truncates as in C. The interpreter follows that now.

seed 0; found by tests/fuzz (python3 tests/fuzz/campaign.py). Run: python3 {this file}

    (0,): expected -1, got 2; (2,): expected -1, got 2
"""
import numpy as np

SOURCE = 'def f(int32(N) A, float(N) X) -> (R, F) {\n  R(i) = A(i) % 3\n  F(i) = X(i) % 2.0\n}\n'
ENTRY = 'f'
EINSUM = None
OPTIONS = {}
INPUTS = [np.array([-7, 7, -1, 6], dtype='int32'), np.array([-3.5, 3.5, -0.5, 1.0], dtype='float32')]
#: the interpreter's outputs (tests/fuzz/interp.py) and where they are numerically stable
EXPECTED = [np.array([2, 1, 2, 0], dtype='int32'), np.array([0.5, 1.5, 1.5, 1.0], dtype='float32')]
STABLE = [np.array([True, True, True, True], dtype='bool'), np.array([True, True, True, True], dtype='bool')]
KIND = 'wrong'
MESSAGE = 'output 0: 2 of 4 elements differ'
#: set to a string while the bug is known and not fixed (the regression test then xfails)
OPEN = None


if __name__ == "__main__":  # the check is tests/fuzz/shrink.py's check_reproducer
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shrink
    shrink.check_reproducer(sys.modules[__name__])
    print("ok")
