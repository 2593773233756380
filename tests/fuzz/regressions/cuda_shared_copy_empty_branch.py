"""polyc fuzz reproducer (crash): InternalError: shared memory promotion failed: the footprint of A is [R, P, polyc_b0, polyc_b1, polyc_t0, polyc_t1] -> {  }

Fixed: a fused CUDA kernel's shared-memory copy of an array at a mark where the
statements below do not read it (an empty footprint) is skipped instead of refused.

seed 131; found by tests/fuzz (python3 tests/fuzz/campaign.py). Run: python3 {this file}
"""
import numpy as np

SOURCE = 'def conv(float32(R, 5) A, float(P, R) B, float(P) X) -> (O1, float32(R, P) O2) {\n  T1(i, j, h) min=! X(i) where j in 0:B.0, exists B(h, i)\n  O1(i) min=! B(4, i)\n  O2(i, j) max=! T1(j + 1, j + r, i + 1) / (fabs(A(j, r) < B(r, j + 1) ? 0.5 * A.1 : cbrt(X(2 * j))) + 1) where i in 0:R - 1\n}\n'
ENTRY = 'conv'
EINSUM = None
OPTIONS = {'target': 'cuda', 'emulate': True, 'fusion': 'max', 'specialize': False, 'gpu_register_tile': True, 'gpu_block': None}
INPUTS = [np.array([[2.0, 0.0, 1.125, 1.125, 0.75], [1.75, 0.0, 0.5, -1.375, 0.375], [-0.875, -0.625, -0.25, 0.625, -1.75], [-1.75, 1.625, 0.875, 1.375, 1.875], [-0.625, 1.75, -1.5, -1.75, -2.0], [2.0, -1.375, 1.75, -1.25, -0.625], [-1.0, -1.625, 1.125, 0.875, 1.75], [2.0, 0.125, 0.75, 0.875, 0.875]], dtype='float32'), np.array([[2.0, 0.75, 1.125, -1.625, -1.25, -0.125, -0.75, 0.375], [0.25, -0.25, -1.625, 0.125, -1.5, -0.5, 2.0, 1.5], [-0.625, -1.625, 0.625, -1.5, 0.375, 1.375, -1.5, 0.25], [-1.25, 1.75, -0.5, -1.5, 0.625, -0.625, 0.125, -1.0], [0.875, 0.25, 0.75, -0.625, -0.125, -0.25, 1.125, -1.75], [0.625, -0.625, 0.25, 0.75, 2.0, -1.25, 0.0, 1.75]], dtype='float32'), np.array([2.0, -0.125, -0.25, -0.875, 0.125, 1.875], dtype='float32')]
#: the interpreter's outputs (tests/fuzz/interp.py) and where they are numerically stable
EXPECTED = [np.array([0.875, 0.25, 0.75, -0.625, -0.125, -0.25, 1.125, -1.75], dtype='float32'), np.array([[-0.0357142873108387, -0.0714285746216774, -0.25, 0.0, 0.0, 0.0], [-0.0357142873108387, -0.0714285746216774, -0.25, 0.0, 0.0, 0.0], [-0.0357142873108387, -0.0714285746216774, -0.25, 0.0, 0.0, 0.0], [-0.0357142873108387, -0.0714285746216774, -0.25, 0.0, 0.0, 0.0], [-0.0357142873108387, -0.0714285746216774, -0.25, 0.0, 0.0, 0.0], [-float('inf'), -float('inf'), -float('inf'), 0.0, 0.0, 0.0], [-float('inf'), -float('inf'), -float('inf'), 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], dtype='float32')]
STABLE = [np.array([True, True, True, True, True, True, True, True], dtype='bool'), np.array([[True, True, True, True, True, True], [True, True, True, True, True, True], [True, True, True, True, True, True], [True, True, True, True, True, True], [True, True, True, True, True, True], [True, True, True, True, True, True], [True, True, True, True, True, True], [True, True, True, True, True, True]], dtype='bool')]
KIND = 'crash'
MESSAGE = 'InternalError: shared memory promotion failed: the footprint of A is [R, P, polyc_b0, polyc_b1, polyc_t0, polyc_t1] -> {  }'
#: set to a string while the bug is known and not fixed (the regression test then xfails)
OPEN = None



if __name__ == "__main__":  # the check is tests/fuzz/shrink.py's check_reproducer
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shrink
    shrink.check_reproducer(sys.modules[__name__])
    print("ok")
