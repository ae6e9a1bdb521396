// For the snippets that write files: a fresh folder the ranks of this host share, named
// `tessera_docs_<what>_<rank 0's process id>`; rank 0 creates it and removes it at the end.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <tessera/comm/any_communicator.hpp>

struct shared_folder {
  tessera::any_communicator& world;
  std::filesystem::path path;
  shared_folder(tessera::any_communicator& w, const std::string& what) : world(w) {
    std::int64_t pid[1] = {w.rank() == 0 ? std::int64_t(::getpid()) : 0};
    w.broadcast(std::span<std::int64_t>(pid), 0);
    path = std::filesystem::temp_directory_path() / ("tessera_docs_" + what + "_" + std::to_string(pid[0]));
    if (w.rank() == 0) {
      std::filesystem::remove_all(path);
      std::filesystem::create_directories(path);
    }
    w.barrier();
  }
  ~shared_folder() {
    world.barrier();
    std::error_code ec;
    if (world.rank() == 0) std::filesystem::remove_all(path, ec);
  }
};
