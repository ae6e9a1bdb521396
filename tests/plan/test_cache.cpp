// Tests of plan/cache.hpp: plans across device matrices (on their common refinement),
// and the process-wide cache: one planner run per key, the same plan on every hit,
// nothing cached for bad input, its bound, and lookups from many threads at once.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <tessera/core/refine.hpp>
#include <tessera/plan/cache.hpp>
#include <tessera/plan/planner.hpp>

using namespace tessera;

namespace {

// The seed's first MatMul output ([0, 2] partial sum {1} on (2, 4, 1)) and ReLU
// (2, 4)'s input ([0, 1] on (2, 4)).
constexpr layout matmul_out = layout(mesh{2, 4, 1}, {{0}, {2}}).with_partial(1);
constexpr layout relu_in(mesh{2, 4}, {{0}, {1}});

}  // namespace

TEST_CASE("plan_across_meshes: on one device matrix, the planner's plan") {
  const mesh m{2, 4};
  const layout from(m, {{0}, {}}), to(m, {{}, {0, 1}});
  const refined_plan rp = plan_across_meshes(from, to, extents{16, 32}, 4);
  CHECK(rp.fine == m);
  CHECK(rp.p == plan_redistribution(from, to, extents{16, 32}, 4));
}

TEST_CASE("plan_across_meshes: on the common refinement of two device matrices") {
  constexpr refined_plan rp = plan_across_meshes(matmul_out, relu_in, extents{16, 16}, 4);
  static_assert(rp.fine == mesh{2, 4});
  static_assert(rp.p.size() == 1 && rp.p[0].kind == step_kind::reduce_scatter && rp.p[0].axis == 1);
  static_assert(rp.p.bytes_per_rank() == 384);
  const mesh fine = common_refinement(matmul_out.dev, relu_in.dev);
  CHECK(rp.p == plan_redistribution(refine(matmul_out, fine), refine(relu_in, fine), extents{16, 16}, 4));
  // (2, 4) and (4, 2) refine to (2, 2, 2).
  const refined_plan q =
      plan_across_meshes(layout(mesh{2, 4}, {{0}, {1}}), layout(mesh{4, 2}, {{0}, {1}}), extents{16, 16}, 4);
  CHECK(q.fine == mesh{2, 2, 2});
  CHECK(q.p.from == layout(mesh{2, 2, 2}, {{0}, {1, 2}}));
  CHECK(q.p.to == layout(mesh{2, 2, 2}, {{0, 1}, {2}}));
}

TEST_CASE("plan_across_meshes: device matrices that share no refinement") {
  CHECK_THROWS_WITH_AS(plan_across_meshes(layout(mesh{2, 3}, {{0}, {1}}), layout(mesh{3, 2}, {{0}, {1}}),
                                          extents{6, 6}, 4),
                       "plan_across_meshes: mesh: two device matrices of one rank list must nest to share a "
                       "refinement: suffix products 3 and 2 do not divide",
                       error);
}

TEST_CASE("plan_cache: the second lookup of a key does not plan again") {
  plan_cache cache;
  const auto first = cache.get(matmul_out, relu_in, extents{16, 16}, 4);
  CHECK(cache.stats().planned == 1);
  CHECK(cache.stats().hits == 0);
  const auto second = cache.get(matmul_out, relu_in, extents{16, 16}, 4);
  CHECK(second == first);  // the very same plan
  CHECK(*second == plan_across_meshes(matmul_out, relu_in, extents{16, 16}, 4));
  CHECK(cache.stats().planned == 1);
  CHECK(cache.stats().hits == 1);
  CHECK(cache.stats().entries == 1);
  // Another element size, shape or target is another key.
  CHECK(cache.get(matmul_out, relu_in, extents{16, 16}, 8)->p.bytes_per_rank() == 768);
  CHECK(cache.get(matmul_out, relu_in, extents{16, 32}, 4)->p.bytes_per_rank() == 768);
  CHECK(*cache.get(matmul_out, relu_in.with_split(1, {}), extents{16, 16}, 4) ==
        plan_across_meshes(matmul_out, relu_in.with_split(1, {}), extents{16, 16}, 4));
  CHECK(cache.stats().planned == 4);
  CHECK(cache.stats().entries == 4);
  CHECK(cache.stats().clears == 0);  // clear() empties it; a plan handed out stays valid and the key plans again.
  cache.clear();
  CHECK(cache.stats().entries == 0);
  CHECK(cache.stats().clears == 1);
  CHECK(first->p.bytes_per_rank() == 384);
  CHECK(*cache.get(matmul_out, relu_in, extents{16, 16}, 4) == *first);
  CHECK(cache.stats().planned == 5);
}

