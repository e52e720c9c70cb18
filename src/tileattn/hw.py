"""What the GPU offers: architecture, SM count, shared memory per block.

The shared-memory budget can be overridden to emulate smaller GPUs on a big one, so the configuration
paths for those budgets are exercised (and tested) on the H100:

    TILEATTN_SMEM_BUDGET=sm89   # 99 KB   (Ada)
    TILEATTN_SMEM_BUDGET=sm80   # 163 KB  (A100)
    TILEATTN_SMEM_BUDGET=101376 # any byte count

The override only ever lowers the budget; it never claims more than the device has.
"""
import functools
import os
from dataclasses import dataclass

import torch

from . import knobs

SMEM_PRESETS = {"sm89": 99 * 1024, "sm86": 99 * 1024, "sm80": 163 * 1024, "sm90": 227 * 1024}
# what the interpreter pretends to be: a Hopper-sized budget so CPU runs pick the same configs
INTERPRETER_SMEM = 227 * 1024


def interpreter_enabled() -> bool:
    """True when Triton kernels run through the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def is_hopper(device) -> bool:
    """A CUDA device of compute capability 9 (H100 / H200), reached without the interpreter: what the Gluon
    kernels need of the hardware (ops/common/tma.py adds what they need of Triton)."""
    if interpreter_enabled():
        return False
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


@dataclass(frozen=True)
class DeviceInfo:
    arch: int  # compute capability as major * 10 + minor (0 for the interpreter)
    num_sms: int
    smem_per_block: int  # bytes, after any override
    memory: int = 0  # bytes of device memory (0: not known, as under the interpreter)


def _smem_override():
    raw = knobs.smem_budget()
    if not raw:
        return None
    if raw in SMEM_PRESETS:
        return SMEM_PRESETS[raw]
    try:
        return int(raw[:-1]) * 1024 if raw.endswith("k") else int(raw)
    except ValueError:
        raise ValueError(
            f"TILEATTN_SMEM_BUDGET={raw!r}: expected one of {sorted(SMEM_PRESETS)}, a byte count or 'NNNk'"
        ) from None


@functools.cache
def _device_info(device_index, override):
    if device_index is None:
        smem = INTERPRETER_SMEM
        info = DeviceInfo(arch=0, num_sms=4, smem_per_block=smem)
    else:
        props = torch.cuda.get_device_properties(device_index)
        smem = getattr(props, "shared_memory_per_block_optin", 0) or 48 * 1024
        info = DeviceInfo(arch=props.major * 10 + props.minor, num_sms=props.multi_processor_count,
                          smem_per_block=smem, memory=props.total_memory)
    if override is not None:
        info = DeviceInfo(info.arch, info.num_sms, min(info.smem_per_block, override), info.memory)
    return info


def check_kernel_device(device: torch.device, what: str):
    """Raise ValueError unless the kernels can run on `device` (`what` names the tensors): a CUDA device, or
    the CPU through the Triton interpreter."""
    if device.type == "cpu" and not interpreter_enabled():
        raise ValueError(f"{what} are CPU tensors: tileattn runs on CUDA devices, or on the CPU only through "
                         "the Triton interpreter (set TRITON_INTERPRET=1 before importing triton)")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device type {device.type!r} for {what}")


def check_interpreter_dtype(dtype: torch.dtype, name: str) -> None:
    """Raise ValueError when `dtype` is bfloat16 and the kernels run through the Triton interpreter: its bfloat16
    dots are wrong (errors of ~1e8, silently), so an op whose kernels take bfloat16 operands into a dot refuses
    them there, before any launch. `name` is the argument that brings the bfloat16 in. A no-op on a GPU."""
    if dtype == torch.bfloat16 and interpreter_enabled():
        raise ValueError(f"{name} is bfloat16: the Triton interpreter (TRITON_INTERPRET=1) computes bfloat16 dots "
                         "wrongly; use float16 or run on a GPU")


def device_info(device: torch.device) -> DeviceInfo:
    """Facts about `device` (a CUDA device, or a CPU device under the interpreter)."""
    index = None if device.type == "cpu" else (device.index if device.index is not None
                                               else torch.cuda.current_device())
    return _device_info(index, _smem_override())
