"""polyc fuzz reproducer (crash): the case took more than 60 s (seed 9152)

Fixed: with generic sizes and fusion='max', tiling the fused band gave 9,195 lines of C
that gcc -O3 took minutes on; past polyc.pipeline.MAX_TILED_C_LINES the kernel is compiled
untiled, with a PolycWarning. (The campaign's 60 s alarm, a TimeoutError, had also been
caught as an OSError and reported as "cannot run the C compiler"; no longer.)
"""
import numpy as np

SOURCE = 'def f(float(M, Q) A) -> (O1, O2, O3) {\n  O1(i, j) = erfc(A(j - 1, i + 2)) + A(i + 2, i) / -0.25\n  O2(i, j) = O1(j, i) / 4 - -O1(i - 1, j + 1) where exists A(j, i)\n  O3(i, j, h) = -min(A(j, i - 1), 3) where h in 0:Q - 1\n  O2(i, j) +=! sqrt(fabs(v7 >= 0 && r + r < 1 ? O1(r + r, j) : 0) + 0.5) where v7 = r + r\n  O2(i, j) min=! A(r, i) * asin(sin(exp(O3(j, j, i))) * 0.875)\n}\n'
ENTRY = 'f'
EINSUM = None
OPTIONS = {'fusion': 'max', 'tile': True, 'specialize': False, 'threads': 1, 'register_tile': True}
INPUTS = [np.array([[0.375, 0.375, 1.25, 1.125, -1.125], [1.625, -1.875, 1.375, -1.0, -0.25], [0.125, 0.75, 1.125, -0.75, 1.625]], dtype='float32')]
#: the interpreter's outputs (tests/fuzz/interp.py) and where they are numerically stable
EXPECTED = [np.array([[0.0, -0.42290014028549194, -0.4481700658798218, -0.3883882164955139]], dtype='float32'), np.array([[0.1034458577632904], [-1.5516878366470337]], dtype='float32'), np.array([[[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], [[-0.375, -0.375, -0.375, -0.375], [-1.625, -1.625, -1.625, -1.625], [-0.125, -0.125, -0.125, -0.125]], [[-0.375, -0.375, -0.375, -0.375], [1.875, 1.875, 1.875, 1.875], [-0.75, -0.75, -0.75, -0.75]], [[-1.25, -1.25, -1.25, -1.25], [-1.375, -1.375, -1.375, -1.375], [-1.125, -1.125, -1.125, -1.125]], [[-1.125, -1.125, -1.125, -1.125], [1.0, 1.0, 1.0, 1.0], [0.75, 0.75, 0.75, 0.75]], [[1.125, 1.125, 1.125, 1.125], [0.25, 0.25, 0.25, 0.25], [-1.625, -1.625, -1.625, -1.625]]], dtype='float32')]
STABLE = [np.array([[True, True, True, True]], dtype='bool'), np.array([[True], [True]], dtype='bool'), np.array([[[True, True, True, True], [True, True, True, True], [True, True, True, True]], [[True, True, True, True], [True, True, True, True], [True, True, True, True]], [[True, True, True, True], [True, True, True, True], [True, True, True, True]], [[True, True, True, True], [True, True, True, True], [True, True, True, True]], [[True, True, True, True], [True, True, True, True], [True, True, True, True]], [[True, True, True, True], [True, True, True, True], [True, True, True, True]]], dtype='bool')]
KIND = 'crash'
MESSAGE = 'ToolchainError: C compiler failed (exit 127); source kept at /tmp/polyc-fuzz-cache-fy1tf6l3/f-0b99416b8af48eb08a58c076c6bfa46d.c\ncommand: gcc -O3 -march=native -fopenmp -shared -fPIC -std=c11 -ffp-contract=fast -o /tmp/polyc-fuzz-cache-fy1tf6l3/f-0b99416b8af48eb08a58c076c6bfa46d.octrfj6h.so.tmp /tmp/polyc-fuzz-cache-fy1tf6l3/f-0b99416b8af48eb08a58c076c6bfa46d.c -lm\ncannot run the C compiler: '
#: set to a string while the bug is known and not fixed (the regression test then xfails)
OPEN = None


if __name__ == "__main__":  # the check is tests/fuzz/shrink.py's check_reproducer
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shrink
    shrink.check_reproducer(sys.modules[__name__])
    print("ok")
