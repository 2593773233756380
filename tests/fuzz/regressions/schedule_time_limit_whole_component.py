"""polyc fuzz reproducer (crash): timeout: polyc took more than 60 s

Fixed: scheduling a whole component (fusion='max') runs in a forked child killed after
polyc.schedule.scheduler.WHOLE_COMPONENT_SECONDS; isl's ILPs there ignore its operation
budget. The kernel then gets isl's default clustering, with a PolycWarning.

seed 410; found by tests/fuzz (python3 tests/fuzz/campaign.py). Run: python3 {this file}
"""
import numpy as np

SOURCE = 'def f(float32(K) B) -> (O1, O2) {\n  T1(i, j) max=! v1 where v1 = acos(sin(B(j)) * 0.875), i in 0:6\n  O1(i, j, h) max=! log10(fabs(T1(r, i) - 0.5) + 0.5) where j in 0:K, h in 0:5\n  O2(i) min=! O1(r, s, 5 - 1 - r) where s in 1:B.0, i in 0:K - 1\n  T1(i, j) = (!(i + 1 >= 0 && v0) ? 0 : B(i + 1)) + 1.0 where exists B(j), v0 = i + 1 < K\n}\n'
ENTRY = 'f'
EINSUM = None
OPTIONS = {'fusion': 'max', 'tile': True, 'specialize': True, 'threads': 1, 'register_tile': True}
INPUTS = [np.array([0.75, 0.25, -0.125, -1.125], dtype='float32')]
#: the interpreter's outputs (tests/fuzz/interp.py) and where they are numerically stable
EXPECTED = [np.array([[[-0.030702738091349602, -0.030702738091349602, -0.030702738091349602, -0.030702738091349602, -0.030702738091349602], [-0.030702738091349602, -0.030702738091349602, -0.030702738091349602, -0.030702738091349602, -0.030702738091349602], [-0.030702738091349602, -0.030702738091349602, -0.030702738091349602, -0.030702738091349602, -0.030702738091349602], [-0.030702738091349602, -0.030702738091349602, -0.030702738091349602, -0.030702738091349602, -0.030702738091349602]], [[0.13116630911827087, 0.13116630911827087, 0.13116630911827087, 0.13116630911827087, 0.13116630911827087], [0.13116630911827087, 0.13116630911827087, 0.13116630911827087, 0.13116630911827087, 0.13116630911827087], [0.13116630911827087, 0.13116630911827087, 0.13116630911827087, 0.13116630911827087, 0.13116630911827087], [0.13116630911827087, 0.13116630911827087, 0.13116630911827087, 0.13116630911827087, 0.13116630911827087]], [[0.2253362536430359, 0.2253362536430359, 0.2253362536430359, 0.2253362536430359, 0.2253362536430359], [0.2253362536430359, 0.2253362536430359, 0.2253362536430359, 0.2253362536430359, 0.2253362536430359], [0.2253362536430359, 0.2253362536430359, 0.2253362536430359, 0.2253362536430359, 0.2253362536430359], [0.2253362536430359, 0.2253362536430359, 0.2253362536430359, 0.2253362536430359, 0.2253362536430359]], [[0.3945855498313904, 0.3945855498313904, 0.3945855498313904, 0.3945855498313904, 0.3945855498313904], [0.3945855498313904, 0.3945855498313904, 0.3945855498313904, 0.3945855498313904, 0.3945855498313904], [0.3945855498313904, 0.3945855498313904, 0.3945855498313904, 0.3945855498313904, 0.3945855498313904], [0.3945855498313904, 0.3945855498313904, 0.3945855498313904, 0.3945855498313904, 0.3945855498313904]]], dtype='float32'), np.array([-0.030702738091349602, -0.030702738091349602, -0.030702738091349602], dtype='float32')]
STABLE = [np.array([[[True, True, True, True, True], [True, True, True, True, True], [True, True, True, True, True], [True, True, True, True, True]], [[True, True, True, True, True], [True, True, True, True, True], [True, True, True, True, True], [True, True, True, True, True]], [[True, True, True, True, True], [True, True, True, True, True], [True, True, True, True, True], [True, True, True, True, True]], [[True, True, True, True, True], [True, True, True, True, True], [True, True, True, True, True], [True, True, True, True, True]]], dtype='bool'), np.array([True, True, True], dtype='bool')]
KIND = 'crash'
MESSAGE = 'timeout: polyc took more than 60 s'
#: set to a string while the bug is known and not fixed (the regression test then xfails)
OPEN = None


if __name__ == "__main__":  # the check is tests/fuzz/shrink.py's check_reproducer
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shrink
    shrink.check_reproducer(sys.modules[__name__])
    print("ok")
