// Tests of io/rank_table.hpp: seed 003's tables (2 ranks on one server, 8 on one, 8 on
// two servers) read with every field, numbers as strings or as JSON integers; every
// rank's placement (node, node-local rank, master address) over each table; each kind
// of malformed table, and each bad RANK_ID or DEVICE_ID, is an error naming the file,
// the field and the numbers; truncated text and random corruptions throw
// tessera::error, never crash.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <tessera/io/rank_table.hpp>
#include "error_text.hpp"

namespace io_test_rank_table {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::io;
namespace fs = std::filesystem;

namespace {

using testing::error_of;

// A device entry as the seed writes it: every number a string.
std::string device(int device_id, const std::string& ip, int rank_id) {
  return "{\"device_id\": \"" + std::to_string(device_id) + "\", \"device_ip\": \"" + ip + "\", \"rank_id\": \"" +
         std::to_string(rank_id) + "\"}";
}

// A server holding `count` devices, device ids 0.., ranks first_rank...
std::string server(const std::string& id, int count, int first_rank) {
  std::string out = "{\"server_id\": \"" + id + "\", \"device\": [";
  for (int i = 0; i < count; ++i) {
    if (i > 0) out += ", ";
    out += device(i, "192." + std::to_string(i % 4 + 1) + ".27." + std::to_string(6 + i / 4), first_rank + i);
  }
  return out + "], \"host_nic_ip\": \"reserve\"}";
}

std::string table(const std::vector<std::string>& servers) {
  std::string out = "{\"version\": \"1.0\", \"server_count\": \"" + std::to_string(servers.size()) +
                    "\", \"server_list\": [";
  for (std::size_t i = 0; i < servers.size(); ++i) out += (i > 0 ? ", " : "") + servers[i];
  return out + "], \"status\": \"completed\"}";
}

// seed 003's rank_table_8pcs.json, with an address in place of "10.*.*.*".
const std::string table_8pcs = R"({
  "version": "1.0",
  "server_count": "1",
  "server_list": [
    {
      "server_id": "10.0.0.1",
      "device": [
        {"device_id": "0","device_ip": "192.1.27.6","rank_id": "0"},
        {"device_id": "1","device_ip": "192.2.27.6","rank_id": "1"},
        {"device_id": "2","device_ip": "192.3.27.6","rank_id": "2"},
        {"device_id": "3","device_ip": "192.4.27.6","rank_id": "3"},
        {"device_id": "4","device_ip": "192.1.27.7","rank_id": "4"},
        {"device_id": "5","device_ip": "192.2.27.7","rank_id": "5"},
        {"device_id": "6","device_ip": "192.3.27.7","rank_id": "6"},
        {"device_id": "7","device_ip": "192.4.27.7","rank_id": "7"}],
      "host_nic_ip": "reserve"
    }
  ],
  "status": "completed"
})";

}  // namespace

TEST_CASE("rank_table: seed 003's 8-device table, every field") {
  const rank_table t = parse_rank_table(table_8pcs, "rank_table_8pcs.json");
  CHECK(t.file_name == "rank_table_8pcs.json");
  CHECK(t.version == "1.0");
  CHECK(t.status == "completed");
  REQUIRE(t.servers.size() == 1);
  CHECK(t.servers[0].server_id == "10.0.0.1");
  CHECK(t.servers[0].host_nic_ip == "reserve");
  REQUIRE(t.servers[0].devices.size() == 8);
  CHECK(t.device_count() == 8);
  CHECK(t.servers[0].devices[5] == rank_table_device{5, "192.2.27.7", 5});
  for (int r = 0; r < 8; ++r) {
    const rank_placement p = rank_table_placement(t, r);
    CHECK(p.rank == r);
    CHECK(p.world_size == 8);
    CHECK(p.node_rank == 0);
    CHECK(p.node_count == 1);
    CHECK(p.local_rank == r);
    CHECK(p.local_world_size == 8);
    CHECK(p.device_id == r);
    CHECK(p.server_id == "10.0.0.1");
    CHECK(p.master_addr == "10.0.0.1");
    CHECK(p == rank_table_placement(t, r, r));
  }
}

TEST_CASE("rank_table: 2 ranks on one server, numbers as JSON integers") {
  const std::string text = R"({"version": "1.0", "server_count": 1, "server_list": [{"server_id": "127.0.0.1",
    "device": [{"device_id": 0, "device_ip": "192.1.27.6", "rank_id": 0},
               {"device_id": 1, "device_ip": "192.2.27.6", "rank_id": 1}]}]})";
  const rank_table t = parse_rank_table(text, "rank_table_2pcs.json");
  CHECK(t.status.empty());
  CHECK(t.servers[0].host_nic_ip.empty());
  CHECK(t.device_count() == 2);
  const rank_placement p = rank_table_placement(t, 1, 1);
  CHECK(p.world_size == 2);
  CHECK(p.local_rank == 1);
  CHECK(p.local_world_size == 2);
  CHECK(p.device_ip == "192.2.27.6");
  CHECK(p.master_addr == "127.0.0.1");
  // The same table with the seed's strings reads alike.
  CHECK(parse_rank_table(table({server("127.0.0.1", 2, 0)}), "x").servers[0].devices.size() == 2);
}

