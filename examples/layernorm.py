"""Layer normalization over the last axis, with sizes used as values; checked against numpy."""
import numpy as np

import polyc

layernorm = polyc.define("""
def layernorm(float(N,D) X, float(D) gamma, float(D) beta) -> (Y) {
    mean(n) +=! X(n,d) / D
    var(n) +=! (X(n,d) - mean(n)) * (X(n,d) - mean(n)) / D
    Y(n,d) = (X(n,d) - mean(n)) / sqrt(var(n) + 1e-5) * gamma(d) + beta(d)
}""")

rng = np.random.default_rng(0)
X = rng.standard_normal((7, 130), dtype=np.float32)
gamma = rng.standard_normal(130, dtype=np.float32)
beta = rng.standard_normal(130, dtype=np.float32)
Y = layernorm(X, gamma, beta)
print(layernorm.c_source)
mu = X.mean(axis=1, keepdims=True)
ref = (X - mu) / np.sqrt(X.var(axis=1, keepdims=True) + 1e-5) * gamma + beta
print(f"layernorm {Y.shape}: max |polyc - numpy| = {np.abs(Y - ref).max():.2e}")
assert np.allclose(Y, ref, atol=1e-4)
