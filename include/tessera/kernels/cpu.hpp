// The CPU kernels: local math on xt::xarray shards (xtensor + BLAS), no
// communication. Only includes. Needs tessera::blas (CBLAS) for matmul, and
// tessera::dnnl (oneDNN) for the convolutional network kernels, included where the
// program defines TESSERA_WITH_DNNL (linking tessera::dnnl does) and the compiler is not
// nvcc (whose front end cannot parse dnnl.hpp).
#pragma once

#include <tessera/kernels/cpu/common.hpp>
#include <tessera/kernels/cpu/blas.hpp>
#include <tessera/kernels/cpu/matmul.hpp>
#include <tessera/kernels/cpu/elementwise.hpp>
#include <tessera/kernels/cpu/reduce.hpp>
#include <tessera/kernels/cpu/softmax.hpp>
#include <tessera/kernels/cpu/shape.hpp>
#include <tessera/kernels/conv_params.hpp>
#include <tessera/kernels/cpu/cnn_table.hpp>
#if defined(TESSERA_WITH_DNNL) && __has_include(<oneapi/dnnl/dnnl.hpp>) && !defined(__CUDACC__)
#include <tessera/kernels/cpu/dnnl.hpp>
#include <tessera/kernels/cpu/conv.hpp>
#include <tessera/kernels/cpu/batch_norm.hpp>
#include <tessera/kernels/cpu/pool.hpp>
#endif
