// Rank tables (MindSpore's RANK_TABLE_FILE, version "1.0"): the servers of a job and
// their devices with each device's rank, read and validated, and the placement of one
// process (rank, world size, node, node-local rank, master address) from RANK_ID and
// DEVICE_ID.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>
#include <tessera/core/error.hpp>
#include <tessera/io/json.hpp>

namespace tessera::io {

/// One device of a server: its physical number on the server, its NIC's address and
/// its rank in the job.
struct rank_table_device {
  int device_id = 0;
  std::string device_ip;
  int rank_id = 0;
  friend bool operator==(const rank_table_device&, const rank_table_device&) = default;
};

/// One server (node) of the job: its address and its devices, in the table's order.
struct rank_table_server {
  std::string server_id;
  std::vector<rank_table_device> devices;
  std::string host_nic_ip;  ///< "reserve" in the seed's tables; empty when absent
  friend bool operator==(const rank_table_server&, const rank_table_server&) = default;
};

/// A validated rank table. `file_name` names it in the messages of later checks
/// (rank_table_placement).
struct rank_table {
  std::string file_name;
  std::string version;
  std::vector<rank_table_server> servers;
  std::string status;  ///< "completed" in the seed's tables; empty when absent

  /// The number of devices of every server together: the job's world size.
  int device_count() const {
    std::size_t n = 0;
    for (const rank_table_server& s : servers) n += s.devices.size();
    return int(n);
  }
};

/// Where one process of the job runs, as the table places it.
struct rank_placement {
  int rank = 0;               ///< RANK_ID: the global rank, in [0, world_size)
  int world_size = 1;         ///< every device of the table
  int node_rank = 0;          ///< the index of the rank's server in server_list
  int node_count = 1;         ///< the number of servers
  int local_rank = 0;         ///< the rank's position among its server's devices, by rank id
  int local_world_size = 1;   ///< the number of devices of the rank's server
  int device_id = 0;          ///< the device's physical number on its server
  std::string device_ip;      ///< the device's NIC address
  std::string server_id;      ///< the rank's server
  std::string master_addr;    ///< the server_id of the server holding rank 0
  friend bool operator==(const rank_placement&, const rank_placement&) = default;
};

/// The rank table versions parse_rank_table reads.
inline constexpr std::string_view rank_table_version = "1.0";

namespace detail {

// Devices and ranks a table may hold (a bound that keeps every count an int).
inline constexpr std::int64_t rank_table_max_count = std::int64_t(1) << 24;

class rank_table_reader {
 public:
  explicit rank_table_reader(std::string_view file_name)
      : ctx_("rank table \"" + std::string(file_name) + "\"") {}

  rank_table read(const json::value& v, std::string_view file_name) const {
    rank_table t;
    t.file_name = std::string(file_name);
    if (!v.is_object()) fail("the file must be a JSON object, found " + std::string(json::kind_name(v)));
    t.version = string_member(v, "version", "", false);
    if (t.version != rank_table_version)
      fail("version \"" + t.version + "\" is not supported: this reader reads version \"" +
           std::string(rank_table_version) + "\"");
    const json::value& count = need(v, "server_count", "");
    const std::int64_t server_count = count_of(count, "server_count");
    const json::value& list = need(v, "server_list", "");
    if (!list.is_array()) fail("server_list must be an array of servers, found " + std::string(json::kind_name(list)));
    if (list.empty()) fail("server_list is empty: the table has no servers");
    if (server_count != std::int64_t(list.size()))
      fail("server_count " + json::dump(count) + " does not match server_list, which has " +
           std::to_string(list.size()) + (list.size() == 1 ? " server" : " servers"));
    if (const auto it = v.find("status"); it != v.end()) t.status = string_of(*it, "status");

    for (std::size_t s = 0; s < list.size(); ++s) t.servers.push_back(read_server(list[s], s));
    check_ranks(list, t);
    return t;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw error(ctx_ + ": " + what); }

  static std::string path(const std::string& where, std::string_view key) {
    return where.empty() ? std::string(key) : where + "." + std::string(key);
  }
  const json::value& need(const json::value& obj, std::string_view key, const std::string& where) const {
    const auto it = obj.find(key);
    if (it == obj.end()) fail((where.empty() ? std::string("the file") : where) + " lacks \"" + std::string(key) + "\"");
    return *it;
  }
  std::string string_of(const json::value& x, const std::string& where) const {
    if (!x.is_string()) fail(where + " must be a string, found " + std::string(json::kind_name(x)) + " " + json::dump(x));
    return x.get<std::string>();
  }
  std::string string_member(const json::value& obj, std::string_view key, const std::string& where,
                            bool non_empty) const {
    const std::string at = path(where, key);
    std::string s = string_of(need(obj, key, where), at);
    if (non_empty && s.empty()) fail(at + " is empty");
    return s;
  }
  // A count or id: a JSON integer or a string of decimal digits ("8"), at most
  // rank_table_max_count.
  std::int64_t count_of(const json::value& x, const std::string& where) const {
    std::optional<std::int64_t> n;
    if (x.is_string()) {
      const std::string& s = x.get_ref<const std::string&>();
      if (!s.empty() && s.size() <= 18 && s.find_first_not_of("0123456789") == std::string::npos)
        n = std::int64_t(std::strtoll(s.c_str(), nullptr, 10));
    } else {
      n = json::to_int64(x);
    }
    if (!n || *n < 0)
      fail(where + " must be a non-negative integer or a string of digits, found " + std::string(json::kind_name(x)) +
           " " + json::dump(x));
    if (*n > rank_table_max_count)
      fail(where + " " + json::dump(x) + " is too large: at most " + std::to_string(rank_table_max_count));
    return *n;
  }

