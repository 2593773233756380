"""polyc fuzz reproducer (crash): Error: call to isl_multi_union_pw_aff_from_union_map failed: cannot extract range space from empty input in /project/isl/isl_aff.c:8771

Fixed: the Pluto scheduler skips the band of statements that run for no sizes of the
context instead of failing to build it from an empty map.

seed 9037; found by tests/fuzz (python3 tests/fuzz/campaign.py). Run: python3 {this file}
"""
import numpy as np

SOURCE = 'def f(float(K, P) X) -> O1 {\n  O1(i, j, h) +=! X(j + r, j - 1) where r in 0:K, i in 0:K, h in 0:P - 1\n}\n'
ENTRY = 'f'
EINSUM = None
OPTIONS = {'fusion': 'smart', 'tile': True, 'specialize': True, 'threads': 1, 'register_tile': True, 'scheduler': 'pluto'}
INPUTS = [np.array([[1.0]], dtype='float32')]
#: the interpreter's outputs (tests/fuzz/interp.py) and where they are numerically stable
EXPECTED = [np.array([[[]]], dtype='float32').reshape((1, 1, 0))]
STABLE = [np.array([[[]]], dtype='bool').reshape((1, 1, 0))]
KIND = 'crash'
MESSAGE = 'Error: call to isl_multi_union_pw_aff_from_union_map failed: cannot extract range space from empty input in /project/isl/isl_aff.c:8771'
#: set to a string while the bug is known and not fixed (the regression test then xfails)
OPEN = None



if __name__ == "__main__":  # the check is tests/fuzz/shrink.py's check_reproducer
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shrink
    shrink.check_reproducer(sys.modules[__name__])
    print("ok")
