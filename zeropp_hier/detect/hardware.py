"""What the machine running a job can do: the CPU's instruction sets, and whether DeepSpeed will
accept fp16 on it.

[Note: fp16 on CPUs]
DeepSpeed's CPU accelerator accepts fp16 only where oneDNN has fp16 kernels
(``torch.ops.mkldnn._is_mkldnn_fp16_supported()``: CPUs with AVX512-FP16, i.e. Intel Sapphire
Rapids and newer); elsewhere ``deepspeed.initialize`` raises
``ValueError: Type fp16 is not supported on your device`` inside every rank. Frontier's host CPUs
(EPYC 7A53) and most AMD EPYC lack it. The job asks the same question before it starts any rank, so
a user gets one error that names the missing capability and the alternative, and the tests turn
the same answer into a visible skip. GPUs (CUDA, ROCm) are never refused here.
"""

from __future__ import annotations

import platform

# The instruction sets a log or an error message should name (Linux /proc/cpuinfo flag names).
FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16")


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = platform.processor() or platform.machine(), set[str]()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:  # not Linux: the model from platform only
        pass
    return model, flags


def cpu_summary() -> str:
    """One line: the CPU model and which of the instruction sets of interest it has."""
    model, flags = _cpuinfo()
    have = " ".join(f"{f}={'yes' if f in flags else 'no'}" for f in FLAGS_OF_INTEREST)
    return f"{model} | {have}"


def cpu_fp16_supported() -> bool:
    """DeepSpeed's own test for fp16 on its CPU accelerator ([Note: fp16 on CPUs])."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        return False


def fp16_unsupported_reason(uses_gpu: bool) -> str | None:
    """None if DeepSpeed will train in fp16 here; otherwise why not, naming the capability."""
    if uses_gpu or cpu_fp16_supported():
        return None
    return (
        "DeepSpeed's CPU accelerator refuses fp16 on this CPU: oneDNN's fp16 kernels need "
        f"AVX512-FP16 (Intel Sapphire Rapids or newer), which it lacks ({cpu_summary()})"
    )
