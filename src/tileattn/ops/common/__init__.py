"""What several ops share.

    backend.py         ordered backend tables: supports(problem) -> (ok, reason), forcing (TILEATTN_BACKEND,
                       force_backend), the skipped backends' reasons for `tileattn info` and debug logging
    knobs.py           the environment switches, read in one place
    masking.py         the visibility rule (key ranges, masks) and where a sequence's rows are   [Triton jit]
    softmax.py         base-2 online softmax steps, tanh, mantissa rounding                     [Triton jit]
    fp8.py             fp8 conventions: quantize_fp8, descales, the packed V layout (Fp8V)
    fp8_kernels.py     the packed V layout's key order and the kernel that packs V               [Triton jit]
    tma.py             tensor-descriptor (TMA) rules and Gluon descriptors for Hopper kernels
    gluon_attn_sm90.py the Hopper forward pipeline (FlashAttention-3's schedule) behind the dense and flex
                       Gluon kernels: shared memory, barriers, the partitions                   [Gluon jit]
    gluon_sm90_loader.py  its tile schedule (persistent rounds, key blocks of a tile) and TMA loader
                       partition                                                                [Gluon jit]
    gluon_sm90_consumer.py  its consumer warpgroups' partition: the pipelined key loop, the block
                       softmax, P and V operands, wgmma turns, the epilogue                     [Gluon jit]
    bwd_kernels.py     backward tile helpers and the delta preprocess kernel                    [Triton jit]
    configs.py         config tables more than one op reads (the backward's tiles)

The jit helpers are written once as Triton functions; Gluon kernels compile the same source with
`gluon.jit(fn.fn)`.
"""
