"""The GPU mapping (``polyc.schedule.gpu_map``): kernels, blocks/threads, legality, shared
memory decisions; no compiler involved."""
from __future__ import annotations

import islpy as isl
import pytest
from test_e2e_numpy import CASES

import polyc
from polyc.deps import compute_dependences
from polyc.frontend import from_tc
from polyc.schedule.gpu_map import block_sizes, map_to_gpu
from polyc.schedule.scheduler import compute_schedule

CUDA = polyc.Options(target="cuda")


def mapped(case, sizes, options=CUDA, edit=None):
    kernel = from_tc(CASES[case][0])
    kernel = kernel.specialize(dict(zip(kernel.sizes, sizes)))
    deps = compute_dependences(kernel)
    sched = compute_schedule(kernel, deps, options)
    if edit is not None:
        sched = edit(sched)
    return map_to_gpu(kernel, deps, sched, options)


def test_matmul_maps_n_to_x_and_m_to_y_and_keeps_k_in_the_thread():
    init, update = mapped("matmul", (70, 37, 130))
    for gk in (init, update):
        assert [(d.axis, d.member) for d in gk.dims] == [("x", 1), ("y", 0)]
        assert gk.block == (32, 8, 1)
    assert [sa.array for sa in update.shared] == ["A", "B"]
    # a register tile of 2 x 4 points per thread: 32 x 64 elements of C per block
    assert [(d.tile, d.block) for d in update.dims] == [(64, 32), (32, 8)]
    assert [sa.box for sa in update.shared] == [(32, 32), (32, 64)]
    assert update.private is not None and update.private.array == "C"
    assert update.private.axes == (1, 0) and update.private.points == (4, 2)
    assert init.shared == () and init.private is None
    # without the register tile: one point per thread
    _, plain = mapped("matmul", (70, 37, 130), CUDA.replace(gpu_register_tile=False))
    assert [(d.tile, d.block) for d in plain.dims] == [(32, 32), (8, 8)]
    assert [sa.box for sa in plain.shared] == [(8, 32), (32, 32)] and plain.private is None


def test_fused_statements_make_one_kernel_split_ones_several():
    assert len(mapped("softmax", (37, 130))) == 6
    assert len(mapped("softmax", (37, 130), CUDA.replace(fusion="max"))) < 6
    (one,) = mapped("matmul", (70, 37, 130), CUDA.replace(fusion="max"))
    assert set(one.statements) == {"S0", "S1"}


def test_conv_maps_w_h_f_and_runs_the_batch_in_the_thread():
    _, update = mapped("conv2d_stride1", (2, 3, 40, 41, 5, 3, 3))
    assert [(d.axis, d.member) for d in update.dims] == [("x", 3), ("y", 2), ("z", 1)]
    assert update.block == (32, 4, 2)


def test_a_member_that_carries_a_dependence_is_not_mapped():
    def forge(sched):  # claim that the reduction loop k of S1 is parallel
        node = sched.get_root().child(0).child(1).child(0)
        assert node.get_type() == isl.schedule_node_type.band
        return node.band_member_set_coincident(2, 1).get_schedule()

    _, update = mapped("matmul", (70, 37, 130), edit=forge)
    assert [(d.axis, d.member) for d in update.dims] == [("x", 1), ("y", 0)]
    assert "[2] flagged coincident but carrying a dependence" in update.note


def test_no_parallel_loop_means_one_thread():
    kernel = from_tc("""
def total(float(N) X) -> (s) {
    s +=! X(i)
}""").specialize({"N": 100})
    deps = compute_dependences(kernel)
    kernels = map_to_gpu(kernel, deps, compute_schedule(kernel, deps, CUDA), CUDA)
    assert all(gk.dims == () and gk.block == (1, 1, 1) for gk in kernels)
    assert all("one thread" in gk.note for gk in kernels)


def test_block_size_rule():
    assert block_sizes([7], None) == [32]
    assert block_sizes([130], None) == [160]
    assert block_sizes([1000], None) == [256]
    assert block_sizes([1000, 3], None) == [32, 4]
    assert block_sizes([1000, 1000, 1], None) == [32, 4, 1]
    assert block_sizes([5, 5], (64, 4)) == [64, 4]
    with pytest.raises(polyc.CompileError):
        block_sizes([5, 5], (64, 32))


def test_shared_memory_fits_48k():
    _, update = mapped("matmul", (700, 700, 700), CUDA.replace(gpu_block=(32, 32)))
    assert sum(sa.nbytes for sa in update.shared) <= 48 * 1024
    no_shared = mapped("matmul", (70, 37, 130), CUDA.replace(gpu_shared=False))
    assert all(gk.shared == () for gk in no_shared)


def test_the_shared_mark_is_named_alike_in_both_layers():
    from polyc.codegen import cuda
    from polyc.schedule import gpu_map
    assert gpu_map.SHARED_MARK == cuda.SHARED_MARK
