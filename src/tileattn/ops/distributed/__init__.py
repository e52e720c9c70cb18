"""Context-parallel (ring) attention over torch.distributed: api.py (ring_attention, shard_sequence,
unshard_sequence), problem.py (checks, the plan), schedule.py (which query rows see which keys at each ring
step), ring.py (the forward and backward loops), kernels.py (the float32 log-sum-exp merge)."""
