"""Gluon names that differ between the triton releases the Hopper kernels support (3.6 and 3.9).

    tma_load        TMA copy global -> shared, completing on an mbarrier
                    (3.6: tma.async_copy_global_to_shared; 3.9: tma.async_load, the old name raises)
    tma_store       TMA copy shared -> global
                    (3.6: tma.async_copy_shared_to_global; 3.9: tma.async_store)
    thread_barrier  a barrier over the warps running the code (bar.sync)
                    (3.6: gl.thread_barrier; 3.9: gl.barrier)
    tma_reduce_add  TMA reduce-add shared -> global (3.9: tma.async_atomic_add; 3.6: no Gluon function, but its
                    op builder has the op that 3.9's function emits, so the same op is built here)
    tma_wait_writes wait until this thread's TMA stores and reduce-adds are written to global memory, not only
                    read from shared memory (3.9: tma.store_wait(0, read_only=False); 3.6's store_wait has
                    only the read wait, so the PTX wait is inline here)
    smem_reinterpret
                    a shared-memory descriptor seen with another dtype, shape and layout
                    (3.6: desc._reinterpret; 3.9: desc.reinterpret, the old name gone); a builtin here
    RS_OPERAND_COPIES
                    True where the lowering of a wgmma whose A operand is in registers copies each A register
                    (a mov) before the wgmma (3.9, upstream triton #9514 / #9530 for a register hazard of
                    pipelined wgmmas; 3.6 passes them as they are). Where the A operand stays live after the
                    product (Q and dO held across the split backward's key loop), ptxas 13.4 (3.9's for sm90)
                    spilled with the copies and not without them; ptxas 12.8 and 13.0 did not spill either way

Everything else the kernels use is spelled the same in both. Import only where Gluon exists
(ops/common/tma.py: `gluon_available`).
"""
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import _unwrap_if_constexpr, builtin
from triton.experimental.gluon.language.nvidia.hopper import tma

if hasattr(tma, "async_load"):  # 3.9
    tma_load, tma_store = tma.async_load, tma.async_store
else:  # 3.6
    tma_load, tma_store = tma.async_copy_global_to_shared, tma.async_copy_shared_to_global
if hasattr(tma, "async_atomic_add"):  # 3.9
    tma_reduce_add = tma.async_atomic_add

    @gluon.jit
    def tma_wait_writes():
        tma.store_wait(0, read_only=False)
else:  # 3.6
    @builtin
    def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """Adds the shared-memory tile src into tensor_desc's box at coord (one elected thread issues it)."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                  src.handle)

    @gluon.jit
    def tma_wait_writes():
        # every lane runs it; the bulk groups are per thread, so the lane that issued the copies is the one waiting
        gl.inline_asm_elementwise("cp.async.bulk.wait_group 0; mov.b32 $0, 0;", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
thread_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier


@builtin
def smem_reinterpret(desc, dtype, shape, layout, _semantic=None):
    """desc (a shared-memory descriptor) seen as `shape` elements of `dtype` in `layout`: the same semantic call
    both releases' methods make."""
    shape = [_unwrap_if_constexpr(s) for s in _unwrap_if_constexpr(shape)]
    return _semantic.memdesc_reinterpret(desc, _unwrap_if_constexpr(dtype), shape, _unwrap_if_constexpr(layout))


RS_OPERAND_COPIES = hasattr(tma, "async_load")  # (3.9: see above)
