"""The packed fp8 V layout's key order, and the kernel that packs V into it (fp8.fp8_v_layout).

`packed_key_pos` is written once as plain Python on integers or integer tensors (Fp8V.unpack uses it on
torch tensors) and compiled into the kernels as `packed_key_pos_jit`.
"""
import triton
import triton.language as tl  # noqa: F401  (the interpreter runs packed_key_pos with this module's globals)


def packed_key_pos(j):
    """Position of key j (an int or an integer tensor) in the packed fp8 V layout (Fp8V): within each group of
    16 keys, key 8g + 2c + b sits at 4c + 2g + b, the order in which a thread holds the scores of the tensor
    cores' accumulator and the order the fp8 P operand takes them in (so P goes from one to the other without
    moving between threads)."""
    return (j & ~15) | (((j >> 1) & 3) << 2) | (((j >> 3) & 1) << 1) | (j & 1)


packed_key_pos_jit = triton.jit(packed_key_pos)


@triton.jit
def pack_v_kernel(X, Y, seqlen, num_heads, stride_xb, stride_xs, stride_xh, stride_xd, stride_yb, stride_yh,
                  stride_yd, num_s_blocks, D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Y[b, h, d, packed_key_pos(s)] = X[b, s, h, d], and 0 for s in [seqlen, num_s_blocks * BLOCK_S): fp8 V
    into the packed layout of the fp8 kernels. Grid: (num_s_blocks * B * H,)."""
    pid = tl.program_id(0)
    i_s = pid % num_s_blocks
    i_bh = pid // num_s_blocks
    i_b = i_bh // num_heads
    i_h = i_bh % num_heads
    o_s = i_s * BLOCK_S + tl.arange(0, BLOCK_S)
    o_d = tl.arange(0, BLOCK_D)
    x = tl.load(X + i_b.to(tl.int64) * stride_xb + i_h.to(tl.int64) * stride_xh
                + o_s.to(tl.int64)[:, None] * stride_xs + o_d[None, :] * stride_xd,
                mask=(o_s < seqlen)[:, None] & (o_d < D)[None, :], other=0.0)
    tl.store(Y + i_b.to(tl.int64) * stride_yb + i_h.to(tl.int64) * stride_yh
             + o_d.to(tl.int64)[None, :] * stride_yd + packed_key_pos_jit(o_s)[:, None], x, mask=(o_d < D)[None, :])
