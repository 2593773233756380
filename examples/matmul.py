"""Matrix multiplication written in the TC language, compiled by polyc, checked against numpy."""
import numpy as np

import polyc

matmul = polyc.define("""
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}""")

rng = np.random.default_rng(0)
A = rng.standard_normal((300, 130), dtype=np.float32)
B = rng.standard_normal((130, 257), dtype=np.float32)
C = matmul(A, B)
print(matmul.schedule)
print(matmul.c_source)
err = np.abs(C - A @ B).max()
print(f"matmul {A.shape} x {B.shape}: max |polyc - numpy| = {err:.2e}")
assert err < 1e-3
