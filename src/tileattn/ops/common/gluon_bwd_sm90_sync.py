"""The Hopper backward's signals between programs and between kernels (gluon_bwd_sm90.py): counters waited for and
counted up across the grid (the dQ turns, the done counts), and the two halves of
programmatic dependent launch (the wait for the preprocess before the kernel, the go-ahead to the dQ conversion
after it)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .bwd_kernels import wait_count_ptx

_WAIT_TURN = gl.constexpr(wait_count_ptx(64))


@gluon.jit
def wait_count(sem, target):
    """Until the counter at sem reaches target (bwd_kernels.wait_count_ptx: lane 0 polls with a 64 ns back-off,
    the warp barrier orders the warp's later memory operations after it). A turn counter only rises one add at a
    time and no add past this one's can come first, so reaching the target is reading it."""
    gl.inline_asm_elementwise(_WAIT_TURN, "=r,l,r", [sem, target], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def release_add(sem):
    """After the warp barrier (every lane's stores ordered before it), lane 0 adds 1 to the counter (release)."""
    gl.inline_asm_elementwise(
        "{ .reg .pred %p<1>; .reg .b32 %l<1>; bar.warp.sync -1; mov.u32 %l0, %laneid; setp.eq.u32 %p0, %l0, 0; "
        "@%p0 red.release.gpu.global.add.s32 [$1], 1; mov.b32 $0, 0; }", "=r,l", [sem], dtype=gl.int32,
        is_pure=False, pack=1)


@gluon.jit
def grid_dependency_wait():
    """Waits until the kernel this one was launched after with programmatic dependent launch (the backward's
    preprocess: delta, the zeroed counters) has completed and its writes are visible (returns at once without
    such a launch). The loader, the dQ writers and the delta programs call it."""
    gl.inline_asm_elementwise("griddepcontrol.wait; mov.b32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def launch_dependents():
    """Lets a kernel launched after this one with programmatic dependent launch (the dQ conversion) start once
    every program of this grid has run this (or exited), instead of once the grid is done."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.b32 $0, 0;", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)