TEST_CASE("plan_cache: bad input throws and is not cached") {
  plan_cache cache;
  for (int i = 0; i < 2; ++i)
    CHECK_THROWS_WITH_AS(cache.get(layout(mesh{4}, {{0}}), layout(mesh{4}, {{}}), extents{6}, 4),
                         "plan_redistribution: layout: a tensor dim must be divisible by the product of its "
                         "splits: dim 0 has extent 6, split into 4 pieces",
                         error);
  CHECK(cache.stats().entries == 0);
  CHECK(cache.stats().planned == 0);
  CHECK(cache.stats().hits == 0);
}

TEST_CASE("plan_cache: bounded; a full cache is emptied, and plans handed out stay valid") {
  plan_cache cache;
  const layout rows(mesh{2}, {{0}, {}}), cols(mesh{2}, {{}, {0}});
  const auto kept = cache.get(rows, cols, extents{2, 2}, 4);
  for (std::size_t i = 1; i < plan_cache::capacity; ++i) cache.get(rows, cols, extents{2, 2 * index_t(i + 1)}, 4);
  CHECK(cache.stats().entries == plan_cache::capacity);
  CHECK(cache.stats().clears == 0);
  cache.get(rows, cols, extents{2, 2}, 4);  // a hit: nothing cleared
  CHECK(cache.stats().clears == 0);
  cache.get(rows, cols, extents{4, 2}, 4);  // a new key: the full cache is emptied first
  CHECK(cache.stats().clears == 1);
  CHECK(cache.stats().entries == 1);
  CHECK(kept->p == plan_redistribution(rows, cols, extents{2, 2}, 4));
  CHECK(cache.stats().planned == plan_cache::capacity + 1);
}

TEST_CASE("plan_cache: lookups from many threads at once") {
  plan_cache cache;
  constexpr int threads = 8, rounds = 400, keys = 16;
  auto key_shape = [](int k) { return extents{8, 8 * index_t(k + 1)}; };
  const layout from = layout(mesh{2, 2}, {{0}, {}}).with_partial(1), to(mesh{2, 2}, {{}, {0, 1}});
  std::vector<std::vector<std::shared_ptr<const refined_plan>>> seen(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int i = 0; i < rounds; ++i) {
        auto rp = cache.get(from, to, key_shape((i + t) % keys), 4);
        if (i < keys) seen[t].push_back(std::move(rp));
      }
    });
  for (std::thread& th : pool) th.join();
  const plan_cache_stats s = cache.stats();
  CHECK(s.entries == keys);
  CHECK(s.planned >= keys);
  CHECK(s.planned <= std::uint64_t(keys) * threads);  // two threads missing one key at once both plan
  CHECK(s.hits + s.planned == std::uint64_t(threads) * rounds);
  for (int t = 0; t < threads; ++t)
    for (int i = 0; i < keys; ++i) {
      const int k = (i + t) % keys;
      CHECK(*seen[t][i] == plan_across_meshes(from, to, key_shape(k), 4));
      CHECK(*seen[t][i] == *cache.get(from, to, key_shape(k), 4));
    }
}

TEST_CASE("cached_plan: one cache for the whole process") {
  const plan_cache_stats before = process_plan_cache().stats();
  const auto a = cached_plan(matmul_out, relu_in, extents{32, 64}, 4);
  const auto b = cached_plan(matmul_out, relu_in, extents{32, 64}, 4);
  CHECK(a == b);
  CHECK(process_plan_cache().stats().planned == before.planned + 1);
  CHECK(process_plan_cache().stats().hits == before.hits + 1);
}
