"""Integer dot products: the dot-product form of register tiles
(``polyc.schedule.register_tile.plan_dot``) and quantized convolutions computed on the
integers (``polyc.frontend.onnx_passes.convs_as_dot_products``).

Every kernel is checked against numpy or onnxruntime on sizes that are not multiples of
the register tile, on each scheduler option; where the CPU has VNNI, the generated C is
checked to compile into ``vpdpbusd``.
"""
from __future__ import annotations

import re
import subprocess

import islpy as isl
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyc
from polyc import expr as E
from polyc.schedule import machine

NT = ("def nt({a}(M,K) A, {b}(N,K) B) -> (C) "
      "{{ C(m,n) +=! {acc}(A(m,k)) * {acc}(B(n,k)) }}")
OPTIONS = {
    "default": polyc.Options(),
    "pluto": polyc.Options(scheduler="pluto"),
    "fusion-min": polyc.Options(fusion="min"),
    "no-tile": polyc.Options(tile=False),
    "tile-8": polyc.Options(tile=(8, 8, 8)),
    "no-register-tile": polyc.Options(register_tile=False),
    "register-3x5": polyc.Options(register_tile=(3, 5)),
    "no-vectorize": polyc.Options(vectorize=False),
    "serial": polyc.Options(parallel=False),
}


def _operands(a: str, b: str, m: int, n: int, k: int, seed: int = 0):
    rng = np.random.default_rng(seed)

    def draw(dt: str, shape):
        info = np.iinfo(dt)
        return rng.integers(info.min, int(info.max) + 1, shape).astype(dt)
    return draw(a, (m, k)), draw(b, (n, k))


