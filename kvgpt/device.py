"""
Where a run computes and in what precision: the device rule (cuda when there is one, else cpu;
mps only when named), the dtype rule (bfloat16 where native, float16 on older GPUs, float32 on a
CPU), autocast, torch.compile, and the peak FLOPs that MFU is measured against.
"""

import dataclasses
from contextlib import nullcontext

import torch

from kvgpt.errors import UserError


def pick_device(device):
    """The device to use: cuda when available (None), or the one named, if this torch has it."""
    if device is None:
        return 'cuda' if torch.cuda.is_available() else 'cpu'
    if device.startswith('cuda') and not torch.cuda.is_available():
        raise UserError(f"device {device}: this torch has no CUDA device (a CPU-only build, or no "
                        "GPU visible): use --device=cpu")
    index = int(device.partition(':')[2] or 0)
    if device.startswith('cuda') and index >= torch.cuda.device_count():
        raise UserError(f"device {device}: there are {torch.cuda.device_count()} CUDA devices")
    if device == 'mps' and not torch.backends.mps.is_available():
        raise UserError("device mps: this torch has no MPS device: use --device=cpu")
    return device


DTYPES = ('float32', 'bfloat16', 'float16')


def pick_precision(dtype, device):
    """A dtype name: bfloat16 on a CUDA device with native bf16, float16 (with a GradScaler in
    train.py) on an older one, float32 on CPU, unless one is named. torch counts emulated bf16 as
    supported by default: V100/T4 would then train eager (inductor skips it) with slow bf16."""
    if dtype is None and device.startswith('cuda'):
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        dtype = 'bfloat16' if native else 'float16'
    if (dtype or 'float32') not in DTYPES:
        raise UserError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
    return dtype or 'float32'


@dataclasses.dataclass
class DeviceSetup:
    device: str  # 'cpu', 'cuda', 'cuda:3'
    dtype: str  # 'float32' | 'bfloat16' | 'float16'
    compile: bool
    ctx: object  # autocast context for forward passes

    @property
    def type(self):
        return 'cuda' if self.device.startswith('cuda') else 'cpu'

    def for_inference(self, model):
        """model in eval mode on the device; on a GPU its weights (and so its KV cache) in the
        16-bit dtype, so decoding casts nothing per token."""
        model.eval().to(self.device)
        if self.type == 'cuda' and self.dtype != 'float32':
            return model.to(getattr(torch, self.dtype))
        return model


def setup_device(device=None, dtype=None, compile=None):
    """The one rule every script follows: cuda when available; bf16 autocast where native,
    fp16 on older GPUs, fp32 on CPU; torch.compile on for CUDA only; TF32 matmuls on CUDA."""
    device = pick_device(device)
    dtype = pick_precision(dtype, device)
    if device.startswith('cuda'):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    compile = device.startswith('cuda') if compile is None else bool(compile)
    return DeviceSetup(device, dtype, compile, autocast(device, dtype))


# Dense 16-bit tensor-core peaks (FLOP/s), by the full name torch.cuda.get_device_name() reports.
# Full names, not substrings: 'L4' is inside 'L40', and the H100's PCIe and NVL parts are slower
# than its SXM part. A device not listed has no MFU: never a made-up number.
PEAK_FLOPS = {
    'NVIDIA H200': 989e12, 'NVIDIA H200 NVL': 835e12, 'NVIDIA H100 80GB HBM3': 989e12,
    'NVIDIA H100 PCIe': 756e12, 'NVIDIA H100 NVL': 835e12, 'NVIDIA A100-SXM4-80GB': 312e12,
    'NVIDIA A100-SXM4-40GB': 312e12, 'NVIDIA A100 80GB PCIe': 312e12,
    'NVIDIA A100-PCIE-40GB': 312e12, 'NVIDIA L40S': 362e12, 'NVIDIA L40': 181e12,
    'NVIDIA L4': 121e12, 'NVIDIA A10': 125e12, 'NVIDIA A10G': 70e12,
    'NVIDIA GeForce RTX 4090': 165e12, 'NVIDIA GeForce RTX 3090': 71e12,
    'Tesla V100-SXM2-16GB': 125e12, 'Tesla V100-SXM2-32GB': 125e12, 'Tesla V100-PCIE-16GB': 112e12,
    'Tesla V100-PCIE-32GB': 112e12, 'Tesla T4': 65e12,
}


def device_peak_flops(device=None):
    """The accelerator's dense 16-bit peak, or None (CPU or a device not in PEAK_FLOPS)."""
    on_cuda = device is None or torch.device(device).type == 'cuda'
    if not (torch.cuda.is_available() and on_cuda):
        return None
    return PEAK_FLOPS.get(torch.cuda.get_device_name(device))


def autocast(device, dtype):
    """Mixed precision for a dtype name; float32 runs as it is."""
    if dtype == 'float32':
        return nullcontext()
    return torch.autocast('cuda' if device.startswith('cuda') else 'cpu', getattr(torch, dtype))
