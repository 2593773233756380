"""2-D convolution, NCHW, stride 2, written in the TC language; checked against numpy."""
import numpy as np

import polyc

conv = polyc.define("""
def conv2d(float(N,C,H,W) I, float(F,C,KH,KW) Wt, float(F) bias) -> (O) {
    O(n,f,h,w) +=! I(n,c,2*h+kh,2*w+kw) * Wt(f,c,kh,kw)
    O(n,f,h,w) = O(n,f,h,w) + bias(f)
}""")

rng = np.random.default_rng(0)
I = rng.standard_normal((2, 3, 17, 19), dtype=np.float32)
Wt = rng.standard_normal((8, 3, 3, 3), dtype=np.float32)
bias = rng.standard_normal(8, dtype=np.float32)
O = conv(I, Wt, bias)
print(conv.c_source)

# numpy reference: gather the windows, contract with the weights
OH, OW = (17 - 3) // 2 + 1, (19 - 3) // 2 + 1
win = np.lib.stride_tricks.sliding_window_view(I, (3, 3), axis=(2, 3))[:, :, ::2, ::2]
ref = np.einsum("nchwij,fcij->nfhw", win, Wt) + bias[None, :, None, None]
assert O.shape == (2, 8, OH, OW), O.shape
print(f"conv2d {O.shape}: max |polyc - numpy| = {np.abs(O - ref).max():.2e}")
assert np.allclose(O, ref, atol=1e-3)
