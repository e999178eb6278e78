// Registers the zeropp_hier:: ops with the PyTorch dispatcher, and nothing else.
//
// Schemas here; implementations in quant_ops.cpp; fake (meta) implementations, which give
// output shapes without running a kernel, in zeropp_hier/quant/_ext.py. The shared library
// has no Python module init: zeropp_hier/quant/_ext.py loads it with torch.ops.load_library.
// In ROCm builds of PyTorch the HIP device is dispatched under the CUDA key.
#include <torch/library.h>

#include "quant_ops.h"

TORCH_LIBRARY(zeropp_hier, m) {
  // rotate / out_rotate: R or 0 ([Note: block rotation] in zeropp_hier/quant/reference.py)
  // x [n] -> data [nblocks*B] int8 (bits 8) | [nblocks*B/2] uint8 (bits 4), scales [nblocks]
  m.def(
      "quantize(Tensor x, int bits, int block_size, int rotate=0) -> (Tensor data, Tensor scales)");
  // data, scales of one payload -> [numel] of dtype
  m.def(
      "dequantize(Tensor data, Tensor scales, int numel, int bits, int block_size, "
      "ScalarType dtype, int rotate=0) -> Tensor");
  // data [k, bytes], scales [k, nblocks]: k payloads summed in fp32 -> [numel] of dtype
  m.def(
      "dequantize_sum(Tensor data, Tensor scales, int numel, int bits, int block_size, "
      "ScalarType dtype, int rotate=0) -> Tensor");
  // as dequantize_sum, the fp32 sum requantized with (out_bits, out_block_size)
  m.def(
      "dequantize_sum_requantize(Tensor data, Tensor scales, int numel, int bits, "
      "int block_size, int out_bits, int out_block_size, int rotate=0, int out_rotate=0) -> "
      "(Tensor data, Tensor scales)");
  m.def("build_info() -> str", &zqh::ops::build_info);
  m.def("cpu_isa() -> str", &zqh::ops::cpu_isa);
}

TORCH_LIBRARY_IMPL(zeropp_hier, CPU, m) {
  m.impl("quantize", &zqh::ops::quantize_cpu);
  m.impl("dequantize", &zqh::ops::dequantize_cpu);
  m.impl("dequantize_sum", &zqh::ops::dequantize_sum_cpu);
  m.impl("dequantize_sum_requantize", &zqh::ops::dequantize_sum_requantize_cpu);
}

#ifdef ZEROPP_WITH_GPU
TORCH_LIBRARY_IMPL(zeropp_hier, CUDA, m) {
  m.impl("quantize", &zqh::ops::quantize_gpu);
  m.impl("dequantize", &zqh::ops::dequantize_gpu);
  m.impl("dequantize_sum", &zqh::ops::dequantize_sum_gpu);
  m.impl("dequantize_sum_requantize", &zqh::ops::dequantize_sum_requantize_gpu);
}
#endif
