// The CPU kernels: local math on xt::xarray shards (xtensor + BLAS), no
// communication. Only includes. Needs tessera::blas (CBLAS) for matmul.
#pragma once

#include <tessera/kernels/cpu/common.hpp>
#include <tessera/kernels/cpu/blas.hpp>
#include <tessera/kernels/cpu/matmul.hpp>
#include <tessera/kernels/cpu/elementwise.hpp>
#include <tessera/kernels/cpu/reduce.hpp>
#include <tessera/kernels/cpu/softmax.hpp>
#include <tessera/kernels/cpu/shape.hpp>
