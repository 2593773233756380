"""Row-wise softmax: several statements with temporaries; checked against numpy."""
import numpy as np

import polyc

softmax = polyc.define("""
def softmax(float(N,C) X) -> (Y) {
    mx(n) max=! X(n,c)
    e(n,c) = exp(X(n,c) - mx(n))
    s(n) +=! e(n,c)
    Y(n,c) = e(n,c) / s(n)
}""")

rng = np.random.default_rng(0)
X = rng.standard_normal((37, 130), dtype=np.float32) * 4
Y = softmax(X)
print(softmax.c_source)
ex = np.exp(X - X.max(axis=1, keepdims=True))
ref = ex / ex.sum(axis=1, keepdims=True)
print(f"softmax {Y.shape}: max |polyc - numpy| = {np.abs(Y - ref).max():.2e}")
assert np.allclose(Y, ref, atol=1e-6)
