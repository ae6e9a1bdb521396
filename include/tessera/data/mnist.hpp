// MNIST in its idx-ubyte files: mnist_dataset reads them (validated, sharded),
// write_mnist writes them from arrays.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <xtensor/xarray.hpp>
#include <tessera/core/error.hpp>
#include <tessera/data/column.hpp>
#include <tessera/data/dataset.hpp>
#include <tessera/data/file.hpp>
#include <tessera/data/source.hpp>

namespace tessera::data {

namespace detail {

inline constexpr std::uint32_t mnist_image_magic = 0x00000803;  // unsigned bytes, 3 dims
inline constexpr std::uint32_t mnist_label_magic = 0x00000801;  // unsigned bytes, 1 dim

/// "train" -> {"train"}, "test" -> {"t10k"}, "all" -> both; `name` starts the error.
inline std::vector<std::string> mnist_prefixes(const std::string& name, const std::string& usage, bool allow_all) {
  if (usage == "train") return {"train"};
  if (usage == "test") return {"t10k"};
  if (usage == "all" && allow_all) return {"train", "t10k"};
  throw error(name + ": usage must be \"train\", \"test\"" + (allow_all ? ", or \"all\"" : "") + ": got \"" +
              usage + "\"");
}

inline std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

/// One images/labels file pair, its header checked against its size.
struct mnist_part {
  std::filesystem::path images, labels;
  std::uint64_t images_size = 0;
  std::int64_t count = 0;
  std::uint32_t rows = 0, cols = 0;
  std::vector<std::uint8_t> label_values;  // read whole: 1 byte per image
};

inline mnist_part open_mnist_part(const std::filesystem::path& dir, const std::string& prefix) {
  const std::string name = "mnist";
  mnist_part p;
  p.images = dir / (prefix + "-images-idx3-ubyte");
  p.labels = dir / (prefix + "-labels-idx1-ubyte");
  const std::string ip = name + ": " + p.images.string();
  const std::string lp = name + ": " + p.labels.string();

  const std::uint64_t isize = file_size(name, p.images);
  if (isize < 16)
    throw error(ip + ": truncated: an image file starts with a 16-byte header, the file has " +
                std::to_string(isize) + " bytes");
  unsigned char h[16];
  file_reader(name, p.images, isize).read(0, 16, h);
  if (load_be32(h) != mnist_image_magic)
    throw error(ip + ": wrong magic number " + hex32(load_be32(h)) + ": an image file starts with " +
                hex32(mnist_image_magic) + " (unsigned bytes, 3 dims)");
  const std::uint32_t n = load_be32(h + 4);
  p.rows = load_be32(h + 8);
  p.cols = load_be32(h + 12);
  const std::string says = std::to_string(n) + " images of " + std::to_string(p.rows) + "x" + std::to_string(p.cols);
  if (p.rows == 0 || p.cols == 0)
    throw error(ip + ": the header says " + says + ": an image must have at least one row and column");
  // rows * cols < 2^64; the total may overflow 64 bits, and then exceeds any file.
  const std::uint64_t pixels = std::uint64_t{p.rows} * p.cols;
  const bool overflow = n != 0 && pixels > (~std::uint64_t{0} - 16) / n;
  const std::uint64_t expected = overflow ? 0 : 16 + n * pixels;
  if (overflow || expected != isize)
    throw error(ip + (overflow || expected > isize ? ": truncated" : ": longer than its header says") +
                ": the header says " + says + " (" + (overflow ? std::string("over 2^64") : std::to_string(expected)) +
                " bytes), the file has " + std::to_string(isize) + " bytes");
  p.count = n;
  p.images_size = isize;

  const std::uint64_t lsize = file_size(name, p.labels);
  if (lsize < 8)
    throw error(lp + ": truncated: a label file starts with an 8-byte header, the file has " +
                std::to_string(lsize) + " bytes");
  file_reader labels(name, p.labels, lsize);
  labels.read(0, 8, h);
  if (load_be32(h) != mnist_label_magic)
    throw error(lp + ": wrong magic number " + hex32(load_be32(h)) + ": a label file starts with " +
                hex32(mnist_label_magic) + " (unsigned bytes, 1 dim)");
  const std::uint32_t nl = load_be32(h + 4);
  if (8 + std::uint64_t{nl} != lsize)
    throw error(lp + (8 + std::uint64_t{nl} > lsize ? ": truncated" : ": longer than its header says") +
                ": the header says " + std::to_string(nl) + " labels (" + std::to_string(8 + std::uint64_t{nl}) +
                " bytes), the file has " + std::to_string(lsize) + " bytes");
  if (nl != n)
    throw error(name + ": the image and label counts differ: " + p.images.string() + " has " + std::to_string(n) +
                " images, " + p.labels.string() + " has " + std::to_string(nl) + " labels");
  p.label_values.resize(nl);
  if (nl) labels.read(8, nl, p.label_values.data());
  for (std::uint32_t i = 0; i < nl; ++i)
    if (p.label_values[i] > 9)
      throw error(lp + ": label " + std::to_string(p.label_values[i]) + " of image " + std::to_string(i) +
                  " is not in [0, 9]");
  return p;
}

/// mnist_dataset's source: columns "image" (rows, cols, 1) uint8 and "label" int32.
class mnist_source final : public source {
 public:
  explicit mnist_source(std::vector<mnist_part> parts) : parts_(std::move(parts)) {
    for (const mnist_part& p : parts_) count_ += p.count;
    for (const mnist_part& p : parts_)
      if (p.rows != parts_[0].rows || p.cols != parts_[0].cols)
        throw error("mnist: every file must hold images of one size: " + parts_[0].images.string() + " has " +
                    std::to_string(parts_[0].rows) + "x" + std::to_string(parts_[0].cols) + ", " +
                    p.images.string() + " has " + std::to_string(p.rows) + "x" + std::to_string(p.cols));
  }
  std::int64_t count() const override { return count_; }
  const std::vector<std::string>& columns() const override { return columns_; }
  std::unique_ptr<source_reader> reader() const override { return std::make_unique<mnist_reader>(*this); }

