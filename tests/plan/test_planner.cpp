// Tests of the redistribution planner: the cheapest steps of DESIGN.md's table,
// validity of every plan between every pair of layouts, and optimality against an
// independent shortest-path computation over the same steps.
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>
#include <tessera/core/enumerate.hpp>
#include <tessera/core/format.hpp>
#include <tessera/plan/format.hpp>
#include <tessera/plan/planner.hpp>

using namespace tessera;

namespace {

// Replays a plan with the step rules and checks it is well formed.
void check_plan_valid(const plan& p) {
  layout cur = p.from;
  index_t total = 0;
  for (const plan_step& s : p) {
    REQUIRE(step_applies(cur, p.global, s.kind, s.axis, s.dim, s.dim2));
    const layout next = apply_step(cur, s.kind, s.axis, s.dim, s.dim2, s.op, p.to.without_partial());
    CHECK(next.without_partial() == s.after.without_partial());
    CHECK(next.partial == s.after.partial);
    CHECK(s.bytes == step_bytes(cur, p.global, p.elem_bytes, s.kind, s.axis, s.after));
    CHECK(check(s.after, p.global).ok());
    total += s.bytes;
    cur = s.after;
  }
  CHECK(cur == p.to);
  CHECK(total == p.bytes_per_rank());
  for (int r = 0; r < p.from.dev.size(); ++r) CHECK(p.bytes_for_rank(r) <= p.bytes_per_rank());
}

// Fewest bytes from `from` to `to` over all step sequences, by Bellman-Ford over the
// reachable placements: an algorithm independent of the planner's Dijkstra. Every
// step is allowed everywhere (the planner only uses mask/expand on target-partial axes).
index_t brute_force_bytes(const layout& from, const layout& to, const extents& global, index_t eb) {
  const reduce_op op = from.has_partial() ? from.op : to.op;
  std::map<std::string, std::pair<layout, index_t>> best;
  const index_t inf = index_t(1) << 60;
  best[to_string(from)] = {from, 0};
  for (bool changed = true; changed;) {
    changed = false;
    auto snapshot = best;
    for (auto& [key, entry] : snapshot) {
      const layout cur = entry.first;
      const index_t b = entry.second;
      auto relax = [&](step_kind k, int a, int d, int d2) {
        if (!step_applies(cur, global, k, a, d, d2)) return;
        if ((k == step_kind::mask || k == step_kind::expand) && cur.has_partial() && cur.op != op)
          return;
        const layout next = apply_step(cur, k, a, d, d2, op, to.without_partial());
        const index_t nb = b + step_bytes(cur, global, eb, k, a, next);
        auto it = best.find(to_string(next));
        if (it == best.end() || nb < it->second.second) {
          best[to_string(next)] = {next, nb};
          changed = true;
        }
      };
      for (int a = 0; a < cur.dev.ndim; ++a) {
        for (int d = 0; d < cur.ndim; ++d) {
          for (step_kind k : {step_kind::slice, step_kind::reduce_scatter, step_kind::all_gather,
                              step_kind::expand})
            relax(k, a, d, -1);
          for (int d2 = 0; d2 < cur.ndim; ++d2) relax(step_kind::all_to_all, a, d, d2);
        }
        relax(step_kind::all_reduce, a, -1, -1);
        relax(step_kind::mask, a, -1, -1);
      }
      relax(step_kind::exchange, -1, -1, -1);
    }
  }
  auto it = best.find(to_string(to));
  return it == best.end() ? inf : it->second.second;
}

}  // namespace

