// Checkpoint file names `<prefix>-<epoch>_<step>.safetensors` and the rotation that
// keeps the newest K of them (MindSpore's keep_checkpoint_max).
#pragma once

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>
#include <tessera/core/error.hpp>

namespace tessera::io {

/// Epoch and step of a checkpoint, as its file name records them.
struct checkpoint_step {
  long long epoch = 0;
  long long step = 0;
  friend constexpr auto operator<=>(const checkpoint_step&, const checkpoint_step&) = default;
  // Spelled out: nvcc's front end declares the implicit operator== of a defaulted <=>
  // without defining it.
  friend constexpr bool operator==(const checkpoint_step& a, const checkpoint_step& b) {
    return a.epoch == b.epoch && a.step == b.step;
  }
};

namespace detail {
inline void check_prefix(std::string_view prefix, std::string_view fn) {
  if (prefix.empty()) throw error(std::string(fn) + ": the checkpoint prefix must not be empty");
  if (prefix.find('/') != std::string_view::npos || prefix.find('\\') != std::string_view::npos)
    throw error(std::string(fn) + ": the checkpoint prefix \"" + std::string(prefix) +
                "\" must be a file name, without a directory");
}

inline bool parse_decimal(std::string_view s, long long& out) {
  if (s.empty() || s.size() > 18) return false;
  long long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return true;
}
}  // namespace detail

inline constexpr std::string_view checkpoint_extension = ".safetensors";

/// "<prefix>-<epoch>_<step>.safetensors": checkpoint_file_name("resnet", 3, 156) is
/// "resnet-3_156.safetensors".
inline std::string checkpoint_file_name(std::string_view prefix, long long epoch, long long step) {
  detail::check_prefix(prefix, "checkpoint_file_name");
  if (epoch < 0 || step < 0)
    throw error("checkpoint_file_name: epoch and step must not be negative: epoch " + std::to_string(epoch) +
                ", step " + std::to_string(step));
  return std::string(prefix) + "-" + std::to_string(epoch) + "_" + std::to_string(step) +
         std::string(checkpoint_extension);
}

/// The epoch and step of `file_name` if it is "<prefix>-<epoch>_<step>.safetensors"
/// (decimal numbers), else nullopt. The prefix itself may hold '-' and '_'.
inline std::optional<checkpoint_step> parse_checkpoint_file_name(std::string_view file_name, std::string_view prefix) {
  if (file_name.size() <= prefix.size() + 1 + checkpoint_extension.size()) return std::nullopt;
  if (file_name.substr(0, prefix.size()) != prefix || file_name[prefix.size()] != '-') return std::nullopt;
  if (file_name.substr(file_name.size() - checkpoint_extension.size()) != checkpoint_extension) return std::nullopt;
  std::string_view mid = file_name.substr(prefix.size() + 1, file_name.size() - prefix.size() - 1 - checkpoint_extension.size());
  const std::size_t us = mid.find('_');
  if (us == std::string_view::npos) return std::nullopt;
  checkpoint_step s;
  if (!detail::parse_decimal(mid.substr(0, us), s.epoch) || !detail::parse_decimal(mid.substr(us + 1), s.step))
    return std::nullopt;
  return s;
}

/// A checkpoint file found in a directory.
struct checkpoint_entry {
  std::filesystem::path path;
  checkpoint_step at;
};

/// The checkpoints of `prefix` in `dir` (regular files named by checkpoint_file_name),
/// oldest first by (epoch, step). A missing directory has none.
inline std::vector<checkpoint_entry> list_checkpoints(const std::filesystem::path& dir, std::string_view prefix) {
  detail::check_prefix(prefix, "list_checkpoints");
  std::vector<checkpoint_entry> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code fec;
    if (!e.is_regular_file(fec)) continue;
    if (auto s = parse_checkpoint_file_name(e.path().filename().string(), prefix)) out.push_back({e.path(), *s});
  }
  if (ec) throw error("list_checkpoints: " + dir.string() + ": " + ec.message());
  std::sort(out.begin(), out.end(), [](const checkpoint_entry& a, const checkpoint_entry& b) {
    return a.at != b.at ? a.at < b.at : a.path < b.path;
  });
  return out;
}

/// The newest checkpoint of `prefix` in `dir`, if any.
inline std::optional<checkpoint_entry> latest_checkpoint(const std::filesystem::path& dir, std::string_view prefix) {
  std::vector<checkpoint_entry> all = list_checkpoints(dir, prefix);
  if (all.empty()) return std::nullopt;
  return all.back();
}

/// Keeps the newest `keep_max` checkpoints of `prefix` in `dir` (by epoch, then step)
/// and deletes the older ones; returns the deleted paths, oldest first. Other files are
/// never touched. keep_max must be at least 1.
///
///     // after saving net-2_4.safetensors with net-1_4 and net-2_2 present:
///     rotate_checkpoints(dir, "net", 2);   // deletes net-1_4.safetensors
inline std::vector<std::filesystem::path> rotate_checkpoints(const std::filesystem::path& dir, std::string_view prefix,
                                                             int keep_max) {
  if (keep_max < 1)
    throw error("rotate_checkpoints: keep_checkpoint_max must be at least 1, got " + std::to_string(keep_max));
  std::vector<checkpoint_entry> all = list_checkpoints(dir, prefix);
  std::vector<std::filesystem::path> removed;
  const std::size_t drop = all.size() > std::size_t(keep_max) ? all.size() - std::size_t(keep_max) : 0;
  for (std::size_t i = 0; i < drop; ++i) {
    std::error_code ec;
    std::filesystem::remove(all[i].path, ec);
    if (ec) throw error("rotate_checkpoints: cannot delete " + all[i].path.string() + ": " + ec.message());
    removed.push_back(all[i].path);
  }
  return removed;
}

}  // namespace tessera::io
