"""2x2 max pooling with stride 2 (NCHW), written in the TC language; checked against numpy."""
import numpy as np

import polyc

pool = polyc.define("""
def maxpool(float(N,C,H,W) I) -> (O) {
    O(n,c,h,w) max=! I(n,c,2*h+kh,2*w+kw) where kh in 0:2, kw in 0:2
}""")

rng = np.random.default_rng(0)
I = rng.standard_normal((2, 3, 9, 12), dtype=np.float32)
O = pool(I)
print(pool.c_source)
ref = I[:, :, :8, :12].reshape(2, 3, 4, 2, 6, 2).max(axis=(3, 5))
print(f"maxpool {O.shape}: max |polyc - numpy| = {np.abs(O - ref).max():.2e}")
assert O.shape == ref.shape and np.array_equal(O, ref)
