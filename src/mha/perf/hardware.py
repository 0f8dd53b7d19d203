"""Hardware figures in one table: the GPUs the lessons, the cost models and the benchmarks name.

Every figure is read from a vendor data sheet, cited beside its row. `peak_flops` is the DENSE
bf16 tensor-core rate: NVIDIA's sheets headline the rate with 2:4 structured sparsity (two of
every four weights zero), twice the dense one, so each dense figure below is half the sheet's
"with sparsity" number. A figure the course does not need, or that depends on the variant of
the part, is None (unknown rather than a guess).

    Accelerator                  one GPU: peak dense bf16 FLOP/s, memory bandwidth, on-chip memory
    H100_SXM, H200_SXM, ...      the rows
    ACCELERATORS                 the two the roofline lessons compare (H100 SXM, H200 SXM)
    GPUS                         every row, in the order `lookup` tries their name patterns
    lookup(device_name)          the row for a `torch.cuda.get_device_name()`, or None

Users: `traffic` (the roofline of 12_flash_attention.ipynb), `kv_cache.decode_step_cost`
(13_kv_cache.ipynb), `bench.gpu_peak_bf16_tflops` (the fraction of peak in
benchmarks/sdpa_backends.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from mha.validate import require_int

KIB = 1024
GB = 10**9  # data sheets count memory in decimal gigabytes


def _require_rate(name: str, value: object) -> None:
    """Raise unless value is None or a positive, finite real number (a bool is refused)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive, finite number, got {value!r}")


@dataclass(frozen=True)
class Accelerator:
    """Peak dense bf16 FLOP/s, memory bytes/s and on-chip memory of one GPU (None: not known here)."""

    name: str
    peak_flops: float | None  # dense bf16 tensor-core FLOP/s
    bandwidth: float | None = None  # bytes/s of the GPU's main memory (HBM or GDDR)
    sram_per_sm: int | None = None  # bytes of shared memory one SM's program may use
    n_sm: int | None = None  # streaming multiprocessors
    memory_bytes: int | None = None  # bytes of main memory
    match: str = ""  # regular expression on torch.cuda.get_device_name(); "" matches nothing

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__} {self.name!r}")
        _require_rate("peak_flops", self.peak_flops)
        _require_rate("bandwidth", self.bandwidth)
        for name in ("sram_per_sm", "n_sm", "memory_bytes"):
            if getattr(self, name) is not None:
                require_int(name, getattr(self, name))
        if not isinstance(self.match, str):
            raise TypeError(f"match must be a str, got {type(self.match).__name__} {self.match!r}")

    def figures(self, *names: str) -> tuple[float, ...]:
        """The figures `names`, or ValueError naming the first one this table does not give."""
        for name in names:
            if getattr(self, name) is None:
                raise ValueError(f"{self.name}: {name} is not in the hardware table (unknown)")
        return tuple(getattr(self, n) for n in names)

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which a kernel is bound by arithmetic, not by memory."""
        peak, bandwidth = self.figures("peak_flops", "bandwidth")
        return peak / bandwidth

    def attainable(self, intensity: float) -> float:
        """The roofline: the most FLOP/s a kernel of this intensity can reach, min(peak, I * bandwidth)."""
        if isinstance(intensity, bool) or not isinstance(intensity, int | float | np.integer | np.floating):
            raise TypeError(f"intensity must be a number (FLOPs per byte), got "
                            f"{type(intensity).__name__} {intensity!r}")
        if not intensity >= 0:  # NaN fails this too
            raise ValueError(f"intensity must be >= 0 FLOPs per byte, got {intensity!r}")
        peak, bandwidth = self.figures("peak_flops", "bandwidth")
        return min(peak, intensity * bandwidth)


# NVIDIA H100 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
# (also https://www.nvidia.com/en-us/data-center/h100/): SXM "BF16 Tensor Core 1,979 teraFLOPS"
# with sparsity (989 dense), "GPU memory bandwidth 3.35TB/s", 80 GB HBM3. 132 SMs (NVIDIA Hopper
# architecture in-depth, https://developer.nvidia.com/blog/nvidia-hopper-architecture-in-depth/);
# 228 KiB shared memory per SM is compute capability 9.0's limit (CUDA C++ Programming Guide,
# "Technical Specifications per Compute Capability").
H100_SXM = Accelerator("H100 SXM", 989e12, 3.35e12, 228 * KIB, 132, 80 * GB,
                       match=r"H100(?!.*(PCIe|NVL))")
"""NVIDIA H100 SXM5: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3, 228 KiB shared memory per SM."""

# Same datasheet, PCIe column: "BF16 Tensor Core 1,513 teraFLOPS" with sparsity (756 dense),
# "GPU memory bandwidth 2TB/s", 80 GB HBM2e; 114 SMs (Hopper in-depth blog).
H100_PCIE = Accelerator("H100 PCIe", 756e12, 2.0e12, 228 * KIB, 114, 80 * GB, match=r"H100.*PCIe")
"""NVIDIA H100 PCIe: 756 TFLOP/s dense bf16, 2 TB/s HBM2e."""

# The H100 NVL's figures have been printed per pair of boards and per board in successive
# editions of the datasheet: left unknown rather than guessed.
H100_NVL = Accelerator("H100 NVL", None, match=r"H100.*NVL")
"""NVIDIA H100 NVL: figures not in this table."""

# NVIDIA H200 Tensor Core GPU, https://www.nvidia.com/en-us/data-center/h200/: SXM "BF16 Tensor
# Core 1,979 TFLOPS" with sparsity (989 dense: the same GH100 compute as the H100 SXM), "GPU
# Memory 141GB", "GPU Memory Bandwidth 4.8TB/s" (HBM3e).
H200_SXM = Accelerator("H200 SXM", 989e12, 4.8e12, 228 * KIB, 132, 141 * GB, match=r"(?<!G)H200")
"""NVIDIA H200 SXM: the H100 SXM's compute (989 TFLOP/s dense bf16) with 141 GB of HBM3e at 4.8 TB/s."""

