"""Batched matrix multiplication (TC language and the einsum form), checked against numpy."""
import numpy as np

import polyc

bmm = polyc.define("""
def bmm(float(B,M,K) X, float(B,K,N) Y) -> (Z) {
    Z(b,m,n) +=! X(b,m,k) * Y(b,k,n)
}""")

rng = np.random.default_rng(0)
X = rng.standard_normal((4, 37, 50), dtype=np.float32)
Y = rng.standard_normal((4, 50, 23), dtype=np.float32)
Z = bmm(X, Y)
print(bmm.c_source)
ref = X @ Y
print(f"bmm: max |polyc - numpy| = {np.abs(Z - ref).max():.2e}")
E = polyc.einsum("bij,bjk->bik", X, Y)
print(f"einsum('bij,bjk->bik'): max |polyc - numpy| = {np.abs(E - ref).max():.2e}")
assert np.allclose(Z, ref, atol=1e-3) and np.allclose(E, ref, atol=1e-3)
