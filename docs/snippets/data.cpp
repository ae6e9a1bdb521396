// docs/data.md's example: seed 001's CIFAR-10 input pipeline on every rank of the job, over
// synthetic CIFAR-10 files; then the page's other statements, checked: the sharding rule,
// the source shuffle, the formats, slice, the random transforms and a truncated file's error.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <system_error>
#include <vector>
#include <tessera/comm/launch.hpp>
#include <tessera/core/layout.hpp>
#include <tessera/data/cifar10.hpp>
#include <tessera/data/dataset.hpp>
#include <tessera/data/mnist.hpp>
#include <tessera/data/source.hpp>
#include <tessera/data/synthetic.hpp>
#include <tessera/data/transforms.hpp>
#include <xtensor/xview.hpp>

#include "shared_folder.hpp"

namespace fs = std::filesystem;

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw tessera::error("data: " + what);
}

// The "x" values of one pass, as one flat list.
std::vector<float> values(const tessera::data::dataset& ds, std::int64_t pass = 0) {
  std::vector<float> out;
  for (const tessera::data::row& r : ds.epoch(pass)) {
    const auto& x = r["x"].get<float>();
    out.insert(out.end(), x.begin(), x.end());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::run(argc, argv, [](tessera::any_communicator& world) {
    shared_folder tmp(world, "data");
    const fs::path dir = tmp.path / "cifar-10-batches-bin";
    // [pipeline]
    namespace data = tessera::data;
    const std::int64_t epochs = 2;
    if (world.rank() == 0) {  // CIFAR-10's binary files; here 128 synthetic images
      auto [images, labels] = data::synthetic_images(128, 32, 32, 3, 10, /*seed=*/1);
      data::write_cifar10(dir, "train", images, labels);  // data_batch_1.bin ... data_batch_5.bin
    }
    world.barrier();
    auto ds = data::cifar10_dataset(dir, "train",
                                    {.num_shards = world.size(), .shard_id = world.rank(), .shuffle = true})
                  .map({data::type_cast(data::dtype::int32)}, "label")
                  .map({data::random_crop(32, 32, 4), data::random_horizontal_flip(), data::resize(224, 224),
                        data::rescale(1.0f / 255, 0),
                        data::normalize({0.4465f, 0.4822f, 0.4914f}, {0.2010f, 0.1994f, 0.2023f}), data::hwc2chw()},
                       "image", 2)  // on 2 worker threads
                  .shuffle(10)
                  .batch(32, true)
                  .repeat(epochs)
                  .prefetch(4);
    std::int64_t steps = 0;
    for (const data::row& b : ds) {  // a step takes b["image"].get<float>() and b["label"].get<std::int32_t>()
      if (b["image"].type() != data::dtype::float32 || b["image"].shape() != std::vector<std::size_t>{32, 3, 224, 224} ||
          b["label"].type() != data::dtype::int32 || b["label"].shape() != std::vector<std::size_t>{32})
        throw tessera::error("data: a batch is not image float32 (32, 3, 224, 224), label int32 (32,)");
      ++steps;
    }
    // [/pipeline]
    // every shard reads ceil(128 / ranks) images: whole batches of 32 in each epoch
    const std::int64_t per_epoch = data::shard_size(128, world.size()) / 32;
    require(steps == epochs * per_epoch && ds.get_dataset_size() == steps,
            "the pipeline made " + std::to_string(steps) + " batches, get_dataset_size() says " +
                std::to_string(ds.get_dataset_size()) + ", expected " + std::to_string(epochs * per_epoch));

    // Shards: 10 samples on 4 shards, shard 2 reads 2, 6, 0; every shard ceil(10 / 4) = 3.
    require(data::shard_indices(10, {.num_shards = 4, .shard_id = 2}) == std::vector<std::int64_t>{2, 6, 0},
            "shard 2 of 4 does not read samples 2, 6, 0 of 10");
    // The source shuffle: the same permutation on every rank, the shards' first n
    // positions every sample once, a new permutation in the next epoch.
    std::vector<std::int64_t> seen;
    for (std::int64_t s = 0; s < 4; ++s) {
      const auto got = data::shard_indices(10, {.num_shards = 4, .shard_id = s, .shuffle = true, .seed = 5});
      for (std::size_t j = 0; j < got.size(); ++j)
        if (std::size_t(s) + 4 * j < 10) seen.push_back(got[j]);
    }
    std::sort(seen.begin(), seen.end());
    require(seen == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, "the shuffled shards miss a sample");
    std::vector<std::int64_t> mine = data::shard_indices(10, {.num_shards = 4, .shuffle = true, .seed = 5}),
                              low = mine, high = mine;
    world.all_reduce(std::span<std::int64_t>(low), tessera::reduce_op::min);
    world.all_reduce(std::span<std::int64_t>(high), tessera::reduce_op::max);
    require(low == mine && high == mine, "the ranks shuffle differently");
    require(mine != data::shard_indices(10, {.num_shards = 4, .shuffle = true, .seed = 5}, 1),
            "the shuffle is the same in epochs 0 and 1");

    // slice: .batch(16).slice("x", layout(mesh{8}, {{}, {0}}), r) gives rank r every
    // sample's r-th eighth of the features (here 32: 4 each).
    const auto features = data::generator_dataset(
        [](std::int64_t i) {
          xt::xarray<float> x = xt::xarray<float>::from_shape({32});
          for (std::size_t f = 0; f < 32; ++f) x(f) = float(i * 100 + std::int64_t(f));
          return std::vector<data::array>{x};
        },
        {"x"}, 16);
    for (int r = 0; r < 8; ++r) {
      const auto sliced = features.batch(16).slice("x", tessera::layout(tessera::mesh{8}, {{}, {0}}), r);
      std::vector<float> want;
      for (int i = 0; i < 16; ++i)
        for (int f = 4 * r; f < 4 * r + 4; ++f) want.push_back(float(i * 100 + f));
      const data::row b = *sliced.begin();
      require(b["x"].shape() == std::vector<std::size_t>{16, 4} && values(sliced) == want,
              "slice does not give rank " + std::to_string(r) + " its eighth of the features");
    }

    if (world.rank() == 0) {
      // CIFAR-10: 3073-byte records, CHW in the file, HWC (32, 32, 3) uint8 in the rows;
      // data_batch_1.bin holds records [0, 128 / 5).
      require(fs::file_size(dir / "data_batch_1.bin") == 25 * 3073, "data_batch_1.bin is not 25 records of 3073 bytes");
      auto [images, labels] = data::synthetic_images(128, 32, 32, 3, 10, /*seed=*/1);
      std::int64_t i = 0;
      for (const data::row& r : data::cifar10_dataset(dir, "train")) {
        const xt::xarray<std::uint8_t> want = xt::view(images, i);
        require(r["image"] == data::array(want) && r["label"] == data::array::scalar(std::int32_t(labels(i))),
                "cifar10_dataset does not give back image " + std::to_string(i) + " as written");
        ++i;
      }
      require(i == 128, "cifar10_dataset read " + std::to_string(i) + " of 128 images");

      // MNIST: image uint8 (28, 28, 1), label int32.
      const fs::path mnist = tmp.path / "mnist";
      auto [digits, classes] = data::synthetic_images(20, 28, 28, 1, 10, /*seed=*/2);
      data::write_mnist(mnist, "train", digits, classes);
      const data::row first = *data::mnist_dataset(mnist, "train").begin();
      require(first["image"].type() == data::dtype::uint8 &&
                  first["image"].shape() == std::vector<std::size_t>{28, 28, 1} &&
                  first["label"].type() == data::dtype::int32 && first["label"].ndim() == 0,
              "an MNIST row is not image uint8 (28, 28, 1), label int32");

      // Random transforms draw from (seed, epoch, sample index): the same sample is
      // augmented alike on 1 or 2 shards, after a shuffle and a prefetch.
      const std::vector<data::transform> augment{data::random_crop(32, 32, 4), data::random_horizontal_flip()};
      std::vector<data::row> one, two;
      for (const data::row& r : data::cifar10_dataset(dir, "train").map(augment, "image").epoch(1)) one.push_back(r);
      for (const data::row& r : data::cifar10_dataset(dir, "train", {.num_shards = 2, .shard_id = 1})
                                    .map(augment, "image", 2)
                                    .shuffle(5)
                                    .prefetch(2)
                                    .epoch(1))
        two.push_back(r);
      require(two.size() == 64, "shard 1 of 2 read " + std::to_string(two.size()) + " of 64 images");
      for (const data::row& r : two)
        require(r["image"] == one[std::size_t(r.index)]["image"],
                "sample " + std::to_string(r.index) + " is augmented differently on 2 shards");

      // A truncated file: its name and the numbers.
      const fs::path bad = tmp.path / "truncated";
      fs::create_directories(bad);
      std::vector<char> bytes(1000, 0);
      const unsigned char header[16] = {0, 0, 8, 3, 0, 0, 0xea, 0x60, 0, 0, 0, 28, 0, 0, 0, 28};  // 60000 of 28x28
      std::copy(header, header + 16, bytes.begin());
      std::ofstream(bad / "train-images-idx3-ubyte", std::ios::binary).write(bytes.data(), 1000);
      std::string what;
      try {
        data::mnist_dataset(bad, "train");
      } catch (const tessera::error& e) {
        what = e.what();
      }
      const std::string want = "mnist: " + (bad / "train-images-idx3-ubyte").string() +
                               ": truncated: the header says 60000 images of 28x28 (47040016 bytes), the file has "
                               "1000 bytes";
      require(what == want, "a truncated MNIST file gave \"" + what + "\", expected \"" + want + "\"");
    }
  });
}
