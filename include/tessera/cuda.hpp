// The GPU half of tessera: everything of <tessera/tessera.hpp> plus device tensors
// (tensor_on<T, cuda_device>), the CUDA kernels behind every operator, and the
// communicators of device buffers. Include it in translation units compiled by nvcc
// (link tessera::cuda, and tessera::nccl for the NCCL communicator). Only includes.
#pragma once

#include <tessera/tessera.hpp>

// cuda/: the runtime (errors, devices, tessera's stream), the caching allocator,
// device arrays and launch geometry
#include <tessera/cuda/runtime.hpp>
#include <tessera/cuda/allocator.hpp>
#include <tessera/cuda/device_array.hpp>
#include <tessera/cuda/launch.cuh>

// tensor/: the GPU's storage (fill, box copies, host transfers)
#include <tessera/tensor/cuda_storage.cuh>

// kernels/cuda/: the local math, and backend<cuda_device>
#include <tessera/kernels/cuda/common.cuh>
#include <tessera/kernels/cuda/elementwise.cuh>
#include <tessera/kernels/cuda/reduce.cuh>
#include <tessera/kernels/cuda/softmax.cuh>
#include <tessera/kernels/cuda/matmul.cuh>
#include <tessera/kernels/cuda/optim.cuh>
#include <tessera/kernels/cuda/shape.cuh>
#include <tessera/kernels/cuda/sharded.cuh>
#include <tessera/kernels/cuda/backend.cuh>
// kernels/cuda/ through cuDNN: convolution, batch norm, pooling (link tessera::cudnn, which
// defines TESSERA_WITH_CUDNN)
#if defined(TESSERA_WITH_CUDNN) && __has_include(<cudnn.h>)
#include <tessera/kernels/cuda/cudnn.cuh>
#include <tessera/kernels/cuda/conv.cuh>
#include <tessera/kernels/cuda/batch_norm.cuh>
#include <tessera/kernels/cuda/pool.cuh>
#endif

// comm/: device buffers through a host communicator, and NCCL
#include <tessera/comm/staged.hpp>
#if __has_include(<nccl.h>)
#include <tessera/comm/nccl.hpp>
#endif
