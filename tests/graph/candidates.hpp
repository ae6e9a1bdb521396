// Helpers of the graph operators' tests: every strategy of given tuple ranks, whether a
// strategy is valid for an operator, and the check that an operator's candidates are
// exactly its valid strategies.
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>
#include <tessera/graph/op_def.hpp>
#include <tessera/ops/operators.hpp>

namespace tessera::graph::testing {

// Every strategy of tuples of ranks `ranks` whose entries divide `n`.
inline std::vector<strategy> all_strategies(const std::vector<int>& ranks, int n) {
  std::vector<strategy> out;
  strategy st;
  st.n = int(ranks.size());
  std::function<void(int, int)> rec = [&](int i, int d) {
    if (i == st.n) {
      out.push_back(st);
      return;
    }
    st.in[i].n = ranks[std::size_t(i)];
    if (d == ranks[std::size_t(i)]) {
      rec(i + 1, 0);
      return;
    }
    for (int s = 1; s <= n; ++s)
      if (n % s == 0) {
        st.in[i].v[d] = s;
        rec(i, d + 1);
      }
  };
  rec(0, 0);
  return out;
}

// The rule accepts `st` and every layout splits its tensor evenly.
inline bool valid(const op_def& op, const strategy& st, int n, const shape_list& in) {
  if (!op.check_form(st, in).ok() || !op.check(st, n, in).ok()) return false;
  const op_layouts l = op.layouts(st, n, in);
  for (int i = 0; i < in.n; ++i)
    if (!check(l.in[std::size_t(i)], in[i]).ok()) return false;
  return check(l.out, op.output_shape(in)).ok();
}

// candidates() == { every valid strategy of tuple ranks `ranks` (default: the inputs') },
// without repeats.
inline void check_candidates(const op_def& op, const shape_list& in, int n, std::vector<int> ranks = {}) {
  CAPTURE(op.type());
  CAPTURE(n);
  if (ranks.empty())
    for (int i = 0; i < in.n; ++i) ranks.push_back(in[i].ndim);
  const std::vector<strategy> c = op.candidates(n, in);
  std::set<std::string> got, want;
  for (const strategy& st : c) {
    CHECK(valid(op, st, n, in));
    got.insert(to_string(st));
  }
  CHECK(got.size() == c.size());
  for (const strategy& st : all_strategies(ranks, n))
    if (valid(op, st, n, in)) want.insert(to_string(st));
  CHECK(got == want);
}

// check_candidates of an operator definition, through the graph's view of it.
template <ops::operator_definition Op>
void check_candidates(const Op& op, const shape_list& in, int n, std::vector<int> ranks = {}) {
  check_candidates(*make_op(op), in, n, std::move(ranks));
}

inline std::vector<std::string> keys(const std::vector<strategy>& c) {
  std::vector<std::string> k;
  for (const strategy& st : c) k.push_back(to_string(st));
  return k;
}

}  // namespace tessera::graph::testing
