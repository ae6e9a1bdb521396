// Tests of a dist_tensor's host form (tensor/host_form.hpp) on one process, with a form
// of the test's own that holds the shard's elements in reverse order: the row-major
// shard made from the form when read, and only then; the form kept beside the shard by
// a const tensor; dropped by the writing accessors and by assign_local; updated in
// place; copies that hold the values and no form; the storage released unread.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <utility>
#include <vector>
#include <tessera/tensor/dist_tensor.hpp>

using namespace tessera;

namespace {

// The shard's elements in reverse order; counts the times it was made plain.
class reversed final : public host_form<float> {
 public:
  explicit reversed(std::size_t n, int* made_plain = nullptr) : v_(n), made_plain_(made_plain) {}
  std::uint32_t kind() const override { return 0x52455645; }
  std::span<float> values() override { return v_; }
  std::span<const float> values() const override { return v_; }
  bool is_permutation() const override { return true; }
  bool same_layout(const host_form<float>& o) const override {
    return o.kind() == kind() && o.values().size() == v_.size();
  }
  void to_plain(float* dst) const override {
    std::reverse_copy(v_.begin(), v_.end(), dst);
    if (made_plain_) ++*made_plain_;
  }
  void from_plain(const float* src) override { std::reverse_copy(src, src + v_.size(), v_.begin()); }
  std::unique_ptr<host_form<float>> empty_like() const override {
    return std::make_unique<reversed>(v_.size(), made_plain_);
  }
  std::unique_ptr<host_form<float>> layout_only() const override { return empty_like(); }

 private:
  std::vector<float> v_;
  int* made_plain_;
};

const layout two_ranks{mesh{2}, {{0}, {}}};  // rows split over 2 ranks
const extents shape{4, 3};                   // each rank: (2, 3)

// A form holding 0, 1, ..., 5 in row-major order.
std::unique_ptr<reversed> counting_form(int* made_plain) {
  auto f = std::make_unique<reversed>(6, made_plain);
  const std::vector<float> plain{0, 1, 2, 3, 4, 5};
  f->from_plain(plain.data());
  return f;
}

std::vector<float> values_of(std::span<const float> s) { return std::vector<float>(s.begin(), s.end()); }

}  // namespace

TEST_CASE("a tensor held in a form only makes its row-major shard when read, once") {
  int made = 0;
  const dist_tensor<float> t(two_ranks, shape, 1, counting_form(&made));
  REQUIRE(t.form() != nullptr);
  CHECK(!t.plain_current());
  CHECK(made == 0);
  CHECK(values_of(t.data()) == std::vector<float>{0, 1, 2, 3, 4, 5});
  CHECK(t.local().shape() == std::vector<std::size_t>{2, 3});
  CHECK(t.local()(1, 2) == 5.f);
  CHECK(made == 1);
  CHECK(t.plain_current());
  CHECK(t.form() != nullptr);  // a reader keeps the form beside the shard
}

TEST_CASE("the writing accessors make the shard and drop the form") {
  int made = 0;
  dist_tensor<float> t(two_ranks, shape, 0, counting_form(&made));
  t.local()(0, 0) = 7.f;
  CHECK(made == 1);
  CHECK(t.form() == nullptr);
  CHECK(values_of(std::as_const(t).data()) == std::vector<float>{7, 1, 2, 3, 4, 5});

  dist_tensor<float> u(two_ranks, shape, 0, counting_form(&made));
  u.data()[5] = -1.f;
  CHECK(made == 2);
  CHECK(u.form() == nullptr);
  CHECK(std::as_const(u).local()(1, 2) == -1.f);

  dist_tensor<float> w(two_ranks, shape, 0, counting_form(&made));
  w.assign_local(xt::xarray<float>::from_shape({6}));  // replaces the values: the form is not read
  CHECK(made == 2);
  CHECK(w.form() == nullptr);
}

TEST_CASE("a const tensor keeps a form beside its shard; an update in place releases the shard") {
  int made = 0;
  dist_tensor<float> t(two_ranks, shape, 0);
  std::iota(t.local().begin(), t.local().end(), 10.f);
  const dist_tensor<float>& ct = t;
  auto f = std::make_unique<reversed>(6, &made);
  f->from_plain(ct.local().data());
  ct.keep_form(std::move(f));
  CHECK(ct.form() != nullptr);
  CHECK(ct.plain_current());
  CHECK(ct.local()(0, 1) == 11.f);
  CHECK(made == 0);

  host_form<float>* w = t.form_for_update();
  REQUIRE(w != nullptr);
  CHECK(!t.plain_current());
  for (float& v : w->values()) v *= 2.f;
  CHECK(values_of(ct.data()) == std::vector<float>{20, 22, 24, 26, 28, 30});
  CHECK(made == 1);
}

TEST_CASE("copies hold the values and no form; moves keep the form; released storage is not made") {
  int made = 0;
  const dist_tensor<float> t(two_ranks, shape, 1, counting_form(&made));
  const dist_tensor<float> c = t;
  CHECK(made == 1);
  CHECK(c.form() == nullptr);
  CHECK(values_of(c.data()) == std::vector<float>{0, 1, 2, 3, 4, 5});
  dist_tensor<float> a(two_ranks, shape, 1);
  a = t;
  CHECK(a.form() == nullptr);
  CHECK(values_of(std::as_const(a).data()) == std::vector<float>{0, 1, 2, 3, 4, 5});

  dist_tensor<float> m(two_ranks, shape, 1, counting_form(&made));
  dist_tensor<float> moved = std::move(m);
  CHECK(moved.form() != nullptr);
  CHECK(!moved.plain_current());
  const xt::xarray<float> storage = moved.release_storage();
  CHECK(made == 1);  // not made for a buffer whose values are unspecified
  CHECK(moved.form() == nullptr);
}