# NVIDIA GH200 Grace Hopper Superchip, https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/:
# the H100 SXM's GH100 compute (989 TFLOP/s dense bf16); its bandwidth depends on the memory
# fitted (HBM3 or HBM3e), so it is left unknown here.
GH200 = Accelerator("GH200", 989e12, match=r"GH200")
"""NVIDIA GH200 (its Hopper GPU): 989 TFLOP/s dense bf16."""

# NVIDIA A100 Tensor Core GPU datasheet,
# https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf:
# "BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS*" (* with sparsity). Bandwidth differs by part
# (1,555 GB/s for 40GB PCIe to 2,039 GB/s for 80GB SXM), so it is left unknown for the name "A100".
A100 = Accelerator("A100", 312e12, match=r"A100")
"""NVIDIA A100 (any variant): 312 TFLOP/s dense bf16."""

# NVIDIA L40S, https://www.nvidia.com/en-us/data-center/l40s/: "BF16 Tensor Core 362.05 | 733
# TFLOPS" (dense | with sparsity), "GPU Memory 48GB GDDR6", "Memory Bandwidth 864GB/s".
L40S = Accelerator("L40S", 362e12, 864e9, memory_bytes=48 * GB, match=r"L40S")
"""NVIDIA L40S: 362 TFLOP/s dense bf16, 864 GB/s GDDR6."""

# NVIDIA L4, https://www.nvidia.com/en-us/data-center/l4/: "BF16 Tensor Core 242 teraFLOPS"
# with sparsity (121 dense), "GPU memory 24GB", "GPU memory bandwidth 300GB/s".
L4 = Accelerator("L4", 121e12, 300e9, memory_bytes=24 * GB, match=r"\bL4\b")
"""NVIDIA L4: 121 TFLOP/s dense bf16, 300 GB/s GDDR6."""

# NVIDIA Ada GPU architecture whitepaper,
# https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf:
# GeForce RTX 4090 "Peak BF16 Tensor TFLOPS with FP32 Accumulate 165.2", 1,008 GB/s GDDR6X, 24 GB.
RTX_4090 = Accelerator("RTX 4090", 165e12, 1008e9, memory_bytes=24 * GB, match=r"RTX 4090")
"""NVIDIA GeForce RTX 4090: 165 TFLOP/s dense bf16 (fp32 accumulate), 1,008 GB/s GDDR6X."""

ACCELERATORS = (H100_SXM, H200_SXM)
"""The two GPUs the roofline lessons compare: the same chip, two memory systems."""

GPUS = (H100_PCIE, H100_NVL, H100_SXM, H200_SXM, GH200, A100, L40S, L4, RTX_4090)
"""Every row, in the order `lookup` tries them (the more specific H100 names first)."""


def lookup(device_name: str) -> Accelerator | None:
    """The row whose pattern matches `device_name` (e.g. "NVIDIA H100 80GB HBM3"), or None."""
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a str, got {type(device_name).__name__} {device_name!r}")
    return next((g for g in GPUS if g.match and re.search(g.match, device_name)), None)