 private:
  class mnist_reader final : public source_reader {
   public:
    explicit mnist_reader(const mnist_source& s) : s_(s) {
      for (const mnist_part& p : s.parts_) files_.emplace_back("mnist", p.images, p.images_size);
    }
    std::vector<array> read(std::int64_t index) override {
      std::size_t k = 0;
      while (index >= s_.parts_[k].count) index -= s_.parts_[k++].count;
      const mnist_part& p = s_.parts_[k];
      const std::size_t pixels = std::size_t{p.rows} * p.cols;
      xt::xarray<std::uint8_t> image = xt::xarray<std::uint8_t>::from_shape({p.rows, p.cols, 1});
      files_[k].read(16 + static_cast<std::uint64_t>(index) * pixels, pixels, image.data());
      const std::uint8_t label = p.label_values[static_cast<std::size_t>(index)];
      return {array(std::move(image)), array::scalar(std::int32_t{label})};
    }

   private:
    const mnist_source& s_;
    std::vector<file_reader> files_;
  };

  std::vector<mnist_part> parts_;
  std::int64_t count_ = 0;
  std::vector<std::string> columns_{"image", "label"};
};

}  // namespace detail

/// MNIST from the four idx-ubyte files of `dir` (train-images-idx3-ubyte,
/// train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte), as
/// MindSpore's MnistDataset. `usage`: "train" (60000 samples), "test" (10000) or "all"
/// (train, then test). Rows: "image", uint8 of shape (28, 28, 1) (HWC), and "label", an
/// int32 scalar in [0, 9]. Sharded and shuffled as shard_options says (no shuffle by
/// default).
///
/// The headers are checked against the file sizes, and the labels (read whole)
/// against [0, 9], when the dataset is made; the images are read as the samples are.
/// A missing, truncated or corrupt file is a tessera::error naming the file and the
/// numbers:
///   mnist: <dir>/train-images-idx3-ubyte: truncated: the header says 60000 images of
///   28x28 (47040016 bytes), the file has 1000 bytes
inline dataset mnist_dataset(const std::filesystem::path& dir, const std::string& usage = "all",
                             shard_options o = {}) {
  const std::vector<std::string> prefixes = detail::mnist_prefixes("mnist", usage, true);
  detail::check_shard_options("mnist", o);
  detail::check_folder("mnist", dir);
  std::vector<detail::mnist_part> parts;
  for (const std::string& prefix : prefixes) parts.push_back(detail::open_mnist_part(dir, prefix));
  auto src = std::make_shared<detail::mnist_source>(std::move(parts));
  return dataset(std::make_shared<detail::source_node>("mnist", std::move(src), o));
}

/// Writes MNIST idx-ubyte files into `dir` (created if needed): usage "train" writes
/// train-images-idx3-ubyte and train-labels-idx1-ubyte, "test" the t10k- pair.
/// `images`: shape (n, rows, cols) or (n, rows, cols, 1); `labels`: shape (n,).
/// mnist_dataset(dir, usage) then yields these images and labels, in order.
inline void write_mnist(const std::filesystem::path& dir, const std::string& usage,
                        const xt::xarray<std::uint8_t>& images, const xt::xarray<std::uint8_t>& labels) {
  const std::string name = "write_mnist";
  const std::string prefix = detail::mnist_prefixes(name, usage, false)[0];
  const auto& s = images.shape();
  if (!(s.size() == 3 || (s.size() == 4 && s[3] == 1)))
    throw error(name + ": images must have shape (n, rows, cols) or (n, rows, cols, 1): got " +
                detail::shape_string(s));
  if (labels.dimension() != 1 || labels.shape()[0] != s[0])
    throw error(name + ": labels must have shape (n,) with n = " + std::to_string(s[0]) + " images: got " +
                detail::shape_string(labels.shape()));
  if (s[0] > 0xffffffffu || s[1] > 0xffffffffu || s[2] > 0xffffffffu)
    throw error(name + ": the idx format holds at most 2^32 - 1 images, rows and columns: got " +
                detail::shape_string(s));

  unsigned char h[16];
  const auto ipath = dir / (prefix + "-images-idx3-ubyte");
  std::ofstream out = detail::create_file(name, ipath);
  detail::store_be32(h, detail::mnist_image_magic);
  detail::store_be32(h + 4, static_cast<std::uint32_t>(s[0]));
  detail::store_be32(h + 8, static_cast<std::uint32_t>(s[1]));
  detail::store_be32(h + 12, static_cast<std::uint32_t>(s[2]));
  detail::write_bytes(out, name, ipath, h, 16);
  detail::write_bytes(out, name, ipath, images.data(), images.size());
  out.close();
  if (!out) throw error(name + ": " + ipath.string() + ": write failed");

  const auto lpath = dir / (prefix + "-labels-idx1-ubyte");
  std::ofstream lout = detail::create_file(name, lpath);
  detail::store_be32(h, detail::mnist_label_magic);
  detail::store_be32(h + 4, static_cast<std::uint32_t>(s[0]));
  detail::write_bytes(lout, name, lpath, h, 8);
  detail::write_bytes(lout, name, lpath, labels.data(), labels.size());
  lout.close();
  if (!lout) throw error(name + ": " + lpath.string() + ": write failed");
}

}  // namespace tessera::data
