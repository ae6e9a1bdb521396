// Files written under a temporary name and renamed into place: a crash never leaves
// a half-written file under the final name.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/core/error.hpp>

#if __has_include(<unistd.h>) && __has_include(<fcntl.h>)
#include <fcntl.h>
#include <unistd.h>
#define TESSERA_IO_POSIX 1
#else
#define TESSERA_IO_POSIX 0
#endif

namespace tessera::io {

namespace detail {
inline std::string errno_text(int e) { return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")"; }
}  // namespace detail

/// A file written under a temporary name in its final directory and renamed into
/// place by commit(): readers see either the previous file or the complete new one,
/// never a half-written file under the final name. commit() flushes, fsyncs the file,
/// renames it, and fsyncs the directory (POSIX). If commit() is not reached (an
/// exception, an early return) the destructor removes the temporary file; a process
/// killed while writing leaves only a hidden `.<name>.tmp.*` file behind.
class atomic_file {
 public:
  explicit atomic_file(std::filesystem::path final_path) : final_(std::move(final_path)) {
    const std::filesystem::path dir = final_.has_parent_path() ? final_.parent_path() : std::filesystem::path(".");
    std::random_device rd;
    for (int attempt = 0;; ++attempt) {
      const std::uint64_t r = (std::uint64_t(rd()) << 32) ^ rd();
      char tag[17];
      static constexpr char hex[] = "0123456789abcdef";
      for (int i = 0; i < 16; ++i) tag[i] = hex[(r >> (4 * i)) & 15];
      tag[16] = 0;
      std::string name(1, '.');
      name += final_.filename().string();
      name += ".tmp.";
      name += tag;
      temp_ = dir / name;
#if TESSERA_IO_POSIX
      fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd_ >= 0) break;
      const int e = errno;
      if (e == EEXIST && attempt < 8) continue;
      throw error("write " + final_.string() + ": cannot create the temporary file " + temp_.string() + ": " +
                  detail::errno_text(e));
#else
      if (std::filesystem::exists(temp_) && attempt < 8) continue;
      out_.open(temp_, std::ios::binary | std::ios::trunc);
      if (!out_) throw error("write " + final_.string() + ": cannot create the temporary file " + temp_.string());
      break;
#endif
    }
    buf_.reserve(buffer_bytes);
  }

  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;

  ~atomic_file() {
    if (committed_) return;
#if TESSERA_IO_POSIX
    if (fd_ >= 0) ::close(fd_);
    ::unlink(temp_.c_str());
#else
    out_.close();
    std::error_code ec;
    std::filesystem::remove(temp_, ec);
#endif
  }

  /// Appends bytes (buffered).
  void write(const void* data, std::size_t n) {
    const auto* p = static_cast<const char*>(data);
    if (buf_.size() + n <= buffer_bytes) {
      buf_.insert(buf_.end(), p, p + n);
      return;
    }
    flush();
    if (n >= buffer_bytes) write_through(p, n);
    else buf_.insert(buf_.end(), p, p + n);
  }
  std::uint64_t bytes_written() const { return written_ + buf_.size(); }

  /// Makes the file durable and visible under its final name.
  void commit() {
    flush();
#if TESSERA_IO_POSIX
    if (::fsync(fd_) != 0) fail_errno("fsync");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail_errno("close");
    if (::rename(temp_.c_str(), final_.c_str()) != 0) fail_errno("rename to the final name");
    committed_ = true;
    // Make the rename itself durable (best effort: some file systems refuse a
    // directory fsync).
    const std::filesystem::path dir = final_.has_parent_path() ? final_.parent_path() : std::filesystem::path(".");
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
#else
    out_.close();
    if (!out_) throw error("write " + final_.string() + ": writing " + temp_.string() + " failed");
    std::error_code ec;
    std::filesystem::rename(temp_, final_, ec);
    if (ec) throw error("write " + final_.string() + ": rename failed: " + ec.message());
    committed_ = true;
#endif
  }

  const std::filesystem::path& path() const { return final_; }
  const std::filesystem::path& temp_path() const { return temp_; }

 private:
  static constexpr std::size_t buffer_bytes = std::size_t(4) << 20;

  [[noreturn]] void fail_errno(const char* what) {
    const int e = errno;
    throw error("write " + final_.string() + ": " + what + " failed: " + detail::errno_text(e));
  }
  void flush() {
    if (buf_.empty()) return;
    write_through(buf_.data(), buf_.size());
    buf_.clear();
  }
  void write_through(const char* p, std::size_t n) {
#if TESSERA_IO_POSIX
    while (n > 0) {
      const ::ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        fail_errno("write");
      }
      p += w;
      n -= std::size_t(w);
      written_ += std::uint64_t(w);
    }
#else
    out_.write(p, std::streamsize(n));
    if (!out_) throw error("write " + final_.string() + ": writing " + temp_.string() + " failed");
    written_ += n;
#endif
  }

  std::filesystem::path final_, temp_;
#if TESSERA_IO_POSIX
  int fd_ = -1;
#else
  std::ofstream out_;
#endif
  std::vector<char> buf_;
  std::uint64_t written_ = 0;
  bool committed_ = false;
};

/// Writes `text` to `file` atomically (atomic_file).
inline void write_file_atomically(const std::filesystem::path& file, std::string_view text) {
  atomic_file f(file);
  f.write(text.data(), text.size());
  f.commit();
}

}  // namespace tessera::io

#undef TESSERA_IO_POSIX
