// The examples' temporary folder shared by every rank: rank 0 makes and fills it, every
// rank reads it, rank 0 removes it once all are done.
#pragma once

#include <algorithm>
#include <exception>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <system_error>
#include <vector>
#include <unistd.h>
#include <tessera/comm/any_communicator.hpp>
#include <tessera/core/error.hpp>

namespace tessera::examples {

/// A fresh folder <temp>/<prefix>XXXXXX (mkdtemp), the same on every rank of `world`.
/// Rank 0 makes it, calls fill(path) (say, to write a generated dataset into it), then
/// broadcasts its name, so no rank sees it before it is filled. At the end every rank
/// waits for the others (a barrier) and rank 0 removes it with its contents. When the
/// end comes by an exception, the job is failing (tessera::run ends it): nothing waits
/// for the other ranks, which may be inside another collective, and the folder is left
/// unless this rank is alone. Errors name `program`:
/// `mnist_data_parallel: cannot make a temporary folder /tmp/tessera-mnist-XXXXXX`.
class shared_temp_dir {
 public:
  shared_temp_dir(any_communicator& world, const std::string& program, const std::string& prefix,
                  const std::function<void(const std::filesystem::path&)>& fill = {})
      : world_(world) {
    std::vector<char> name(4096, '\0');
    if (world.rank() == 0) {
      std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
      if (tmpl.size() >= name.size())
        throw error(program + ": the temporary folder's name " + tmpl + " has " + std::to_string(tmpl.size()) +
                    " characters, more than " + std::to_string(name.size() - 1));
      if (!::mkdtemp(tmpl.data())) throw error(program + ": cannot make a temporary folder " + tmpl);
      try {
        if (fill) fill(tmpl);
      } catch (...) {
        std::error_code ec;
        std::filesystem::remove_all(tmpl, ec);
        throw;
      }
      std::copy(tmpl.begin(), tmpl.end(), name.begin());
    }
    world.broadcast(std::span<char>(name), 0);
    path_ = std::string(name.data());
  }
  ~shared_temp_dir() {
    std::error_code ec;
    if (std::uncaught_exceptions() > unwinding_) {
      if (world_.size() == 1) std::filesystem::remove_all(path_, ec);
      return;
    }
    world_.barrier();
    if (world_.rank() == 0) std::filesystem::remove_all(path_, ec);
  }
  shared_temp_dir(const shared_temp_dir&) = delete;
  shared_temp_dir& operator=(const shared_temp_dir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  any_communicator& world_;
  std::filesystem::path path_;
  int unwinding_ = std::uncaught_exceptions();
};

}  // namespace tessera::examples