  rank_table_server read_server(const json::value& v, std::size_t s) const {
    const std::string where = "server_list[" + std::to_string(s) + "]";
    if (!v.is_object()) fail(where + " must be an object, found " + std::string(json::kind_name(v)));
    rank_table_server server;
    server.server_id = string_member(v, "server_id", where, true);
    if (const auto it = v.find("host_nic_ip"); it != v.end()) server.host_nic_ip = string_of(*it, path(where, "host_nic_ip"));
    const json::value& devices = need(v, "device", where);
    if (!devices.is_array())
      fail(where + ".device must be an array of devices, found " + std::string(json::kind_name(devices)));
    if (devices.empty()) fail(where + ".device is empty: the server has no devices");
    for (std::size_t d = 0; d < devices.size(); ++d) {
      const std::string at = where + ".device[" + std::to_string(d) + "]";
      const json::value& dev = devices[d];
      if (!dev.is_object()) fail(at + " must be an object, found " + std::string(json::kind_name(dev)));
      rank_table_device device;
      device.device_id = int(count_of(need(dev, "device_id", at), at + ".device_id"));
      device.device_ip = string_member(dev, "device_ip", at, true);
      device.rank_id = int(count_of(need(dev, "rank_id", at), at + ".rank_id"));
      for (std::size_t e = 0; e < d; ++e)
        if (server.devices[e].device_id == device.device_id)
          fail(at + ".device_id " + json::dump(dev["device_id"]) + " is used twice in " + where + ": device[" +
               std::to_string(e) + "] has it too");
      server.devices.push_back(std::move(device));
    }
    return server;
  }

  // Every rank id lies in [0, n) and appears once, n the number of devices: the ids are
  // exactly 0..n-1.
  void check_ranks(const json::value& list, const rank_table& t) const {
    const int n = t.device_count();
    std::vector<std::pair<int, int>> owner(std::size_t(n), {-1, -1});  // rank -> (server, device)
    for (std::size_t s = 0; s < t.servers.size(); ++s)
      for (std::size_t d = 0; d < t.servers[s].devices.size(); ++d) {
        const int r = t.servers[s].devices[d].rank_id;
        const std::string at = "server_list[" + std::to_string(s) + "].device[" + std::to_string(d) + "].rank_id";
        const std::string text = json::dump(list[s]["device"][d]["rank_id"]);
        if (r >= n)
          fail(at + " " + text + " is out of range: the table has " + std::to_string(n) +
               (n == 1 ? " device" : " devices") + ", rank ids 0 to " + std::to_string(n - 1));
        auto& [os, od] = owner[std::size_t(r)];
        if (os >= 0)
          fail(at + " " + text + " is used twice: server_list[" + std::to_string(os) + "].device[" +
               std::to_string(od) + "] has rank " + std::to_string(r) + " too");
        owner[std::size_t(r)] = {int(s), int(d)};
      }
  }

  std::string ctx_;
};

// A RANK_ID or DEVICE_ID value: decimal digits.
inline int id_from_text(std::string_view text, std::string_view name, const std::string& ctx) {
  if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string_view::npos)
    throw error(ctx + ": " + std::string(name) + " \"" + std::string(text) + "\" is not a non-negative integer");
  return int(std::strtol(std::string(text).c_str(), nullptr, 10));
}

}  // namespace detail

/// Reads a rank table from its JSON text, every field validated; `file_name` names
/// it in the messages. The seed's form (numbers as strings of digits; JSON integers
/// are accepted as well):
///
///     {"version": "1.0", "server_count": "1",
///      "server_list": [{"server_id": "10.0.0.1",
///                       "device": [{"device_id": "0", "device_ip": "192.1.27.6", "rank_id": "0"},
///                                  {"device_id": "1", "device_ip": "192.2.27.6", "rank_id": "1"}],
///                       "host_nic_ip": "reserve"}],
///      "status": "completed"}
///
/// Required: version ("1.0"), server_count (equal to server_list's length), a non-empty
/// server_list, each server's non-empty server_id and non-empty device list, each
/// device's device_id (unique within its server), non-empty device_ip and rank_id. The
/// rank ids are exactly 0..n-1 over the n devices of the table. status and
/// host_nic_ip are optional strings; other keys are ignored. Every error is a
/// tessera::error naming the file, the field and the values:
///
///     rank table "x.json": server_list[0].device[3].rank_id "9" is out of range: the
///     table has 8 devices, rank ids 0 to 7
///
/// Text that is not JSON (a truncated file) is an error that gives the byte.
inline rank_table parse_rank_table(std::string_view text, std::string_view file_name) {
  const detail::rank_table_reader reader(file_name);
  const std::string ctx = "rank table \"" + std::string(file_name) + "\"";
  return reader.read(json::parse(text, ctx), file_name);
}

