// Reading and writing the readers' binary files, with errors that name the file:
// a missing folder or file, a short read, a failed write.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>
#include <tessera/core/error.hpp>

namespace tessera::data::detail {

/// The folder of a dataset; `name: dataset folder <dir> does not exist` otherwise.
inline void check_folder(const std::string& name, const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw error(name + ": dataset folder " + dir.string() +
                (std::filesystem::exists(dir, ec) ? " is not a folder" : " does not exist"));
}

/// The size in bytes of a regular file; a tessera::error naming it when it is
/// missing or not a regular file.
inline std::uint64_t file_size(const std::string& name, const std::filesystem::path& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st)) throw error(name + ": " + path.string() + ": no such file");
  if (!std::filesystem::is_regular_file(st)) throw error(name + ": " + path.string() + ": not a regular file");
  const std::uintmax_t n = std::filesystem::file_size(path, ec);
  if (ec) throw error(name + ": " + path.string() + ": cannot read its size: " + ec.message());
  return static_cast<std::uint64_t>(n);
}

/// Reads byte ranges of one file, opening it on first use. Reads that move forward
/// (in order, or strided as a shard reads) are served from a read-ahead window of
/// 64 KiB; a read elsewhere (a shuffled order) reads just its bytes.
class file_reader {
 public:
  static constexpr std::size_t window = 64 * 1024;

  /// `size`: the file's size when it was checked (reads never look past it).
  file_reader(std::string name, std::filesystem::path path, std::uint64_t size)
      : name_(std::move(name)), path_(std::move(path)), size_(size) {}

  /// Reads bytes [offset, offset + n) into dst; a tessera::error if the file cannot be
  /// opened or ends before offset + n (it changed since its size was checked).
  void read(std::uint64_t offset, std::size_t n, void* dst) {
    const std::uint64_t end = start_ + buf_.size();
    if (offset >= start_ && offset + n <= end) {
      std::memcpy(dst, buf_.data() + (offset - start_), n);
      last_end_ = offset + n;
      return;
    }
    if (!in_.is_open()) {
      in_.rdbuf()->pubsetbuf(nullptr, 0);  // unbuffered: the window is the buffer
      in_.open(path_, std::ios::binary);
      if (!in_) throw error(name_ + ": " + path_.string() + ": cannot open the file");
    }
    const bool forward = offset >= last_end_ && offset - last_end_ <= window;
    std::uint64_t want = n;
    if (forward && offset < size_) want = std::max<std::uint64_t>(n, std::min<std::uint64_t>(window, size_ - offset));
    buf_.resize(static_cast<std::size_t>(want));
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(offset));
    in_.read(buf_.data(), static_cast<std::streamsize>(want));
    const auto got = static_cast<std::size_t>(std::max<std::streamsize>(in_.gcount(), 0));
    buf_.resize(got);
    start_ = offset;
    if (got < n)
      throw error(name_ + ": " + path_.string() + ": short read: " + std::to_string(n) + " bytes at offset " +
                  std::to_string(offset) + " (the file is shorter than when the dataset was made)");
    std::memcpy(dst, buf_.data(), n);
    last_end_ = offset + n;
  }

 private:
  std::string name_;
  std::filesystem::path path_;
  std::uint64_t size_;
  std::ifstream in_;
  std::vector<char> buf_;
  std::uint64_t start_ = 0, last_end_ = 0;
};

/// The big-endian 32-bit word at p.
inline std::uint32_t load_be32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
}
inline void store_be32(unsigned char* p, std::uint32_t v) {
  p[0] = static_cast<unsigned char>(v >> 24);
  p[1] = static_cast<unsigned char>(v >> 16);
  p[2] = static_cast<unsigned char>(v >> 8);
  p[3] = static_cast<unsigned char>(v);
}

/// Opens `path` for writing, creating its folder; a tessera::error naming it on failure.
inline std::ofstream create_file(const std::string& name, const std::filesystem::path& path) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw error(name + ": " + path.string() + ": cannot create the file");
  return out;
}

/// Writes n bytes; a tessera::error naming the file when the write fails.
inline void write_bytes(std::ofstream& out, const std::string& name, const std::filesystem::path& path,
                        const void* src, std::size_t n) {
  out.write(static_cast<const char*>(src), static_cast<std::streamsize>(n));
  if (!out) throw error(name + ": " + path.string() + ": write failed");
}

}  // namespace tessera::data::detail