TEST_CASE("DESIGN.md's table: the cheapest step for each transition on one mesh axis") {
  const mesh m{4};
  const extents g{64, 32};  // floats; a shard split 4 ways is 16 x 32 = 2 KiB
  const layout rep = layout::replicated(m, 2);
  const layout row(m, {{0}, {}});
  const layout col(m, {{}, {0}});
  const layout part = rep.with_partial(0);

  SUBCASE("replicate -> split: a local slice, 0 bytes") {
    const plan p = plan_redistribution(rep, row, g, 4);
    REQUIRE(p.size() == 1);
    CHECK(p[0].kind == step_kind::slice);
    CHECK(p.bytes_per_rank() == 0);
  }
  SUBCASE("split -> replicate: AllGather, (g - 1) shards") {
    const plan p = plan_redistribution(row, rep, g, 4);
    REQUIRE(p.size() == 1);
    CHECK(p[0].kind == step_kind::all_gather);
    CHECK(p.bytes_per_rank() == 3 * 2048);
  }
  SUBCASE("partial -> replicate: AllReduce, 2 (g - 1) / g of the tensor") {
    const plan p = plan_redistribution(part, rep, g, 4);
    REQUIRE(p.size() == 1);
    CHECK(p[0].kind == step_kind::all_reduce);
    CHECK(p.bytes_per_rank() == 2 * 3 * 8192 / 4);
  }
  SUBCASE("partial -> split: ReduceScatter, half of AllReduce's traffic") {
    const plan p = plan_redistribution(part, col, g, 4);
    REQUIRE(p.size() == 1);
    CHECK(p[0].kind == step_kind::reduce_scatter);
    CHECK(p[0].dim == 1);
    CHECK(p.bytes_per_rank() * 2 == plan_redistribution(part, rep, g, 4).bytes_per_rank());
  }
  SUBCASE("split(dim i) -> split(dim j): AllToAll") {
    const plan p = plan_redistribution(row, col, g, 4);
    REQUIRE(p.size() == 1);
    CHECK(p[0].kind == step_kind::all_to_all);
    CHECK(p[0].dim == 0);
    CHECK(p[0].dim2 == 1);
    CHECK(p.bytes_per_rank() == 3 * 2048 / 4);
  }
  SUBCASE("same layout: no steps") {
    CHECK(plan_redistribution(row, row, g, 4).empty());
  }
}

TEST_CASE("several mesh axes: slice before gather, and the seed's MatMul output") {
  const mesh m{2, 4};
  const extents g{16, 16};
  // The seed's first MatMul leaves (16, 16) split by rows over axis 0, partial over
  // axis 1; ReLU wants columns split over axis 1: one ReduceScatter over groups of 4.
  const plan p = plan_redistribution(layout(m, {{0}, {}}).with_partial(1), layout(m, {{0}, {1}}), g, 4);
  REQUIRE(p.size() == 1);
  CHECK(p[0].kind == step_kind::reduce_scatter);
  CHECK(p[0].axis == 1);
  CHECK(format_groups(m, axis_list{1}) == "{0,1,2,3} {4,5,6,7}");
  // Moving axis 0 from dim 0 to dim 1 while axis 1 goes the other way: cheaper than
  // gathering everything, and no step makes a shard larger than needed first.
  const plan q = plan_redistribution(layout(m, {{0}, {1}}), layout::replicated(m, 2), g, 4);
  CHECK(q.bytes_per_rank() == (8 - 1) * 32 * 4);  // an 8-way all-gather of 32-element shards
}

TEST_CASE("a plan prints its steps, groups and bytes") {
  const mesh m{2, 4};
  const plan p = plan_redistribution(layout(m, {{0}, {}}).with_partial(1), layout(m, {{0}, {1}}),
                                     extents{16, 16}, 4);
  const std::string text = to_string(p);
  CHECK(text ==
        "redistribute (16, 16) on mesh (2, 4), 4-byte elements: [0, -] partial sum {1} -> [0, 1]\n"
        "  1. reduce_scatter sum  mesh axis 1, dim 1  groups {0,1,2,3} {4,5,6,7}  384 bytes/rank -> [0, 1]\n"
        "  total: 384 bytes per rank\n");
}

