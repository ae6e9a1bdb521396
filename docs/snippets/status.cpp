// docs/status.md: the version this tree is, and one of the limits the page lists said by
// the library itself: a parameter read on two pipeline stages is refused, with the
// operators and stages named. Planning only: no communicator, one process.
// ranks: 1
#include <cstdio>
#include <string>
#include <tessera/core/version.hpp>
#include <tessera/graph/parallel.hpp>

#include "error_text.hpp"
using namespace tessera;

int main() {
  // [status]
  static_assert(TESSERA_VERSION_MAJOR == 0, "the status page describes the 0.x series");
  std::printf("tessera %s\n", std::string(tessera::version()).c_str());

  graph::graph_builder b;
  auto x = b.input("x", {4, 8}), label = b.input("label", {4, 8});
  auto w = b.parameter("w", {8, 8});
  b.set_pipeline_stage(0);
  auto h = b.relu(b.matmul(x, w));
  b.set_pipeline_stage(1);
  auto y = b.matmul(h, w);                 // w again, on the second stage: not yet supported
  graph::traced_graph g = b.build(b.mse_loss(y, label));

  graph::parallel_config cfg;
  cfg.mode = graph::parallel_mode::data_parallel;
  cfg.device_num = 2;
  cfg.pipeline_stages = 2;
  const std::string why = tessera::testing::error_of([&] { graph::parallelize(g, cfg); });
  std::printf("%s\n", why.c_str());
  // parallelize: parameter 'w' is read by MatMul 'matmul' on pipeline stage 0 and by
  // MatMul 'matmul2' on stage 1; a parameter belongs to one stage
  // [/status]

  const bool ok = why == "parallelize: parameter 'w' is read by MatMul 'matmul' on pipeline stage 0 and by "
                         "MatMul 'matmul2' on stage 1; a parameter belongs to one stage";
  if (!ok) {
    std::printf("status: unexpected error text\n");
    return 1;
  }
  return 0;
}