TEST_CASE("rank_table: 8 ranks on two servers; node, node-local rank and master address") {
  const rank_table t = parse_rank_table(table({server("10.0.0.1", 4, 0), server("10.0.0.2", 4, 4)}), "two.json");
  CHECK(t.device_count() == 8);
  for (int r = 0; r < 8; ++r) {
    const rank_placement p = rank_table_placement(t, r);
    CHECK(p.world_size == 8);
    CHECK(p.node_count == 2);
    CHECK(p.node_rank == r / 4);
    CHECK(p.local_rank == r % 4);
    CHECK(p.local_world_size == 4);
    CHECK(p.device_id == r % 4);
    CHECK(p.server_id == (r < 4 ? "10.0.0.1" : "10.0.0.2"));
    CHECK(p.master_addr == "10.0.0.1");
  }
  // RANK_ID and DEVICE_ID as the environment gives them.
  CHECK(rank_table_placement(t, "6", std::optional<std::string_view>("2")).local_rank == 2);
  CHECK(rank_table_placement(t, "6", std::nullopt).node_rank == 1);
  CHECK(rank_table_placement(t, "6", std::optional<std::string_view>("")).device_id == 2);
}

TEST_CASE("rank_table: rank 0 on the second server is the master; local ranks follow the rank ids") {
  // Server 0 holds ranks 3, 1, 2 (listed out of order); server 1 holds rank 0.
  const std::string text = R"({"version": "1.0", "server_count": "2", "server_list": [
    {"server_id": "a", "device": [{"device_id": "0", "device_ip": "x", "rank_id": "3"},
                                  {"device_id": "1", "device_ip": "x", "rank_id": "1"},
                                  {"device_id": "2", "device_ip": "x", "rank_id": "2"}]},
    {"server_id": "b", "device": [{"device_id": "5", "device_ip": "y", "rank_id": "0"}]}]})";
  const rank_table t = parse_rank_table(text, "mixed.json");
  CHECK(rank_table_placement(t, 3).local_rank == 2);
  CHECK(rank_table_placement(t, 1).local_rank == 0);
  CHECK(rank_table_placement(t, 2).device_id == 2);
  const rank_placement p0 = rank_table_placement(t, 0, 5);
  CHECK(p0.node_rank == 1);
  CHECK(p0.local_world_size == 1);
  CHECK(p0.master_addr == "b");
  CHECK(rank_table_placement(t, 3).master_addr == "b");
}

