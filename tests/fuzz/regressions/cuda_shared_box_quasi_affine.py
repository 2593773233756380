"""polyc fuzz reproducer (crash): Error: call to isl_pw_aff_max_val failed: expecting integer affine expression in /project/isl/isl_ilp.c:379

Fixed: an array whose per-block footprint has a quasi-affine extent (strided reads) is
not promoted to shared memory instead of crashing in isl_pw_aff_max_val.

seed 340; found by tests/fuzz (python3 tests/fuzz/campaign.py). Run: python3 {this file}
"""
import numpy as np

SOURCE = 'def g(float32(Q, P) A) -> O3 {\n  T1(i, j) +=! A(r, j) + (A(j, 2 * r + i) + A(i, i + j))\n  O3(i, j) *=! 1.0 where i in 0:A.0, j in 0:A.0\n}\n'
ENTRY = 'g'
EINSUM = None
OPTIONS = {'target': 'cuda', 'emulate': True, 'fusion': 'smart', 'specialize': False, 'gpu_register_tile': True, 'gpu_block': None}
INPUTS = [np.array([[1.0]], dtype='float32')]
#: the interpreter's outputs (tests/fuzz/interp.py) and where they are numerically stable
EXPECTED = [np.array([[1.0]], dtype='float32')]
STABLE = [np.array([[True]], dtype='bool')]
KIND = 'crash'
MESSAGE = 'Error: call to isl_pw_aff_max_val failed: expecting integer affine expression in /project/isl/isl_ilp.c:379'
#: set to a string while the bug is known and not fixed (the regression test then xfails)
OPEN = None



if __name__ == "__main__":  # the check is tests/fuzz/shrink.py's check_reproducer
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shrink
    shrink.check_reproducer(sys.modules[__name__])
    print("ok")
