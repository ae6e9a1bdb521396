// CIFAR-10, binary version: cifar10_dataset reads data_batch_1..5.bin and
// test_batch.bin (validated, sharded), write_cifar10 writes them from arrays.
#pragma once

#include <cstddef>
#include <cstdint>
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

inline constexpr std::size_t cifar10_side = 32;
inline constexpr std::size_t cifar10_pixels = cifar10_side * cifar10_side * 3;  // 3x32x32, CHW
inline constexpr std::size_t cifar10_record = 1 + cifar10_pixels;                // label byte, image

/// The file names of a usage: "train" the five data batches, "test" test_batch.bin,
/// "all" both (train first).
inline std::vector<std::string> cifar10_files(const std::string& name, const std::string& usage, bool allow_all) {
  std::vector<std::string> train;
  for (int i = 1; i <= 5; ++i) train.push_back("data_batch_" + std::to_string(i) + ".bin");
  if (usage == "train") return train;
  if (usage == "test") return {"test_batch.bin"};
  if (usage == "all" && allow_all) {
    train.push_back("test_batch.bin");
    return train;
  }
  throw error(name + ": usage must be \"train\", \"test\"" + (allow_all ? ", or \"all\"" : "") + ": got \"" +
              usage + "\"");
}

/// cifar10_dataset's source: columns "image" (32, 32, 3) uint8 HWC and "label" int32.
class cifar10_source final : public source {
 public:
  explicit cifar10_source(const std::filesystem::path& dir, const std::vector<std::string>& names) {
    for (const std::string& n : names) {
      const std::filesystem::path path = dir / n;
      const std::uint64_t size = file_size("cifar10", path);
      if (size % cifar10_record != 0)
        throw error("cifar10: " + path.string() + ": the file must hold whole " + std::to_string(cifar10_record) +
                    "-byte records (a label byte, then a 3x32x32 image): it has " + std::to_string(size) +
                    " bytes, " +
                    (size < cifar10_record ? std::string("less than one record")
                                           : std::to_string(size % cifar10_record) + " more than " +
                                                 std::to_string(size / cifar10_record) + " records"));
      files_.push_back(path);
      sizes_.push_back(size);
      counts_.push_back(static_cast<std::int64_t>(size / cifar10_record));
      count_ += counts_.back();
    }
  }
  std::int64_t count() const override { return count_; }
  const std::vector<std::string>& columns() const override { return columns_; }
  std::unique_ptr<source_reader> reader() const override { return std::make_unique<cifar10_reader>(*this); }

 private:
  class cifar10_reader final : public source_reader {
   public:
    explicit cifar10_reader(const cifar10_source& s) : s_(s), record_(cifar10_record) {
      for (std::size_t k = 0; k < s.files_.size(); ++k) files_.emplace_back("cifar10", s.files_[k], s.sizes_[k]);
    }
    std::vector<array> read(std::int64_t index) override {
      std::size_t k = 0;
      while (index >= s_.counts_[k]) index -= s_.counts_[k++];
      files_[k].read(static_cast<std::uint64_t>(index) * cifar10_record, cifar10_record, record_.data());
      const unsigned char label = record_[0];
      if (label > 9)
        throw error("cifar10: " + s_.files_[k].string() + ": record " + std::to_string(index) + " has label " +
                    std::to_string(label) + ", not in [0, 9]");
      constexpr std::size_t plane = cifar10_side * cifar10_side;
      xt::xarray<std::uint8_t> image = xt::xarray<std::uint8_t>::from_shape({cifar10_side, cifar10_side, 3});
      std::uint8_t* out = image.data();
      const unsigned char* chw = record_.data() + 1;
      for (std::size_t p = 0; p < plane; ++p)
        for (std::size_t c = 0; c < 3; ++c) out[p * 3 + c] = chw[c * plane + p];
      return {array(std::move(image)), array::scalar(std::int32_t{label})};
    }

   private:
    const cifar10_source& s_;
    std::vector<file_reader> files_;
    std::vector<unsigned char> record_;
  };

  std::vector<std::filesystem::path> files_;
  std::vector<std::uint64_t> sizes_;
  std::vector<std::int64_t> counts_;
  std::int64_t count_ = 0;
  std::vector<std::string> columns_{"image", "label"};
};

}  // namespace detail

/// CIFAR-10 from the binary version's files in `dir` (cifar-10-batches-bin), as
/// MindSpore's Cifar10Dataset: `usage` "train" (data_batch_1.bin ... data_batch_5.bin,
/// 50000 samples), "test" (test_batch.bin, 10000) or "all" (train, then test). Each
/// file is a sequence of 3073-byte records: the label byte, then the image as 3x32x32
/// bytes, channel-major (CHW: the red plane, green, blue). Rows: "image", uint8 of
/// shape (32, 32, 3) (HWC, as MindSpore yields it) and "label", an int32 scalar in
/// [0, 9]. Sharded and shuffled as shard_options says (no shuffle by default).
///
/// A missing file, a size that is not a whole number of records, or a label outside
/// [0, 9] (checked as each record is read) is a tessera::error naming the file.
inline dataset cifar10_dataset(const std::filesystem::path& dir, const std::string& usage = "all",
                               shard_options o = {}) {
  const std::vector<std::string> names = detail::cifar10_files("cifar10", usage, true);
  detail::check_shard_options("cifar10", o);
  detail::check_folder("cifar10", dir);
  auto src = std::make_shared<detail::cifar10_source>(dir, names);
  return dataset(std::make_shared<detail::source_node>("cifar10", std::move(src), o));
}

/// Writes CIFAR-10 binary files into `dir` (created if needed): usage "test" writes
/// test_batch.bin, "train" data_batch_1.bin ... data_batch_5.bin, data_batch_k.bin
/// holding records [(k - 1) n / 5, k n / 5) (integer division). `images`: shape
/// (n, 32, 32, 3), HWC; `labels`: shape (n,). cifar10_dataset(dir, usage) then yields
/// these images and labels, in order.
inline void write_cifar10(const std::filesystem::path& dir, const std::string& usage,
                          const xt::xarray<std::uint8_t>& images, const xt::xarray<std::uint8_t>& labels) {
  const std::string name = "write_cifar10";
  const std::vector<std::string> files = detail::cifar10_files(name, usage, false);
  const auto& s = images.shape();
  constexpr std::size_t side = detail::cifar10_side;
  if (s.size() != 4 || s[1] != side || s[2] != side || s[3] != 3)
    throw error(name + ": images must have shape (n, 32, 32, 3): got " + detail::shape_string(s));
  if (labels.dimension() != 1 || labels.shape()[0] != s[0])
    throw error(name + ": labels must have shape (n,) with n = " + std::to_string(s[0]) + " images: got " +
                detail::shape_string(labels.shape()));
  const std::size_t n = s[0];
  constexpr std::size_t plane = side * side;
  std::vector<unsigned char> record(detail::cifar10_record);
  for (std::size_t f = 0; f < files.size(); ++f) {
    const auto path = dir / files[f];
    std::ofstream out = detail::create_file(name, path);
    for (std::size_t i = f * n / files.size(); i < (f + 1) * n / files.size(); ++i) {
      record[0] = labels(i);
      const std::uint8_t* hwc = images.data() + i * detail::cifar10_pixels;
      for (std::size_t p = 0; p < plane; ++p)
        for (std::size_t c = 0; c < 3; ++c) record[1 + c * plane + p] = hwc[p * 3 + c];
      detail::write_bytes(out, name, path, record.data(), record.size());
    }
    out.close();
    if (!out) throw error(name + ": " + path.string() + ": write failed");
  }
}

}  // namespace tessera::data