TEST_CASE("rank_table: read_rank_table reads a file; a missing file is an error") {
  const fs::path dir = fs::temp_directory_path() / ("tessera_test_rank_table_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path file = dir / "rank_table_8pcs.json";
  std::ofstream(file, std::ios::binary) << table_8pcs;
  const rank_table t = read_rank_table(file);
  CHECK(t.file_name == file.string());
  CHECK(t.device_count() == 8);
  const std::string missing = error_of([&] { read_rank_table(dir / "none.json"); });
  CHECK(missing.find("none.json") != std::string::npos);
  CHECK(missing.find("cannot open") != std::string::npos);
  // Truncated on disk: an error naming the file, never a crash.
  std::ofstream(file, std::ios::binary | std::ios::trunc) << table_8pcs.substr(0, 100);
  const std::string truncated = error_of([&] { read_rank_table(file); });
  CHECK(truncated.find("rank table \"" + file.string() + "\"") == 0);
  CHECK(truncated.find("invalid JSON") != std::string::npos);
  fs::remove_all(dir);
}

namespace {

// The error of parsing `text` as "bad.json"; every message starts with the file.
std::string parse_error(const std::string& text) {
  const std::string e = error_of([&] { parse_rank_table(text, "bad.json"); });
  CHECK_MESSAGE(e.rfind("rank table \"bad.json\": ", 0) == 0, e);
  return e;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const std::size_t at = text.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, from);
  return text.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("rank_table: malformed tables, each error naming the field, the file and the numbers") {
  const std::string good = table({server("10.0.0.1", 4, 0), server("10.0.0.2", 4, 4)});
  REQUIRE_NOTHROW(parse_rank_table(good, "bad.json"));

  SUBCASE("not an object") {
    const std::string e = parse_error("[1, 2]");
    CHECK(has(e, "must be a JSON object, found an array"));
  }
  SUBCASE("missing keys") {
    CHECK(has(parse_error(replaced(good, "\"version\": \"1.0\", ", "")), "the file lacks \"version\""));
    CHECK(has(parse_error(replaced(good, "\"server_count\": \"2\", ", "")), "the file lacks \"server_count\""));
    CHECK(has(parse_error(R"({"version": "1.0", "server_count": "1"})"), "the file lacks \"server_list\""));
    CHECK(has(parse_error(replaced(good, "\"server_id\": \"10.0.0.2\", ", "")), "server_list[1] lacks \"server_id\""));
    CHECK(has(parse_error(R"({"version": "1.0", "server_count": "1", "server_list": [{"server_id": "a"}]})"),
              "server_list[0] lacks \"device\""));
    CHECK(has(parse_error(replaced(good, "\"device_id\": \"2\", ", "")), "server_list[0].device[2] lacks \"device_id\""));
    CHECK(has(parse_error(replaced(good, "\"device_ip\": \"192.2.27.6\", ", "")),
              "server_list[0].device[1] lacks \"device_ip\""));
    CHECK(has(parse_error(replaced(good, ", \"rank_id\": \"7\"", "")), "server_list[1].device[3] lacks \"rank_id\""));
  }
  SUBCASE("wrong types") {
    CHECK(has(parse_error(replaced(good, "\"version\": \"1.0\"", "\"version\": 1.0")),
              "version must be a string, found a number 1.0"));
    CHECK(has(parse_error(replaced(good, "\"version\": \"1.0\"", "\"version\": \"1.2\"")),
              "version \"1.2\" is not supported"));
    CHECK(has(parse_error(replaced(good, "\"server_count\": \"2\"", "\"server_count\": \"two\"")),
              "server_count must be a non-negative integer or a string of digits, found a string \"two\""));
    CHECK(has(parse_error(replaced(good, "\"server_count\": \"2\"", "\"server_count\": -2")),
              "server_count must be a non-negative integer"));
    CHECK(has(parse_error(R"({"version": "1.0", "server_count": "1", "server_list": {}})"),
              "server_list must be an array of servers, found an object"));
    CHECK(has(parse_error(R"({"version": "1.0", "server_count": "1", "server_list": [7]})"),
              "server_list[0] must be an object, found an integer"));
    CHECK(has(parse_error(replaced(good, "\"server_id\": \"10.0.0.1\"", "\"server_id\": 10")),
              "server_list[0].server_id must be a string, found an integer 10"));
    CHECK(has(parse_error(replaced(good, "\"server_id\": \"10.0.0.1\"", "\"server_id\": \"\"")),
              "server_list[0].server_id is empty"));
    CHECK(has(parse_error(R"({"version": "1.0", "server_count": "1", "server_list": [{"server_id": "a", "device": "0"}]})"),
              "server_list[0].device must be an array of devices, found a string"));
    CHECK(has(parse_error(R"({"version": "1.0", "server_count": "1", "server_list": [{"server_id": "a", "device": [[]]}]})"),
              "server_list[0].device[0] must be an object, found an array"));
    CHECK(has(parse_error(replaced(good, "\"device_id\": \"3\"", "\"device_id\": \"3a\"")),
              "server_list[0].device[3].device_id must be a non-negative integer or a string of digits, found a string \"3a\""));
    CHECK(has(parse_error(replaced(good, "\"device_id\": \"3\"", "\"device_id\": 3.5")),
              "server_list[0].device[3].device_id must be a non-negative integer or a string of digits, found a number 3.5"));
    CHECK(has(parse_error(replaced(good, "\"rank_id\": \"5\"", "\"rank_id\": \"\"")),
              "server_list[1].device[1].rank_id must be a non-negative integer or a string of digits"));
    CHECK(has(parse_error(replaced(good, "\"rank_id\": \"5\"", "\"rank_id\": \"99999999999\"")),
              "server_list[1].device[1].rank_id \"99999999999\" is too large"));
    CHECK(has(parse_error(replaced(good, "\"device_ip\": \"192.2.27.6\"", "\"device_ip\": null")),
              "server_list[0].device[1].device_ip must be a string, found null"));
    CHECK(has(parse_error(replaced(good, "\"status\": \"completed\"", "\"status\": true")),
              "status must be a string, found a boolean"));
    CHECK(has(parse_error(replaced(good, "\"host_nic_ip\": \"reserve\"", "\"host_nic_ip\": 0")),
              "server_list[0].host_nic_ip must be a string"));
  }
  SUBCASE("server_count against server_list") {
    const std::string e = parse_error(replaced(good, "\"server_count\": \"2\"", "\"server_count\": \"3\""));
    CHECK(has(e, "server_count \"3\" does not match server_list, which has 2 servers"));
    CHECK(has(parse_error(replaced(table({server("a", 2, 0)}), "\"server_count\": \"1\"", "\"server_count\": \"2\"")),
              "server_count \"2\" does not match server_list, which has 1 server"));
    CHECK(has(parse_error(R"({"version": "1.0", "server_count": "0", "server_list": []})"),
              "server_list is empty"));
    CHECK(has(parse_error(R"({"version": "1.0", "server_count": "1", "server_list": [{"server_id": "a", "device": []}]})"),
              "server_list[0].device is empty"));
  }
  SUBCASE("rank ids: out of range, used twice") {
    // The message of the brief's example: rank 9 in a table of 8 devices.
    const std::string e = parse_error(replaced(table_8pcs, "\"rank_id\": \"3\"", "\"rank_id\": \"9\""));
    CHECK(has(e, "server_list[0].device[3].rank_id \"9\" is out of range: the table has 8 devices, rank ids 0 to 7"));
    const std::string twice = parse_error(replaced(good, "\"rank_id\": \"6\"", "\"rank_id\": \"2\""));
    CHECK(has(twice, "server_list[1].device[2].rank_id \"2\" is used twice"));
    CHECK(has(twice, "server_list[0].device[2] has rank 2 too"));
    // Integers are shown as integers.
    CHECK(has(parse_error(R"({"version": "1.0", "server_count": 1, "server_list": [{"server_id": "a",
      "device": [{"device_id": 0, "device_ip": "x", "rank_id": 1}]}]})"),
              "server_list[0].device[0].rank_id 1 is out of range: the table has 1 device, rank ids 0 to 0"));
  }
  SUBCASE("device ids used twice within a server; across servers they may repeat") {
    const std::string e = parse_error(replaced(good, "\"device_id\": \"3\"", "\"device_id\": \"1\""));
    CHECK(has(e, "server_list[0].device[3].device_id \"1\" is used twice in server_list[0]: device[1] has it too"));
    CHECK(parse_rank_table(good, "bad.json").servers[1].devices[0].device_id == 0);
  }
  SUBCASE("RANK_ID and DEVICE_ID") {
    const rank_table t = parse_rank_table(good, "bad.json");
    CHECK(error_of([&] { rank_table_placement(t, 8); }) ==
          "rank table \"bad.json\": RANK_ID 8 is out of range: the table has 8 devices, rank ids 0 to 7");
    CHECK(has(error_of([&] { rank_table_placement(t, -1); }), "RANK_ID -1 is out of range"));
    const std::string wrong_device = error_of([&] { rank_table_placement(t, 6, 3); });
    CHECK(has(wrong_device, "rank table \"bad.json\": DEVICE_ID 3 does not match the table"));
    CHECK(has(wrong_device, "rank 6 is on server_list[1].device[2], whose device_id is 2"));
    CHECK(has(error_of([&] { rank_table_placement(t, "x1", std::nullopt); }), "RANK_ID \"x1\" is not a non-negative integer"));
    CHECK(has(error_of([&] { rank_table_placement(t, "", std::nullopt); }), "RANK_ID \"\" is not a non-negative integer"));
    CHECK(has(error_of([&] { rank_table_placement(t, "12", std::nullopt); }), "RANK_ID 12 is out of range"));
    CHECK(has(error_of([&] { rank_table_placement(t, "1", std::optional<std::string_view>("-1")); }),
              "DEVICE_ID \"-1\" is not a non-negative integer"));
    // A table built by hand need not hold every rank.
    rank_table hand = t;
    hand.servers[1].devices[0].rank_id = 0;
    CHECK(has(error_of([&] { rank_table_placement(hand, 4); }), "RANK_ID 4 is not in the table"));
  }
}

TEST_CASE("rank_table: every truncation and random corruptions throw tessera::error or parse") {
  for (std::size_t n = 0; n < table_8pcs.size(); ++n) {
    const std::string e = error_of([&] { parse_rank_table(table_8pcs.substr(0, n), "cut.json"); });
    CHECK_MESSAGE(e.rfind("rank table \"cut.json\": ", 0) == 0, n);
  }
  std::mt19937 rng(7);
  const std::string alphabet = "{}[]\",:0123456789 abc-.";
  int parsed = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text = table_8pcs;
    const int edits = 1 + int(rng() % 3);
    for (int k = 0; k < edits; ++k) text[rng() % text.size()] = alphabet[rng() % alphabet.size()];
    try {
      const rank_table t = parse_rank_table(text, "fuzz.json");
      for (int r = 0; r < t.device_count(); ++r) CHECK(rank_table_placement(t, r).rank == r);
      ++parsed;
    } catch (const error& e) {
      CHECK(std::string(e.what()).rfind("rank table \"fuzz.json\": ", 0) == 0);
    }
  }
  MESSAGE(parsed << " of 2000 corrupted tables still parsed");
}
}  // namespace io_test_rank_table