/// Reads and validates the rank table file at `file` (parse_rank_table).
inline rank_table read_rank_table(const std::filesystem::path& file) {
  const std::string ctx = "rank table \"" + file.string() + "\"";
  std::ifstream in(file, std::ios::binary);
  if (!in) throw error(ctx + ": cannot open the file");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw error(ctx + ": reading the file failed");
  return parse_rank_table(text.str(), file.string());
}

/// Where rank `rank_id` runs: its server (node) and position there, the world size and
/// the master address (the server holding rank 0). With `device_id`, the table's entry
/// for the rank must name that device. Errors name the table:
///
///     rank table "x.json": RANK_ID 8 is out of range: the table has 8 devices, rank ids 0 to 7
///     rank table "x.json": DEVICE_ID 3 does not match the table: rank 2 is on
///     server_list[0].device[2], whose device_id is 2
inline rank_placement rank_table_placement(const rank_table& table, int rank_id,
                                           std::optional<int> device_id = std::nullopt) {
  const std::string ctx = "rank table \"" + table.file_name + "\"";
  const int n = table.device_count();
  if (rank_id < 0 || rank_id >= n)
    throw error(ctx + ": RANK_ID " + std::to_string(rank_id) + " is out of range: the table has " + std::to_string(n) +
                (n == 1 ? " device" : " devices") + ", rank ids 0 to " + std::to_string(n - 1));
  rank_placement p;
  p.rank = rank_id;
  p.world_size = n;
  p.node_count = int(table.servers.size());
  bool found = false;
  for (std::size_t s = 0; s < table.servers.size(); ++s) {
    const rank_table_server& server = table.servers[s];
    for (const rank_table_device& d : server.devices)
      if (d.rank_id == 0) p.master_addr = server.server_id;
    for (std::size_t i = 0; i < server.devices.size() && !found; ++i) {
      const rank_table_device& d = server.devices[i];
      if (d.rank_id != rank_id) continue;
      found = true;
      if (device_id && *device_id != d.device_id)
        throw error(ctx + ": DEVICE_ID " + std::to_string(*device_id) + " does not match the table: rank " +
                    std::to_string(rank_id) + " is on server_list[" + std::to_string(s) + "].device[" +
                    std::to_string(i) + "], whose device_id is " + std::to_string(d.device_id));
      p.node_rank = int(s);
      p.local_world_size = int(server.devices.size());
      p.local_rank = 0;
      for (const rank_table_device& other : server.devices) p.local_rank += other.rank_id < rank_id ? 1 : 0;
      p.device_id = d.device_id;
      p.device_ip = d.device_ip;
      p.server_id = server.server_id;
    }
  }
  // A table from parse_rank_table holds every rank in [0, n); one built by hand may not.
  if (!found) throw error(ctx + ": RANK_ID " + std::to_string(rank_id) + " is not in the table");
  return p;
}

/// rank_table_placement with RANK_ID and DEVICE_ID as the environment gives them
/// (decimal text; an empty or absent DEVICE_ID is not checked).
inline rank_placement rank_table_placement(const rank_table& table, std::string_view rank_id,
                                           std::optional<std::string_view> device_id) {
  const std::string ctx = "rank table \"" + table.file_name + "\"";
  const int rank = detail::id_from_text(rank_id, "RANK_ID", ctx);
  std::optional<int> device;
  if (device_id && !device_id->empty()) device = detail::id_from_text(*device_id, "DEVICE_ID", ctx);
  return rank_table_placement(table, rank, device);
}

/// The placement of this process: the table at RANK_TABLE_FILE, with RANK_ID (required)
/// and DEVICE_ID (checked when set), as seed 003's scripts export them.
inline rank_placement rank_table_placement_from_environment() {
  const char* file = std::getenv("RANK_TABLE_FILE");
  if (file == nullptr || *file == '\0') throw error("rank table: RANK_TABLE_FILE is not set");
  const rank_table table = read_rank_table(file);
  const char* rank = std::getenv("RANK_ID");
  if (rank == nullptr) throw error("rank table \"" + table.file_name + "\": RANK_ID is not set");
  const char* device = std::getenv("DEVICE_ID");
  return rank_table_placement(table, rank,
                              device ? std::optional<std::string_view>(device) : std::nullopt);
}

}  // namespace tessera::io
