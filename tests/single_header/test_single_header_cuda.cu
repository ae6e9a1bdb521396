// The suite's check of the generated GPU single header: this file sees only
// single_include/ (plus the xtensor, CUDA and BLAS include folders), never include/.
// It builds wherever nvcc is found and runs where a CUDA device is present (77 =
// skipped otherwise).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <tessera/cuda.hpp>

TEST_CASE("single header: a sharded operator on device tensors") {
  using namespace tessera;
  staged_communicator<local_communicator> one{local_communicator{}};
  device_context<staged_communicator<local_communicator>> ctx(one);
  dist_tensor<float> a(layout(mesh{1}, {{0}, {}}), extents{4, 8}, 0);
  a.fill_global([](const auto& i) { return float(i[0] * 8 + i[1]); });
  const auto y = ops::add(ops::add_op{strategy{{1, 1}, {1, 1}}}, to_device(a), to_device(a), ctx);
  const auto h = to_host(y);
  for (index_t i = 0; i < 4; ++i)
    for (index_t j = 0; j < 8; ++j) CHECK(h.local()(i, j) == float(2 * (i * 8 + j)));
}

int main(int argc, char** argv) {
  if (!tessera::cuda::available()) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  return context.run();
}
