"""polyc fuzz reproducer (crash): InternalError: the shared-memory tiling of a GPU kernel breaks [polyc_b0, Q, R] -> { [32polyc_b0, 0, i2, 0, 0, 0] -> [32polyc_b0, 0, i2, o3, 0, 1] : 0 <= i2 < R and o3 >= 0 and ((Q >= 7 and o3 <= 5) or (Q <= 6 and o3 < Q)); [0, 0, 1, 0, 1, 0] -> [0, 0, 1, 5, 0, 2] : Q > 0 and R >= 2; [32polyc_b0, 0, 1, i3, 0, 1] -> [0, 0, 1, 5, 0, 2] : R >= 2 and i3 >= 0 and ((Q >= 7 and i3 <= 5) or (Q <= 6 and i3 < Q)); [32polyc_b0, 0, 1, 0, 0, 0] -> [0, 0, 1, 5, 0, 2] : Q > 0 and R >= 2 }

Fixed: when tiling a fused GPU kernel for shared memory would run a dependence out of
order (statements of several depths), the kernel is mapped without shared memory
instead of raising an InternalError.

seed 191; found by tests/fuzz (python3 tests/fuzz/campaign.py). Run: python3 {this file}
"""
import numpy as np

SOURCE = 'def g(float(6, Q, R) A, float32(Q, 6) B) -> (O2, O3) {\n  O2(i) min=! B(r, r) where i in 0:R\n  O3 *=! O2(1)\n}\n'
ENTRY = 'g'
EINSUM = None
OPTIONS = {'target': 'cuda', 'emulate': True, 'fusion': 'max', 'specialize': False, 'gpu_register_tile': True, 'gpu_block': (32, 2)}
INPUTS = [np.array([[[1.0]], [[1.0]], [[1.0]], [[1.0]], [[1.0]], [[1.0]]], dtype='float32'), np.array([[1.0, 1.0, 1.0, 1.0, 1.0, 1.0]], dtype='float32')]
#: the interpreter's outputs (tests/fuzz/interp.py) and where they are numerically stable
EXPECTED = [np.array([1.0], dtype='float32'), np.array(1.0, dtype='float32')]
STABLE = [np.array([True], dtype='bool'), np.array(True, dtype='bool')]
KIND = 'crash'
MESSAGE = 'InternalError: the shared-memory tiling of a GPU kernel breaks [polyc_b0, Q, R] -> { [32polyc_b0, 0, i2, 0, 0, 0] -> [32polyc_b0, 0, i2, o3, 0, 1] : 0 <= i2 < R and o3 >= 0 and ((Q >= 7 and o3 <= 5) or (Q <= 6 and o3 < Q)); [0, 0, 1, 0, 1, 0] -> [0, 0, 1, 5, 0, 2] : Q > 0 and R >= 2; [32polyc_b0, 0, 1, i3, 0, 1] -> [0, 0, 1, 5, 0, 2] : R >= 2 and i3 >= 0 and ((Q >= 7 and i3 <= 5) or (Q <= 6 and i3 < Q)); [32polyc_b0, 0, 1, 0, 0, 0] -> [0, 0, 1, 5, 0, 2] : Q > 0 and R >= 2 }'
#: set to a string while the bug is known and not fixed (the regression test then xfails)
OPEN = None



if __name__ == "__main__":  # the check is tests/fuzz/shrink.py's check_reproducer
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shrink
    shrink.check_reproducer(sys.modules[__name__])
    print("ok")
