// torch's CUDAExtension hands only .cu files to nvcc; this is quant_kernels.hip under that name
// (see gpu_runtime.h for how the HIP names map to CUDA).
#include "quant_kernels.hip"
