"""polyc fuzz reproducer (crash): Error: call to isl_set_coefficients failed: input set not allowed to have local variables in /project/isl/isl_farkas.c:847

Fixed: the Pluto scheduler takes the rational relaxation of a dependence polyhedron
with existential variables (strided accesses) before isl's Farkas dual, which refuses them.

seed 9140; found by tests/fuzz (python3 tests/fuzz/campaign.py). Run: python3 {this file}
"""
import numpy as np

SOURCE = 'def f(int32(K, Q) A) -> O1 {\n  O1(i, j) min=! 1.0 where j in 0:A.1, i in 0:Q - 1\n  T1(i, j, h) +=! O1(i, h) where j in 0:K - 1\n  T2(i, j) +=! T1(2 * i, 5 - i, r) + trunc(T1(2 * j + r, r, r))\n}\n'
ENTRY = 'f'
EINSUM = None
OPTIONS = {'fusion': 'smart', 'tile': True, 'specialize': False, 'threads': 1, 'register_tile': True, 'scheduler': 'pluto'}
INPUTS = [np.array([[3], [3], [5], [6], [-3], [-1]], dtype='int32')]
#: the interpreter's outputs (tests/fuzz/interp.py) and where they are numerically stable
EXPECTED = [np.array([], dtype='float32').reshape((0, 1))]
STABLE = [np.array([], dtype='bool').reshape((0, 1))]
KIND = 'crash'
MESSAGE = 'Error: call to isl_set_coefficients failed: input set not allowed to have local variables in /project/isl/isl_farkas.c:847'
#: set to a string while the bug is known and not fixed (the regression test then xfails)
OPEN = None



if __name__ == "__main__":  # the check is tests/fuzz/shrink.py's check_reproducer
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shrink
    shrink.check_reproducer(sys.modules[__name__])
    print("ok")