@pytest.mark.parametrize("shape", [(37, 13, 70), (64, 64, 64), (5, 3, 200), (1, 9, 1)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("opt", list(OPTIONS), ids=str)
def test_int8_matmul_contiguous_reduction(shape, opt):
    """``C(m,n) +=! A(m,k) * B(n,k)`` on uint8 x int8, int32 sums: exact on every
    option, at sizes that leave partial register tiles."""
    m, n, k = shape
    op = polyc.define(NT.format(a="uint8", b="int8", acc="int32"), options=OPTIONS[opt])
    a, b = _operands("uint8", "int8", m, n, k)
    np.testing.assert_array_equal(op(a, b), a.astype(np.int32) @ b.astype(np.int32).T)


@pytest.mark.parametrize("types", [("int8", "int8", "int32"), ("uint8", "uint8", "int32"),
                                   ("int16", "int16", "int32"), ("int8", "uint8", "int64")],
                         ids=lambda t: "-".join(t))
def test_integer_matmul_dtypes(types):
    a_t, b_t, acc = types
    op = polyc.define(NT.format(a=a_t, b=b_t, acc=acc))
    a, b = _operands(a_t, b_t, 23, 11, 131, seed=1)
    want = a.astype(acc) @ b.astype(acc).T
    np.testing.assert_array_equal(op(a, b), want)


def test_dot_form_for_integer_sums():
    """The integer sum gets a dot-product register tile (its reduction innermost, both
    tile loops unrolled inside it, no ``omp simd``: the C compiler vectorizes the sum)."""
    ints = polyc.define(NT.format(a="uint8", b="int8", acc="int32"))
    a, b = _operands("uint8", "int8", 64, 64, 256)
    ints(a, b)
    assert "register:" in str(ints.schedule) and '"simd"' not in str(ints.schedule)
    assert "polyc_acc[" in ints.c_source


def test_strided_reduction_is_not_a_dot():
    """``C(m,n) +=! A(k,m) * B(n,k)``: ``k`` walks A's rows, not a contiguous run, so
    there is no dot-product tile (the column form vectorizes ``n`` instead) -- and the
    result is exact all the same."""
    op = polyc.define("def tn(uint8(K,M) A, int8(N,K) B) -> (C) "
                      "{ C(m,n) +=! int32(A(k,m)) * int32(B(n,k)) }")
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (50, 21)).astype(np.uint8)
    b = rng.integers(-128, 128, (17, 50)).astype(np.int8)
    np.testing.assert_array_equal(op(a, b), a.T.astype(np.int32) @ b.astype(np.int32).T)
    assert 'mark: "simd"' in str(op.schedule)


def _gcc_major(cc: str) -> int:
    """gcc's major version (0 for another compiler or none)."""
    from polyc.codegen.toolchain import compiler_version
    try:
        if "clang" in compiler_version(cc).lower():
            return 0
        done = subprocess.run([cc, "-dumpversion"], capture_output=True, text=True)
    except Exception:  # noqa: BLE001 -- no compiler: the tests needing it skip
        return 0
    head = done.stdout.strip().split(".")[0]
    return int(head) if head.isdigit() else 0


def _assembly(source: str, tmp_path) -> str:
    from polyc.codegen.toolchain import compiler_flags
    options = polyc.Options()
    src = tmp_path / "kernel.c"
    src.write_text(source)
    flags = [f for f in compiler_flags(options) if f not in ("-shared", "-fPIC")]
    return subprocess.run([options.cc, *flags, "-S", "-o", "-", str(src)],
                          capture_output=True, text=True, check=True).stdout


VNNI = pytest.mark.skipif(
    not machine.has_integer_dot() or _gcc_major(polyc.Options().cc) < 12,
    reason="needs a CPU with VNNI and gcc 12 or later (its mixed-sign dot products)")


@VNNI
def test_vnni_instructions_are_emitted(tmp_path):
    """On a CPU with VNNI, gcc turns the dot-product tile of a uint8 x int8 sum into
    ``vpdpbusd``."""
    op = polyc.define(NT.format(a="uint8", b="int8", acc="int32"))
    a, b = _operands("uint8", "int8", 64, 64, 256)
    op(a, b)
    assert "vpdpbusd" in _assembly(op.c_source, tmp_path)


@VNNI
def test_quantized_convolution_kernel_uses_vnni(tmp_path):
    """The convolution of a quantized model, compiled for this CPU, is a dot-product
    register tile that gcc compiles to ``vpdpbusd``."""
    model = _qlinearconv_model((1, 32, 14, 14), (64, 32, 3, 3), dict(pads=[1, 1, 1, 1]))
    compiled = polyc.compile_onnx(model)
    text = compiled.c_source
    assert "polyc_acc[" in text
    assert "vpdpbusd" in _assembly(text, tmp_path)


# -- quantized convolutions -------------------------------------------------------------

def _qlinearconv_model(x_shape, w_shape, attrs, x_type=TensorProto.UINT8, relu=False,
                       bias=True, seed=0):
    rng = np.random.default_rng(seed)
    m = w_shape[0]
    x_int8 = x_type == TensorProto.INT8
    w = rng.integers(-127, 128, w_shape).astype(np.int8)
    inits = [
        numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
        numpy_helper.from_array(np.array(-3 if x_int8 else 121, np.int8 if x_int8 else np.uint8),
                                "xz"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(rng.uniform(0.001, 0.01, m).astype(np.float32), "ws"),
        numpy_helper.from_array(np.zeros(m, np.int8), "wz"),
        numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
        numpy_helper.from_array(np.array(7 if x_int8 else 128, np.int8 if x_int8 else np.uint8),
                                "yz"),
    ]
    ins = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if bias:
        inits.append(numpy_helper.from_array(
            rng.integers(-5000, 5000, m).astype(np.int32), "b"))
        ins.append("b")
    node = helper.make_node("QLinearConv", ins, ["y"], **attrs)
    graph = helper.make_graph([node], "qconv", [helper.make_tensor_value_info(
        "x", x_type, list(x_shape))], [helper.make_tensor_value_info("y", x_type, None)],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return onnx.shape_inference.infer_shapes(model)


CONVS = {
    "3x3-pad": ((1, 16, 13, 11), (24, 16, 3, 3), dict(pads=[1, 1, 1, 1])),
    "1x1": ((2, 32, 7, 9), (20, 32, 1, 1), {}),
    "7x7-stride2": ((1, 3, 23, 23), (8, 3, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2])),
    "3x3-stride2-asym": ((1, 8, 10, 9), (6, 8, 3, 3), dict(pads=[0, 1, 2, 1], strides=[2, 2])),
    "dilated": ((1, 5, 12, 12), (7, 5, 3, 3), dict(pads=[2, 2, 2, 2], dilations=[2, 2])),
    "conv1d": ((2, 6, 19), (5, 6, 4), dict(pads=[1, 2])),
    # at least 16 output channels: channel-last, the output channels on the lanes
    "3x3-stride2-wide": ((1, 12, 11, 10), (40, 12, 3, 3), dict(pads=[1, 1, 1, 1],
                                                                strides=[2, 2])),
    "1x1-stride2": ((1, 16, 9, 9), (32, 16, 1, 1), dict(strides=[2, 2])),
    "5x5-odd-channels": ((2, 5, 9, 8), (17, 5, 5, 5), dict(pads=[2, 2, 2, 2])),
    "1x1-wide": ((1, 64, 5, 7), (80, 64, 1, 1), {}),
    "1x1-padded-rows": ((1, 8, 3, 5), (256, 8, 1, 1), {}),
    "dilated-wide": ((1, 8, 12, 11), (24, 8, 3, 3), dict(pads=[2, 1, 2, 1],
                                                          dilations=[2, 2])),
    # an RGB stem: its input padded to whole quads with the zero point (QUAD_INPUT)
    "7x7-stride2-rgb": ((1, 3, 23, 21), (16, 3, 7, 7), dict(pads=[3, 3, 3, 3],
                                                             strides=[2, 2])),
}


@pytest.fixture(params=[True, False], ids=["quads", "rows"])
def both_paths(monkeypatch, request):
    """Compile a model twice: on the integers with dot products (in the byte quads of
    512-bit VNNI, and in rows along the reduction: whatever this CPU has, the C is
    correct), and without them."""
    monkeypatch.setattr(machine, "has_vnni512", lambda: request.param)

    def compile_both(model):
        from polyc.frontend.onnx_passes import pass_stats
        monkeypatch.setattr(machine, "has_integer_dot", lambda: True)
        dot = polyc.compile_onnx(model)
        used = pass_stats()["conv_dot"]
        monkeypatch.setattr(machine, "has_integer_dot", lambda: False)
        plain = polyc.compile_onnx(model)
        assert pass_stats()["conv_dot"] == 0
        return dot, plain, used
    return compile_both


@pytest.mark.parametrize("case", list(CONVS), ids=str)
@pytest.mark.parametrize("x_type", [TensorProto.UINT8, TensorProto.INT8], ids=["u8", "s8"])
def test_qlinearconv_on_dot_products(both_paths, case, x_type):
    """A QLinearConv as patches + an integer matmul + requantization gives the direct
    integer convolution's result bit for bit, and onnxruntime's within one quantum."""
    x_shape, w_shape, attrs = CONVS[case]
    model = _qlinearconv_model(x_shape, w_shape, attrs, x_type)
    dot, plain, used = both_paths(model)
    assert used == 1
    # uint8 input, 512-bit VNNI, 16 output channels or more: channel-last, the weights'
    # vectors against the input's broadcast bytes (a 1x1 conv reads its input in place)
    channel_last = machine.has_vnni512() and x_type == TensorProto.UINT8 and \
        w_shape[0] >= 16 and len(x_shape) == 4
    assert bool(re.search(r"polyc_vnni_\w+_s\(&", dot.c_source)) == channel_last
    in_place = channel_last and case in ("1x1", "1x1-wide", "1x1-padded-rows")
    assert ("_patches" in dot.c_source) == (not in_place)
    assert ("_quads" in dot.c_source) == (channel_last and x_shape[1] % 4 != 0)
    # constant scales: the multiplier is computed at compile time, not per element
    assert "_multiplier[" in dot.c_source
    info = np.iinfo(np.uint8 if x_type == TensorProto.UINT8 else np.int8)
    x = np.random.default_rng(5).integers(info.min, int(info.max) + 1, x_shape) \
        .astype(info.dtype)
    got = dot.run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, plain.run(None, {"x": x})[0])
    want = _qlinearconv_reference(model, x)
    assert np.abs(got.astype(np.int32) - want.astype(np.int32)).max() <= 1


def _qlinearconv_reference(model, x):
    """The QLinearConv of ``model`` on ``x``, exact: onnxruntime's float Conv of the
    integers less their zero points (every partial sum an integer below 2**24, so exact
    in float32), then the requantization in double. Not onnxruntime's QLinearConv:
    without VNNI (AVX2's ``vpmaddubsw``) its uint8 kernel saturates 16-bit pair sums,
    134 quanta off on a Zen 2 EPYC; nor onnx's reference, which fails on 1-D convs."""
    import onnx_models as M
    node, = model.graph.node
    c = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    w = c["w"].astype(np.float32) - c["wz"].astype(np.float32).reshape(-1, *[1] * (x.ndim - 1))
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))]
    inits = [numpy_helper.from_array(w, "w")]
    if "b" in c:
        inits.append(numpy_helper.from_array(c["b"].astype(np.float32), "b"))
    conv = helper.make_node("Conv", ["x", "w"] + (["b"] if "b" in c else []), ["y"],
                            **{a.name: helper.get_attribute_value(a) for a in node.attribute})
    g = helper.make_graph([conv], "ref", ins, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    acc = M.onnxruntime_outputs(m, {"x": x.astype(np.float32) - np.float32(c["xz"])})[0]
    scale = (np.float64(c["xs"]) * c["ws"].astype(np.float64) / np.float64(c["ys"]))
    y = np.rint(acc.astype(np.float64) * scale.reshape(-1, *[1] * (x.ndim - 2))) + c["yz"]
    info = np.iinfo(c["yz"].dtype)
    return np.clip(y, info.min, info.max).astype(c["yz"].dtype)


def test_conv_without_constant_weights_stays_direct(both_paths):
    """Weights given at run time cannot be laid out at compile time: the direct integer
    convolution runs (and agrees)."""
    model = _qlinearconv_model((1, 4, 6, 6), (3, 4, 3, 3), dict(pads=[1, 1, 1, 1]))
    w = [i for i in model.graph.initializer if i.name == "w"][0]
    model.graph.initializer.remove(w)
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.INT8, [3, 4, 3, 3]))
    dot, plain, used = both_paths(model)
    assert used == 0
    feeds = {"x": np.full((1, 4, 6, 6), 200, np.uint8),
             "w": numpy_helper.to_array(w)}
    np.testing.assert_array_equal(dot.run(None, feeds)[0], plain.run(None, feeds)[0])


