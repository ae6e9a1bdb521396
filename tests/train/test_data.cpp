// Tests of train/data.hpp under mpiexec (1 and 2 ranks): Model.train and evaluate read
// data::dataset batches (MnistDataset sharded over the ranks, rescaled, batched): as
// many steps as batches, the one-rank losses with the same global batches, every
// sample evaluated once; a row without inputs and labels is an error.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>
#include <unistd.h>
#include <tessera/comm/local.hpp>
#include <tessera/comm/mpi.hpp>
#include <tessera/data/mnist.hpp>
#include <tessera/data/synthetic.hpp>
#include <tessera/data/transforms.hpp>
#include <tessera/nn/layers.hpp>
#include <tessera/nn/loss.hpp>
#include <tessera/optim/sgd.hpp>
#include <tessera/train/data.hpp>

namespace train_test_data {  // the file's own scope in its test group's translation unit

using namespace tessera;
namespace fs = std::filesystem;

namespace {

struct net_t : nn::module<float> {
  nn::flatten<float> flatten;
  nn::dense<float> fc{64, 10, nn::initializer::normal(0.1), "zeros"};
  void visit(nn::visitor<float>& v) override {
    v.child("flatten", flatten);
    v.child("fc", fc);
  }
  template <class V>
  V operator()(V x) {
    return fc(flatten(x));
  }
};

struct losses : train::callback<float> {
  std::vector<double> v;
  void on_step_end(train::run_context<float>& rc) override { v.push_back(rc.loss); }
};

data::dataset images(const fs::path& dir, const char* usage, std::int64_t shards, std::int64_t shard, std::int64_t b) {
  return data::mnist_dataset(dir, usage, {.num_shards = shards, .shard_id = shard})
      .map({data::rescale(1.0f / 255, 0), data::hwc2chw()}, "image")
      .batch(b, true);
}

}  // namespace

TEST_CASE("model: trains and evaluates on data::dataset batches") {
  any_communicator world(mpi_communicator::world());
  context ctx(world);
  const int p = world.size(), r = world.rank();
  std::vector<char> name(256, '\0');
  if (r == 0) {
    std::string t = (fs::temp_directory_path() / "tessera-data-XXXXXX").string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    const auto train_set = data::synthetic_images(64, 8, 8, 1, 10, 3);
    data::write_mnist(t, "train", train_set.images, train_set.labels);
    const auto test_set = data::synthetic_images(32, 8, 8, 1, 10, 4);
    data::write_mnist(t, "test", test_set.images, test_set.labels);
    std::copy(t.begin(), t.end(), name.begin());
  }
  world.broadcast(std::span<char>(name), 0);
  const fs::path dir = std::string(name.data());

  nn::cross_entropy_loss<float> ce;
  net_t net;
  optim::sgd<float> opt(net.trainable_params(), 0.05f);
  train::model model(net, ce, opt, ctx);
  auto ds = images(dir, "train", p, r, 4);
  losses rec;
  model.train(2, ds, {&rec});
  CHECK(rec.v.size() == std::size_t(2 * 16 / p));  // 64 samples, 4 per rank and step

  any_communicator one{local_communicator{}};
  context solo(one);
  net_t ref;
  optim::sgd<float> opt_ref(ref.trainable_params(), 0.05f);
  train::model model_ref(ref, ce, opt_ref, solo);
  auto all = images(dir, "train", 1, 0, 4 * p);
  losses rec_ref;
  model_ref.train(2, all, {&rec_ref});
  REQUIRE(rec_ref.v.size() == rec.v.size());
  for (std::size_t i = 0; i < rec.v.size(); ++i) CHECK(rec.v[i] == doctest::Approx(rec_ref.v[i]).epsilon(1e-5));

  auto test = images(dir, "test", p, r, 4);
  auto test_all = images(dir, "test", 1, 0, 4 * p);
  const auto m = train::evaluate(net, ce, test, ctx);
  const auto m1 = train::evaluate(ref, ce, test_all, solo);
  CHECK(m.samples == 32);
  CHECK(m.accuracy == doctest::Approx(m1.accuracy));

  data::row bad;
  bad.names = {"image"};
  bad.values = {data::array(xt::xarray<float>::from_shape({2, 4}))};
  CHECK_THROWS_WITH(data::to_local_batch(train::detail::tag<float>{}, bad),
                    "model: a batch row needs an inputs and a labels column; the columns are image");
  world.barrier();
  if (r == 0) fs::remove_all(dir);
}
}  // namespace train_test_data