TEST_CASE("every plan between every pair of layouts is valid and optimal") {
  struct config {
    mesh m;
    extents g;
  };
  const std::vector<config> configs = {
      {mesh{2}, extents{8}},          {mesh{4}, extents{8, 4}},     {mesh{2, 2}, extents{8, 8}},
      {mesh{2, 2}, extents{4, 2, 8}}, {mesh{2, 4}, extents{8, 8}},  {mesh{4, 2}, extents{16, 2}},
      {mesh{2, 2, 2}, extents{8, 8}}, {mesh{2, 3}, extents{6, 12}}, {mesh{2, 2}, extents{4, 2, 2, 4}},
      {mesh{4}, extents{4, 1, 2, 8}},
  };
  int pairs = 0, exchanges = 0;
  for (const config& c : configs) {
    std::vector<layout> all;
    for_each_layout(c.m, c.g.ndim, true, [&](const layout& l) {
      if (check(l, c.g).ok()) all.push_back(l);
    });
    for (const layout& from : all)
      for (const layout& to : all) {
        CAPTURE(to_string(c.m));
        CAPTURE(to_string(from));
        CAPTURE(to_string(to));
        const plan p = plan_redistribution(from, to, c.g, 4);
        check_plan_valid(p);
        for (const plan_step& s : p) exchanges += s.kind == step_kind::exchange;
        ++pairs;
        // Optimality against Bellman-Ford, on the smaller meshes (it is slow).
        if (c.m.size() <= 4 && c.g.ndim <= 2) {
          const index_t best = brute_force_bytes(from, to, c.g, 4);
          REQUIRE(best < (index_t(1) << 60));  // the target is reachable by some steps
          CHECK(p.bytes_per_rank() == best);
        }
      }
  }
  MESSAGE(pairs << " plans checked, " << exchanges << " exchange steps");
  CHECK(pairs > 10000);
}

TEST_CASE("partial states reduced with max and min") {
  const mesh m{2, 2};
  const layout from = layout(m, {{0}, {}}).with_partial(1, reduce_op::max);
  const plan p = plan_redistribution(from, layout(m, {{0}, {1}}), extents{4, 4}, 4);
  REQUIRE(p.size() == 1);
  CHECK(p[0].kind == step_kind::reduce_scatter);
  CHECK(p[0].op == reduce_op::max);
  const layout to_min = layout(m, {{}, {}}).with_partial(0, reduce_op::min);
  CHECK_THROWS_WITH_AS(plan_redistribution(from, to_min, extents{4, 4}, 4),
                       "plan_redistribution: redistribute: partial layouts must reduce with the same operation",
                       error);
}

TEST_CASE("bad redistributions are errors naming the rule and the numbers") {
  CHECK_THROWS_WITH_AS(plan_redistribution(layout(mesh{2}, {{0}}), layout(mesh{4}, {{0}}), extents{8}, 4),
                       "plan_redistribution: redistribute: both layouts must be on the same mesh", error);
  CHECK_THROWS_WITH_AS(
      plan_redistribution(layout(mesh{4}, {{0}}), layout(mesh{4}, {{0}, {}}), extents{8}, 4),
      "plan_redistribution: layout: the shape's rank must equal the layout's tensor rank: shape has rank 1, "
      "layout has rank 2",
      error);
  CHECK_THROWS_WITH_AS(
      plan_redistribution(layout(mesh{4}, {{0}}), layout(mesh{4}, {{}}), extents{6}, 4),
      "plan_redistribution: layout: a tensor dim must be divisible by the product of its splits: dim 0 has "
      "extent 6, split into 4 pieces",
      error);
}

TEST_CASE("static plans are compile-time constants equal to run-time plans") {
  constexpr mesh m{2, 4};
  constexpr layout a(m, {{0}, {1}});
  constexpr layout b(m, {{1}, {0}});
  constexpr const plan& p = static_plan<a, b, extents{16, 32}, float>;
  static_assert(p.bytes_per_rank() > 0);
  static_assert(p.to == b);
  CHECK(p == plan_redistribution(a, b, extents{16, 32}, 4));
}