@pytest.mark.parametrize("change", ["weight-zero-point", "group"])
def test_refused_convolutions_stay_direct(both_paths, change):
    """What the rewrite does not take -- a non-zero weight zero point, groups -- runs as
    the direct integer convolution, with the same result."""
    model = _qlinearconv_model((1, 4, 6, 6), (4, 4, 3, 3), dict(pads=[1, 1, 1, 1]))
    inits = {i.name: i for i in model.graph.initializer}

    def replace(name, value):
        model.graph.initializer.remove(inits[name])
        model.graph.initializer.append(numpy_helper.from_array(value, name))
    if change == "weight-zero-point":
        replace("wz", np.array([0, 3, 0, -2], np.int8))
    else:
        replace("w", numpy_helper.to_array(inits["w"])[:, :2].copy())
        model.graph.node[0].attribute.append(helper.make_attribute("group", 2))
    dot, plain, used = both_paths(model)
    assert used == 0
    x = np.random.default_rng(2).integers(0, 256, (1, 4, 6, 6)).astype(np.uint8)
    np.testing.assert_array_equal(dot.run(None, {"x": x})[0], plain.run(None, {"x": x})[0])


def test_small_cnn_qdq_same_on_both_paths(both_paths):
    """A QDQ CNN (onnxruntime's quantizer): every fused convolution (its classifier's
    Gemm one too) on dot products gives what the exact float convolutions give, bit for
    bit."""
    import onnx_models as M
    model = M.small_cnn()
    q = M.quantize_qdq(model, [M.input_feeds(model, seed=s) for s in (3, 4)])
    dot, plain, used = both_paths(q)
    assert used == sum(n.op_type in ("Conv", "Gemm", "MatMul") for n in model.graph.node)
    feeds = M.input_feeds(model, seed=2)
    np.testing.assert_array_equal(dot.run(None, feeds)[0], plain.run(None, feeds)[0])


