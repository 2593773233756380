"""polyc fuzz reproducer (refusal): CompileError: band member 0 of a GPU kernel starts at [N, K] -> { [(1 - N)] : N > 0 and K >= 2 }: only constant lower bounds are mapped

Fixed: a band member whose first value depends on the sizes is left a loop in the
thread instead of refusing the program (it cannot number blocks from it).

seed 317; found by tests/fuzz (python3 tests/fuzz/campaign.py). Run: python3 {this file}
"""
import numpy as np

SOURCE = 'def f(float32(N, K) B) -> (O1, O2) {\n  O1(i, j, h) max=! B(r, i) where h in 0:N, j in 0:K - 1\n  O2(i, j) *=! B(j, r) + O1(i, r, r) + O1(i - 1, r, r)\n}\n'
ENTRY = 'f'
EINSUM = None
OPTIONS = {'target': 'cuda', 'emulate': True, 'fusion': 'max', 'specialize': False, 'gpu_register_tile': True, 'gpu_block': None}
INPUTS = [np.array([[1.0]], dtype='float32')]
#: the interpreter's outputs (tests/fuzz/interp.py) and where they are numerically stable
EXPECTED = [np.array([[]], dtype="float32").reshape((1, 0, 1)), np.array([[0.0]], dtype='float32')]
STABLE = [np.array([[]], dtype='bool').reshape((1, 0, 1)), np.array([[True]], dtype='bool')]
KIND = 'refusal'
MESSAGE = 'CompileError: band member 0 of a GPU kernel starts at [N, K] -> { [(1 - N)] : N > 0 and K >= 2 }: only constant lower bounds are mapped'
#: set to a string while the bug is known and not fixed (the regression test then xfails)
OPEN = None



if __name__ == "__main__":  # the check is tests/fuzz/shrink.py's check_reproducer
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shrink
    shrink.check_reproducer(sys.modules[__name__])
    print("ok")
