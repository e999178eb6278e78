"""Block quantization used by the compressed collectives (reference backend for now)."""
from .reference import Quantized, dequantize, dequantize_sum, num_blocks, quantize  # noqa: F401