def test_exact_float_qdq_convs_requantize_channel_last(monkeypatch):
    """Without integer dot products a QDQ convolution sums exactly in float32, channel-
    last: its requantization (per output channel) runs channel-last too, in the copy-out
    of the conv's register tile, so no transposition is left between two convolutions
    and no requantization pass of its own; the result is the integer path's, bit for
    bit (26, 13 and 7 pixels a side: partial tiles of 6 or 7 rows)."""
    import onnx_models as M
    model = M.small_cnn(size=26)
    q = M.quantize_qdq(model, [M.input_feeds(model, seed=s) for s in (3, 4)])
    monkeypatch.setattr(machine, "has_integer_dot", lambda: False)
    plain = polyc.compile_onnx(q)
    # (a kernel may open with a target attribute: 512-bit vectors asked for)
    kernels = re.findall(r"^(?:__attribute__\S*\s+)?static int (polyc_k\w+)\((.*?)^}",
                         plain.c_source, re.M | re.S)
    names = [k for k, _ in kernels]
    convs = [(k, body) for k, body in kernels if re.search(r"_Conv_\d+$", k)]
    assert len(convs) == 3, names
    # each conv's register tiles are requantized as they are copied out: clamped into
    # int32, then narrowed to the bytes
    assert all("polyc_narrow[" in body for _, body in convs), names
    assert not any(k.endswith(("_requantize", "_to_nchw")) and "Gemm" not in k
                   for k in names), names
    monkeypatch.setattr(machine, "has_integer_dot", lambda: True)
    monkeypatch.setattr(machine, "has_vnni512", lambda: False)
    dot = polyc.compile_onnx(q)
    feeds = M.input_feeds(model, seed=2)
    np.testing.assert_array_equal(plain.run(None, feeds)[0], dot.run(None, feeds)[0])


