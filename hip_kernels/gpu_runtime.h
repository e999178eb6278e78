// Portability: quant_kernels.hip is written against the HIP runtime API; compiled by nvcc
// (CUDA torch builds, hip_kernels/check_compile.sh) the few hip* names it uses map to cuda*.
// Kernel launches use the <<<grid, block, shmem, stream>>> syntax both compilers accept.
#pragma once

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__) || defined(__HIP_PLATFORM_HCC__)
#include <hip/hip_runtime.h>
#else
#include <cuda_runtime.h>
typedef cudaStream_t hipStream_t;
typedef cudaError_t hipError_t;
#define hipSuccess cudaSuccess
#define hipGetLastError cudaGetLastError
#define hipGetErrorString cudaGetErrorString
#endif
