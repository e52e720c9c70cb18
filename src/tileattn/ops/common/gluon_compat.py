"""Gluon names that differ between the triton releases the Hopper kernels support (3.6 and 3.9).

    tma_load        TMA copy global -> shared, completing on an mbarrier
                    (3.6: tma.async_copy_global_to_shared; 3.9: tma.async_load, the old name raises)
    tma_store       TMA copy shared -> global
                    (3.6: tma.async_copy_shared_to_global; 3.9: tma.async_store)
    thread_barrier  a barrier over the warps running the code (bar.sync)
                    (3.6: gl.thread_barrier; 3.9: gl.barrier)
    tma_reduce_add  TMA reduce-add shared -> global (3.9: tma.async_atomic_add, with tma.store_wait's read_only
                    argument to wait for the writes; 3.6 has neither: None). TMA_REDUCE says which; kernels
                    call it under a constexpr flag

Everything else the kernels use is spelled the same in both. Import only where Gluon exists
(ops/common/tma.py: `gluon_available`).
"""
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma

if hasattr(tma, "async_load"):  # 3.9
    tma_load, tma_store = tma.async_load, tma.async_store
else:  # 3.6
    tma_load, tma_store = tma.async_copy_global_to_shared, tma.async_copy_shared_to_global
tma_reduce_add = getattr(tma, "async_atomic_add", None)
TMA_REDUCE = tma_reduce_add is not None
thread_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