def test_dot_tile_shapes_fit_the_registers():
    """Dot-product tiles: every accumulator is a vector register, so a shape (the
    tuner's column-form 8 x 64 included) is cut to fit them; for known extents the
    shape avoids a corner tile partial in both directions (its bound checks inside the
    reduction keep it scalar) and leaves few accumulators in partial tiles."""
    from polyc.schedule import register_tile as rt
    regs = rt._VECTOR_REGISTERS[rt.vector_bits()]
    for shape in [(8, 64), (14, 16), (6, 4), (1, 1)]:
        mr, nr = rt.fit_registers(*shape)
        assert mr * nr + min(mr, nr) + 1 <= regs or mr * nr == 1
        assert mr <= shape[0] and nr <= shape[1]
    for ext in [(64, 56), (64, 14), (256, 7), (512, 7), (3136, 64), (37, 13)]:
        mr, nr = rt.dot_shape(*ext)
        assert rt.fit_registers(mr, nr) == (mr, nr)
        assert mr * nr >= 4
        assert not (ext[0] % mr and ext[1] % nr), (ext, mr, nr)
        partial = ext[0] * ext[1] - (ext[0] // mr * mr) * (ext[1] // nr * nr)
        assert partial <= ext[0] * ext[1] // 8, (ext, mr, nr)


GEMV = "def gemv(float(M,K) A, float(K) x) -> (y) { y(i) +=! A(i,k) * x(k) }"
SYRK = """def syrk(double(N,N) C_in, double(N,K) A) -> (double(N,N) C) {
    C(i,j) = (j <= i) ? 0.0 : C_in(i,j)
    C(i,j) += A(i,k) * A(j,k) where exists A(i - j, k)
}"""
EXACT = ("-ffp-contract=off",)


@pytest.mark.parametrize("opt", list(OPTIONS), ids=str)
@pytest.mark.parametrize("shape", [(37, 70), (130, 7), (3, 300), (64, 5000)],
                         ids=lambda s: "x".join(map(str, s)))
def test_float_matrix_vector_rows_keep_the_sum_order(opt, shape):
    """A float matrix-vector product gets the rows-only dot tile (independent chains side
    by side); each row still adds its terms in order, so the result is the untiled
    loop's bit for bit (compiled without contracting multiply-adds, which gcc does or
    not per loop shape) and numpy's within rounding."""
    m, k = shape
    rng = np.random.default_rng(m * k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal(k).astype(np.float32)
    op = polyc.define(GEMV, options=OPTIONS[opt].replace(cflags=EXACT))
    got = op(a, x)
    plain = polyc.define(GEMV, options=polyc.Options(register_tile=False, tile=False,
                                                     cflags=EXACT))(a, x)
    np.testing.assert_array_equal(got, plain)
    if opt in ("default", "pluto", "tile-8", "register-3x5", "serial", "fusion-min"):
        assert "register:" in str(op.schedule), opt
    np.testing.assert_allclose(got, a @ x, rtol=1e-4, atol=1e-4)


def test_float_dot_tiles_are_rows_only():
    """``y(i) +=! A(i,k) * x(k)`` is register-tiled in the dot form (rows only); a float
    ``C(m,n) +=! A(m,k) * B(n,k)`` left unpacked gets rows only too, never the two-sided
    tile (packed transposed, as it is where ``N`` passes the register tile's columns, 16
    on AVX2, it takes the column tile: :mod:`polyc.pack`)."""
    op = polyc.define(GEMV)
    a = np.ones((64, 256), np.float32)
    op(a, np.ones(256, np.float32))
    assert "register:" in str(op.schedule) and '"simd"' not in str(op.schedule)
    nt = polyc.define("def ntf(float(M,K) A, float(N,K) B) -> (C) "
                      "{ C(m,n) +=! A(m,k) * B(n,k) }",
                      options=polyc.Options(pack=False))
    nt(a, a)
    marks = [w for w in str(nt.schedule).split('"') if w.startswith("register:")]
    assert marks and all(m.split(":")[2].count(",") == 1 and
                         "1" in m.split(":")[2].split(",") for m in marks), marks


@pytest.mark.parametrize("opt", ["default", "pluto", "no-tile", "register-3x5"])
def test_triangular_float_sum_on_dot_rows(opt):
    """syrk's triangle (``j <= i``): rows-only dot tiles over a non-rectangular domain,
    bit for bit the untiled loop's sums."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((45, 33))
    c = rng.standard_normal((45, 45))
    got = polyc.define(SYRK, options=OPTIONS[opt].replace(cflags=EXACT))(c, a)
    plain = polyc.define(SYRK, options=polyc.Options(register_tile=False, tile=False,
                                                     cflags=EXACT))(c, a)
    np.testing.assert_array_equal(got, plain)
    want = np.where(np.tri(45, dtype=bool), a @ a.T, c)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_integer_matrix_vector_rows():
    """An int8 matrix-vector product: a rows-only dot tile, vectorized along the
    reduction; exact."""
    op = polyc.define("def gemv8(uint8(M,K) A, int8(K) x) -> (y) "
                      "{ y(i) +=! int32(A(i,k)) * int32(x(k)) }")
    a, _ = _operands("uint8", "int8", 45, 1, 333)
    x = np.random.default_rng(4).integers(-128, 128, 333).astype(np.int8)
    np.testing.assert_array_equal(op(a, x), a.astype(np.int32) @ x.astype(np.int32))
    assert "register:" in str(op.schedule) and '"simd"' not in str(op.schedule)


def test_dot_shapes_on_every_vector_width(monkeypatch):
    """The shapes fit the registers of AVX-512, AVX2 and SSE alike."""
    from polyc.schedule import register_tile as rt
    for bits in (512, 256, 128):
        monkeypatch.setattr(rt, "vector_bits", lambda b=bits: b)
        regs = rt._VECTOR_REGISTERS[bits]
        for ext in [(64, 56), (64, 14), (256, 7), (29, 29), (1000, 1)]:
            mr, nr = rt.dot_shape(*ext)
            assert mr * nr + min(mr, nr) + 1 <= regs and mr <= ext[0] and nr <= ext[1]


# -- byte dot products on 512-bit VNNI (the quad form) --------------------------------

QUAD = ("def quad(uint8(Q,P,4) X, int8({w}) W) -> (C) {{ C(m,p) +=! "
        + " + ".join(f"int32(X(q,p,{r})) * int32(W({{at}}{r}))" for r in range(4))
        + " }}")
#: the weights (Q, M, 4): a step's rows side by side (the convolutions' layout), and
#: (M, Q, 4): rows apart (a partial tile's extra rows must not read past the end)
QUAD_LAYOUTS = {"steps-rows": ("Q,M,4", "q,m,"), "rows-steps": ("M,Q,4", "m,q,")}
VNNI512 = pytest.mark.skipif(not machine.has_vnni512(), reason="needs AVX-512 VNNI")


def _quad(layout: str, options=None, sizes=None):
    """The byte dot product; ``sizes`` ``(Q, P, M)`` fixes them in its source (the
    micro-kernel takes its strides as constants)."""
    w, at = QUAD_LAYOUTS[layout]
    src = QUAD.format(w=w, at=at)
    if sizes is not None:
        for name, v in zip("QPM", sizes):
            src = src.replace(f"{name},", f"{v},").replace(f",{name})", f",{v})")
    return polyc.define(src, options=options)


def _quad_operands(q, p, m, layout, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (q, p, 4)).astype(np.uint8)
    w = rng.integers(-128, 128, (q, m, 4)).astype(np.int8)
    want = np.einsum("qpr,qmr->mp", x.astype(np.int64), w.astype(np.int64)).astype(np.int32)
    return x, (w if layout == "steps-rows" else np.ascontiguousarray(w.transpose(1, 0, 2))), want


QUAD_OPTIONS = {**OPTIONS,
                # tiles with partial rows (the default shapes divide the row count)
                "register-8x32": polyc.Options(register_tile=(8, 32)),
                "register-5x48": polyc.Options(register_tile=(5, 48)),
                "register-3x16": polyc.Options(register_tile=(3, 16))}


@pytest.mark.parametrize("shape", [(37, 23, 13), (16, 64, 6), (3, 100, 40), (1, 1, 1),
                                   (9, 49, 70)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", list(QUAD_LAYOUTS))
@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "symbolic"])
@pytest.mark.parametrize("opt", list(QUAD_OPTIONS), ids=str)
def test_byte_dot_product_is_exact(shape, layout, fixed, opt):
    """``C(m,p) +=! sum_r int32(X(q,p,r)) * int32(W(..,r))``: exact on every option, at
    sizes that leave partial tiles of rows and of lanes (masked), with the weights' rows
    side by side or apart; with its sizes fixed (the VNNI micro-kernel where the CPU has
    it: its strides are constants) and symbolic (the plain loops)."""
    q, p, m = shape
    x, w, want = _quad_operands(q, p, m, layout)
    op = _quad(layout, QUAD_OPTIONS[opt], sizes=shape if fixed else None)
    np.testing.assert_array_equal(op(x, w), want)
    if fixed and machine.has_vnni512() and opt in ("default", "register-5x48") and p > 1:
        assert "polyc_vnni_" in op.c_source


@VNNI512
@pytest.mark.parametrize("layout", list(QUAD_LAYOUTS))
def test_byte_dot_product_calls_the_vnni_micro_kernel(layout, tmp_path):
    """On a CPU with AVX-512 VNNI, the register tile of a byte dot product calls a
    ``vpdpbusd`` micro-kernel (full and partial rows); compiled for a target without
    VNNI, the plain loops behind the ``#else`` give the same sums."""
    op = _quad(layout, polyc.Options(register_tile=(8, 32)), sizes=(45, 70, 30))
    x, w, want = _quad_operands(45, 70, 30, layout, seed=2)
    np.testing.assert_array_equal(op(x, w), want)
    text = op.c_source
    assert "polyc_vnni_" in text and "_part(" in text and "#else" in text
    assert "vpdpbusd" in _assembly(text, tmp_path)
    cflags = polyc.Options().cflags + ("-mno-avx512vnni",)
    plain = _quad(layout, polyc.Options(cflags=cflags, register_tile=(8, 32)),
                  sizes=(45, 70, 30))
    np.testing.assert_array_equal(plain(x, w), want)


#: a batch-1 fully connected layer in quads: the lanes walk the weights' columns ``m``,
#: the write has no row but ``p``, of extent 1 (no band member)
FC_QUAD = ("def fc(uint8(Q,1,4) X, int8(Q,M,4) W) -> (C) { C(p,m) +=! "
           + " + ".join(f"int32(X(q,p,{r})) * int32(W(q,m,{r}))" for r in range(4)) + " }")


def _fc_quad(q, m, options=None, fixed=True):
    src = FC_QUAD.replace("Q,", f"{q},").replace("M,", f"{m},") if fixed else FC_QUAD
    rng = np.random.default_rng(q * 1000 + m)
    x = rng.integers(0, 256, (q, 1, 4)).astype(np.uint8)
    w = rng.integers(-128, 128, (q, m, 4)).astype(np.int8)
    want = np.einsum("qpr,qmr->pm", x.astype(np.int64), w.astype(np.int64)).astype(np.int32)
    return polyc.define(src, options=options), x, w, want


FC_OPTIONS = {**QUAD_OPTIONS, "threads-2": polyc.Options(threads=2)}


@pytest.mark.parametrize("shape", [(512, 1000), (37, 13), (3, 130), (1, 1), (20, 64)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("opt", list(FC_OPTIONS), ids=str)
def test_batch_one_byte_product_takes_one_row_tiles(shape, opt, monkeypatch):
    """A byte dot product whose band has no row member (a batch-1 classifier layer)
    gets register tiles of one row, its columns in up to four vectors of lanes: the
    sums stay in registers over the whole reduction (with VNNI, one ``vpdpbusd`` per
    vector and step instead of widened products lane by lane). Exact on every option,
    at column counts that leave masked partial tiles; the plan is made as on a CPU with
    VNNI, and where this CPU lacks it the plain loops behind the ``#else`` run."""
    from polyc.schedule import register_tile as rt
    monkeypatch.setattr(machine, "has_vnni512", lambda: True)
    q, m = shape
    op, x, w, want = _fc_quad(q, m, FC_OPTIONS[opt])
    np.testing.assert_array_equal(op(x, w), want)
    if opt in ("default", "threads-2") and q > 1 and m > 1:
        text = op.c_source
        assert "polyc_vnni_1x" in text and "int32_t polyc_acc[" in text
    k = op.kernel
    s = k.statements[-1]
    assert rt._quad_row(s, k, ["q", "m"], 1, [{"p"}, {"m"}],
                        polyc.Options()) is not None
    monkeypatch.setattr(rt, "QUAD_ONE_ROW", False)
    off, *_ = _fc_quad(q, m, FC_OPTIONS[opt])
    np.testing.assert_array_equal(off(x, w), want)
    assert "polyc_vnni_" not in off.c_source


def test_batch_one_byte_product_symbolic_sizes():
    """With its sizes symbolic the one-row tile runs the plain loops (the micro-kernel
    takes its strides as constants), exact."""
    op, x, w, want = _fc_quad(45, 70, fixed=False)
    np.testing.assert_array_equal(op(x, w), want)


@pytest.mark.parametrize("shape", [(512, 1000), (37, 13)], ids=lambda s: "x".join(map(str, s)))
def test_batch_one_byte_product_on_the_cuda_target(shape):
    """The CUDA target (no VNNI tile: a C-target form) gives the same sums, run by the
    CPU emulation."""
    q, m = shape
    _, x, w, want = _fc_quad(q, m)
    src = FC_QUAD.replace("Q,", f"{q},").replace("M,", f"{m},")
    cuda = polyc.define(src, target="cuda", emulate=True)
    np.testing.assert_array_equal(cuda(x, w), want)


def test_batch_one_byte_products_side_by_side(monkeypatch):
    """Two one-row tiles in one kernel (the nodes beside a tile's band are still found
    after it: the tile's band holds its column loop alone)."""
    monkeypatch.setattr(machine, "has_vnni512", lambda: True)
    prod = " + ".join(f"int32(X(q,p,{r})) * int32({{w}}(q,m,{r}))" for r in range(4))
    src = ("def fc2(uint8(50,1,4) X, int8(50,70,4) W, int8(50,70,4) V) -> (C, D) { "
           f"C(p,m) +=! {prod.format(w='W')}\n D(p,m) +=! {prod.format(w='V')} }}")
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (50, 1, 4)).astype(np.uint8)
    w, v = (rng.integers(-128, 128, (50, 70, 4)).astype(np.int8) for _ in range(2))
    op = polyc.define(src)
    c, d = op(x, w, v)
    for got, ws in ((c, w), (d, v)):
        np.testing.assert_array_equal(got, np.einsum(
            "qpr,qmr->pm", x.astype(np.int64), ws.astype(np.int64)).astype(np.int32))
    assert op.c_source.count("polyc_vnni_1x") >= 2


@pytest.mark.parametrize("threads", [1, 2])
def test_batch_one_quantized_mlp_matches_onnxruntime(threads, monkeypatch):
    """A quantized MLP on a batch of one (onnxruntime's QDQ quantizer): its layers are
    byte matrix-vector products, in one-row tiles (at widths that leave partial lane
    tiles), requantized in their copy-out; the output is onnxruntime's."""
    import onnx_models as M
    import onnxruntime as ort
    monkeypatch.setattr(machine, "has_vnni512", lambda: True)
    model = M.mlp(batch=1, d_in=300, hidden=200, d_out=37)
    q = M.quantize_qdq(model, [M.input_feeds(model, seed=s) for s in (3, 4)])
    compiled = polyc.compile_onnx(q, options=polyc.Options(threads=threads))
    assert compiled.c_source.count("polyc_vnni_1x") >= 3
    for seed in (5, 6):
        feeds = M.input_feeds(model, seed=seed)
        want = ort.InferenceSession(q.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        got = compiled.run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=0.03 * np.abs(want).max())


def test_vnni_micro_kernel_prefetches_its_lanes_stream():
    """Each step of a VNNI micro-kernel prefetches the lanes of a step some way ahead
    (the weight runs one row apart that the hardware prefetcher leaves exposed when a
    layer's weights are larger than the L2), one line per vector, and no further ahead
    than a few hundred cycles of work (a prefetch past the end never faults)."""
    from polyc.codegen.c_expr import vnni_kernel, vnni_prefetch_steps
    for mr, nv, xs in [(7, 3, 2112), (6, 4, 320), (1, 1, 64)]:
        text = vnni_kernel(mr, nv, xs, 4, 4608)
        ahead = vnni_prefetch_steps(mr, nv)
        assert 4 <= ahead <= 64
        lines = [ln for ln in text.splitlines() if "_mm_prefetch" in ln]
        assert [f"x + {ahead * xs + 64 * j}," in ln for j, ln in enumerate(lines)] \
            == [True] * nv
    assert vnni_prefetch_steps(7, 3) > vnni_prefetch_steps(8, 4)  # fewer cycles a step


def test_byte_dot_product_form():
    """``polyc.ir.quad_dot`` takes exactly the four products of a lane, uint8 times
    int8 (either order), the lanes walking the index before the group of four."""
    from polyc.ir import quad_dot
    k = _quad("steps-rows").kernel
    s = k.statements[-1]
    found = quad_dot(s, k, "p")
    assert found is not None and found.lanes.array == "X" and found.broadcast.array == "W"
    assert not found.signed_lanes
    # along m the int8 weights are the lanes, the uint8 input's bytes the broadcast
    along_m = quad_dot(s, k, "m")
    assert along_m is not None and along_m.signed_lanes
    assert along_m.lanes.array == "W" and along_m.broadcast.array == "X"
    assert quad_dot(s, k, "q") is None  # the reduction moves both operands
    for src in [
            # three products
            "def f(uint8(Q,P,4) X, int8(Q,M,4) W) -> (C) { C(m,p) +=! "
            + " + ".join(f"int32(X(q,p,{r})) * int32(W(q,m,{r}))" for r in range(3)) + " }",
            # a group of eight bytes
            "def f(uint8(Q,P,8) X, int8(Q,M,8) W) -> (C) { C(m,p) +=! "
            + " + ".join(f"int32(X(q,p,{r})) * int32(W(q,m,{r}))" for r in range(4)) + " }",
            # signed times signed
            "def f(int8(Q,P,4) X, int8(Q,M,4) W) -> (C) { C(m,p) +=! "
            + " + ".join(f"int32(X(q,p,{r})) * int32(W(q,m,{r}))" for r in range(4)) + " }",
            # the bytes of a product do not match
            "def f(uint8(Q,P,4) X, int8(Q,M,4) W) -> (C) { C(m,p) +=! "
            + " + ".join(f"int32(X(q,p,{r})) * int32(W(q,m,{3 - r}))" for r in range(4)) + " }"]:
        k = polyc.define(src).kernel
        assert quad_dot(k.statements[-1], k, "p") is None, src


def test_quad_tile_shapes():
    """The tile covers the fewest lane slots (masked partial tiles cost whole ones), or
    nearly so when larger, within 24 accumulator registers and 4 vectors a row."""
    from polyc.schedule.register_tile import quad_shape
    assert quad_shape(256, 196) == (16, 16)    # 13 vectors a row, not 4 tiles of 64
    assert quad_shape(3136, 64) == (6, 64)     # 3138 rows covered, in larger tiles
    assert quad_shape(64, 3136) == (6, 64)
    assert quad_shape(7, 3136) == (7, 48)      # 7 rows: no tile of 6 or 8 rows fits
    assert quad_shape(49, 512) == (7, 48)      # 49 of 49 rows, 528 of 512 lanes
    for m, p in [(64, 12544), (7, 5), (1000, 17), (None, None)]:
        mr, nr = quad_shape(m, p)
        assert nr % 16 == 0 and nr <= 64 and mr * nr // 16 <= 24


def test_flattened_element_iterators():
    """The copy-out of a tile over flat pixels ``p = 14*h + w`` gives ``h, w`` back; a
    ``w`` beyond a row does not."""
    from polyc.ir import element_iterators
    e = (E.Index("e0"),)
    its = element_iterators((E.Binary("+", E.Binary("*", E.Const(14), E.Index("h")),
                                      E.Index("w")),), ("h", "w"), e,
                            isl.Set("{ S[h, w] : 0 <= h < 14 and 0 <= w < 14 }"))
    assert its is not None
    for v in (0, 13, 14, 195):
        assert (E.evaluate(its["h"], {"e0": v}), E.evaluate(its["w"], {"e0": v})) == divmod(v, 14)
    assert element_iterators((E.Binary("+", E.Binary("*", E.Const(14), E.Index("h")),
                                       E.Index("w")),), ("h", "w"), e,
                             isl.Set("{ S[h, w] : 0 <= h < 14 and 0 <= w < 15 }")) is None


def _conv_pool_model(seed: int = 0) -> onnx.ModelProto:
    """Conv 3x3 (12 -> 32) + Relu, MaxPool 3x3 stride 2, Conv 1x1 (32 -> 48): float, for
    onnxruntime's quantizer."""
    rng = np.random.default_rng(seed)

    def init(name, shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["y"])]
    graph = helper.make_graph(
        nodes, "convpool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12, 15, 13])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 48, 8, 7])],
        [init("w1", (32, 12, 3, 3), 0.2), init("b1", (32,), 0.1),
         init("w2", (48, 32, 1, 1), 0.2), init("b2", (48,), 0.1)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_qdq_pool_runs_on_the_integers_channel_last(both_paths):
    """A QDQ model's MaxPool between a DequantizeLinear and a QuantizeLinear of the same
    scale and zero point pools the bytes (the same values: dequantization is increasing);
    between two channel-last byte convolutions it pools channel-last, with no
    transposition around it. Both paths agree bit for bit, and with onnxruntime's
    node-by-node float run within a quantum here and there."""
    import onnx_models as M
    from polyc.frontend.onnx_import import load_graph
    from polyc.frontend.onnx_passes import optimize_graph, pass_stats
    model = _conv_pool_model()
    feeds = [{"x": np.random.default_rng(s).standard_normal((1, 12, 15, 13)).astype(np.float32)}
             for s in range(3)]
    q = M.quantize_qdq(model, feeds[:2])
    dot, plain, used = both_paths(q)
    assert used == 2 and pass_stats()["pools_on_integers"] == 1
    got = dot.run(None, feeds[2])[0]
    np.testing.assert_array_equal(got, plain.run(None, feeds[2])[0])
    want = M.onnxruntime_outputs(q, feeds[2], optimize=False)[0]
    assert np.abs(got - want).max() <= 2 * np.abs(want).max() / 255
    # the CUDA target (emulated): the byte pool, off the dot products, the same values
    cuda = polyc.compile_onnx(q, target="cuda", emulate=True)
    np.testing.assert_array_equal(cuda.run(None, feeds[2])[0], plain.run(None, feeds[2])[0])
    graph = optimize_graph(load_graph(q, None), integer_dot=True,
                           byte_quads=machine.has_vnni512())
    pool, = [n for n in graph.nodes if n.op_type == "MaxPool"]
    assert graph.tensors[pool.inputs[0]].dtype == "uint8"
    ops = [n.op_type for n in graph.nodes]
    if machine.has_vnni512():  # (patched by the fixture) channel-last between the convs
        assert pool.attrs.get("polyc_layout") == "nhwc"
        assert ops.count("Transpose") == 2  # the input's and the output's
    else:
        assert "polyc_layout" not in pool.attrs and "Transpose" not in ops


def test_pool_stays_float_when_requantized_differently():
    """A MaxPool whose QuantizeLinear has another scale than its DequantizeLinear is left
    alone (quantizing the pooled floats again would round them)."""
    from polyc.frontend.onnx_import import load_graph
    from polyc.frontend.onnx_passes import optimize_graph, pass_stats
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["f"]),
             helper.make_node("MaxPool", ["f"], ["p"], kernel_shape=[2, 2]),
             helper.make_node("QuantizeLinear", ["p", "s2", "z"], ["y"])]
    graph = helper.make_graph(
        nodes, "pool", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 3, 5, 5])],
        [numpy_helper.from_array(np.array(0.1, np.float32), "s"),
         numpy_helper.from_array(np.array(0.3, np.float32), "s2"),
         numpy_helper.from_array(np.array(7, np.uint8), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    g = optimize_graph(load_graph(model, None))
    assert pass_stats()["pools_on_integers"] == 0
    pool, = [n for n in g.nodes if n.op_type == "MaxPool"]
    assert g.tensors[pool.inputs[0]].dtype == "float32"
    x = np.random.default_rng(0).integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
    import onnx_models as M
    got = polyc.compile_onnx(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, M.onnxruntime_outputs(model, {"x": x})[0])
