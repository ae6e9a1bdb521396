// Tests of io/safetensors.hpp and io/atomic_file.hpp: the exact bytes of a small
// file; every dtype written and read back; every box of a tensor read alone equals
// the same box cut from the whole; each malformed header or data section is an error
// naming the file and the numbers; a write that fails, or a writer killed midway,
// never leaves a partial file under the final name; seeded random truncations and
// corruptions either read correctly or throw tessera::error; and a hand-written
// Python reader and writer (standard library only) agree with tessera.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <tessera/io/safetensors.hpp>
#include "error_text.hpp"

namespace io_test_safetensors {  // the file's own scope in its test group's translation unit

using namespace tessera;
using namespace tessera::io;
namespace fs = std::filesystem;

namespace {

// A fresh directory for this process, removed at exit.
struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("tessera_test_safetensors_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path operator/(const std::string& name) const { return path / name; }
};

const temp_dir& tmp() {
  static temp_dir d;
  return d;
}

using testing::error_of;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string le64(std::uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char(n >> (8 * i));
  return s;
}

// A file from a header text and a data section, the length field as given.
std::string raw_file(const std::string& header, const std::string& data, std::uint64_t length) {
  return le64(length) + header + data;
}
std::string raw_file(const std::string& header, const std::string& data = "") {
  return raw_file(header, data, header.size());
}

// Opening `bytes` as a file (and reading every tensor) gives this error text.
std::string open_error(const std::string& bytes, const std::string& name = "bad.safetensors") {
  const fs::path p = tmp() / name;
  spit(p, bytes);
  return error_of([&] {
    safetensors_reader r(p);
    for (const tensor_info& t : r.tensors()) (void)r.read_host_bytes(t);
  });
}

// Files in `dir` whose names start with '.' and hold ".tmp." (atomic_file's temporaries).
int temp_files(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind('.', 0) == 0 && name.find(".tmp.") != std::string::npos) ++n;
  }
  return n;
}

struct expected_tensors {
  std::vector<float> f32{-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f};
  std::vector<double> f64{1.0, 1.0 / 2, 1.0 / 3, 1.0 / 4};
  std::vector<std::int64_t> i64{-(std::int64_t(1) << 40), 0, std::int64_t(1) << 62};
  std::vector<std::int32_t> i32{-7};
  std::vector<std::uint8_t> u8{0, 1, 254, 255};
  std::vector<float> empty;

  void add_to(safetensors_writer& w) const {
    w.add("f32", {2, 3}, std::span<const float>(f32));
    w.add("f64", {4}, std::span<const double>(f64));
    w.add("i64", {3}, std::span<const std::int64_t>(i64));
    w.add("i32", {}, std::span<const std::int32_t>(i32));
    w.add("u8", {2, 2}, std::span<const std::uint8_t>(u8));
    w.add("empty", {0, 3}, std::span<const float>(empty));
    w.set_metadata("note", "h\xc3\xa9llo");
    w.set_metadata("layout:f32", "[0, -]");
  }
  void check(const safetensors_reader& r) const {
    CHECK(r.read<float>("f32") == f32);
    CHECK(r.read<double>("f64") == f64);
    CHECK(r.read<std::int64_t>("i64") == i64);
    CHECK(r.read<std::int32_t>("i32") == i32);
    CHECK(r.read<std::uint8_t>("u8") == u8);
    CHECK(r.read<float>("empty").empty());
    CHECK(r.at("f32").shape == std::vector<index_t>{2, 3});
    CHECK(r.at("i32").shape.empty());
    CHECK(r.at("empty").shape == std::vector<index_t>{0, 3});
    CHECK(r.metadata().at("note") == "h\xc3\xa9llo");
    CHECK(r.metadata().at("layout:f32") == "[0, -]");
  }
};

}  // namespace

TEST_CASE("safetensors: the bytes of a small file are the format's") {
  const std::vector<float> x{1.0f, -2.0f};
  safetensors_writer w;
  w.add("x", {2}, std::span<const float>(x));
  w.set_metadata("k", "v");
  w.write(tmp() / "small.safetensors");
  const std::string header = R"({"__metadata__":{"k":"v"},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string padded = header;
  padded.append((8 - header.size() % 8) % 8, ' ');
  const std::string data("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8);  // 1.0f, -2.0f little-endian
  CHECK(slurp(tmp() / "small.safetensors") == le64(padded.size()) + padded + data);
  CHECK(padded.size() % 8 == 0);
  CHECK(temp_files(tmp().path) == 0);
}

TEST_CASE("safetensors: every dtype is written and read back") {
  const expected_tensors e;
  safetensors_writer w;
  e.add_to(w);
  // the types with no C++ element type go through as bytes
  const std::vector<std::uint16_t> half{0x3c00, 0xc000, 0x7bff};
  const std::vector<std::uint8_t> flags{1, 0, 1};
  w.add_host_bytes("bf16", dtype::bf16, {3}, std::as_bytes(std::span<const std::uint16_t>(half)));
  w.add_host_bytes("f16", dtype::f16, {3, 1}, std::as_bytes(std::span<const std::uint16_t>(half)));
  w.add_host_bytes("flags", dtype::boolean, {3}, std::as_bytes(std::span<const std::uint8_t>(flags)));
  // and every integer width
  const std::vector<std::int8_t> i8{-128, 127};
  const std::vector<std::uint16_t> u16{0, 65535};
  const std::vector<std::int16_t> i16{-32768, 32767};
  const std::vector<std::uint32_t> u32{0, 4294967295u};
  const std::vector<std::uint64_t> u64{0, ~std::uint64_t(0)};
  w.add("i8", {2}, std::span<const std::int8_t>(i8));
  w.add("u16", {2}, std::span<const std::uint16_t>(u16));
  w.add("i16", {2}, std::span<const std::int16_t>(i16));
  w.add("u32", {2}, std::span<const std::uint32_t>(u32));
  w.add("u64", {1, 2}, std::span<const std::uint64_t>(u64));
  const fs::path p = tmp() / "all.safetensors";
  w.write(p);

  safetensors_reader r(p);
  e.check(r);
  CHECK(r.data_start() % 8 == 0);
  CHECK(r.tensors().size() == 14);
  CHECK(r.read<std::int8_t>("i8") == i8);
  CHECK(r.read<std::uint16_t>("u16") == u16);
  CHECK(r.read<std::int16_t>("i16") == i16);
  CHECK(r.read<std::uint32_t>("u32") == u32);
  CHECK(r.read<std::uint64_t>("u64") == u64);
  for (const char* name : {"bf16", "f16"}) {
    const std::vector<std::byte> b = r.read_host_bytes(r.at(name));
    REQUIRE(b.size() == 6);
    CHECK(std::memcmp(b.data(), half.data(), 6) == 0);
  }
  CHECK(r.at("bf16").type == dtype::bf16);
  CHECK(r.at("flags").type == dtype::boolean);
  CHECK(r.read_host_bytes(r.at("flags")) == std::vector<std::byte>{std::byte{1}, std::byte{0}, std::byte{1}});
  CHECK(error_of([&] { visit_dtype(dtype::bf16, [](auto) {}, "load"); }) ==
        "load: dtype BF16 has no C++ element type in tessera");
  for (dtype t : all_dtypes) {
    dtype back{};
    CHECK(parse_dtype(dtype_name(t), back));
    CHECK(back == t);
  }
  CHECK(dtype_names() == "BOOL, U8, I8, U16, I16, U32, I32, U64, I64, F16, BF16, F32, F64");
  CHECK(error_of([&] { (void)r.read<std::int32_t>("f32"); }) ==
        "safetensors: " + p.string() + ": tensor 'f32' is F32, read as I32");
  CHECK(error_of([&] { (void)r.at("nope"); }) ==
        "safetensors: " + p.string() + ": no tensor named 'nope' (the file has 14 tensors)");
}

TEST_CASE("safetensors: every box of a tensor read alone equals the box cut from the whole") {
  const extents shape{3, 4, 5};
  std::vector<std::int32_t> v(std::size_t(shape.size()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::int32_t(i * 7 + 1);
  safetensors_writer w;
  w.add("t", {3, 4, 5}, std::span<const std::int32_t>(v));
  w.add("s", {}, std::span<const std::int32_t>(v.data(), 1));
  const fs::path p = tmp() / "boxes.safetensors";
  w.write(p);
  safetensors_reader r(p);
  int boxes = 0;
  for (index_t o0 = 0; o0 <= 3; ++o0)
    for (index_t n0 = 0; o0 + n0 <= 3; ++n0)
      for (index_t o1 = 0; o1 <= 4; ++o1)
        for (index_t n1 = 0; o1 + n1 <= 4; ++n1)
          for (index_t o2 = 0; o2 <= 5; ++o2)
            for (index_t n2 = 0; o2 + n2 <= 5; ++n2) {
              const box b{extents{o0, o1, o2}, extents{n0, n1, n2}};
              std::vector<std::int32_t> got(std::size_t(n0 * n1 * n2), -1), want;
              r.read_box("t", b, std::span<std::int32_t>(got));
              for (index_t i = 0; i < n0; ++i)
                for (index_t j = 0; j < n1; ++j)
                  for (index_t k = 0; k < n2; ++k) want.push_back(v[std::size_t(((o0 + i) * 4 + o1 + j) * 5 + o2 + k)]);
              if (got != want) FAIL_CHECK("box offset (" << o0 << ", " << o1 << ", " << o2 << ") shape (" << n0 << ", " << n1 << ", " << n2 << ")");
              ++boxes;
            }
  CHECK(boxes == 10 * 15 * 21);
  std::int32_t s = 0;
  r.read_box("s", box{extents{}, extents{}}, std::span<std::int32_t>(&s, 1));
  CHECK(s == v[0]);
  std::vector<std::int32_t> two(2);
  CHECK(error_of([&] { r.read_box("t", box{extents{2, 0, 0}, extents{2, 1, 1}}, std::span<std::int32_t>(two)); }) ==
        "safetensors: " + p.string() + ": tensor 't': box dim 0 [2, 4) lies outside the extent 3");
  CHECK(error_of([&] { r.read_box("t", box{extents{0, 0}, extents{1, 2}}, std::span<std::int32_t>(two)); }) ==
        "safetensors: " + p.string() + ": tensor 't': a box of rank 2 for a tensor of rank 3");
  CHECK(error_of([&] { r.read_box("t", box{extents{0, 0, 0}, extents{1, 1, 3}}, std::span<std::int32_t>(two)); }) ==
        "safetensors: " + p.string() + ": tensor 't': the box has 3 elements, the buffer holds 2");
}

TEST_CASE("safetensors: boxes of a 4 MiB tensor: coalesced windows and direct large runs") {
  const std::vector<index_t> shape{4, 256, 1024};
  std::vector<float> v(4 * 256 * 1024);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i % 100003);
  safetensors_writer w;
  w.add("big", shape, std::span<const float>(v));
  const fs::path p = tmp() / "big.safetensors";
  w.write(p);
  safetensors_reader r(p);
  auto check_box = [&](const box& b) {
    std::vector<float> got(std::size_t(b.shape.size()));
    r.read_box("big", b, std::span<float>(got));
    std::size_t k = 0, bad = 0;
    for (index_t i = 0; i < b.shape[0]; ++i)
      for (index_t j = 0; j < b.shape[1]; ++j)
        for (index_t l = 0; l < b.shape[2]; ++l)
          bad += got[k++] != v[std::size_t(((b.offset[0] + i) * 256 + b.offset[1] + j) * 1024 + b.offset[2] + l)];
    CHECK(bad == 0);
  };
  check_box(box{extents{1, 0, 0}, extents{2, 256, 1024}});   // one 2 MiB run, read directly
  check_box(box{extents{0, 0, 8}, extents{4, 256, 16}});     // 1024 runs of 64 bytes, 4 KiB apart
  check_box(box{extents{0, 3, 0}, extents{4, 1, 1024}});     // runs 1 MiB apart: separate reads
  check_box(box{extents{0, 100, 1000}, extents{4, 150, 24}});
}

TEST_CASE("safetensors: malformed files are errors naming the file and the numbers") {
  const std::string p = (tmp() / "bad.safetensors").string();
  const std::string f = "safetensors: " + p + ": ";
  const std::string x4 = std::string(16, '\x01');
  auto entry = [](const std::string& body) { return "{\"x\":" + body + "}"; };
  CHECK(open_error("abc") == f + "the file has 3 bytes, fewer than the 8-byte header length");
  CHECK(open_error(raw_file("{}", "", 1000)) ==
        f + "header length 1000 runs past the end of the file (10 bytes, 2 after the length field)");
  CHECK(open_error(raw_file("{}", "", std::uint64_t(1) << 40)) ==
        f + "header length 1099511627776 exceeds the format's limit of 100000000 bytes");
  CHECK(open_error(raw_file("{\"x\":")) == f + "header: invalid JSON at byte 5 (line 1, column 6): syntax error while "
                                                "parsing value - unexpected end of input; expected '[', '{', or a literal");
  // strict JSON: a tensor named twice, trailing text inside the header length, NUL bytes
  const std::string x_entry = R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  CHECK(open_error(raw_file("{\"x\":" + x_entry + ",\"x\":" + x_entry + "}", "abcd")) ==
        f + "header: invalid JSON at byte 56 (line 1, column 57): duplicate object key \"x\"");
  CHECK(open_error(raw_file(R"({"__metadata__":{"k":"a","k":"b"}})")) ==
        f + "header: invalid JSON at byte 27 (line 1, column 28): duplicate object key \"k\"");
  CHECK(open_error(raw_file("{\"x\":" + x_entry + "} {}", "abcd")) ==
        f + "header: invalid JSON at byte 55 (line 1, column 56): syntax error while parsing value - unexpected '{'; "
            "expected end of input");
  CHECK(open_error(raw_file("{\"x\":" + x_entry + "}" + std::string(6, '\0'), "abcd")) ==
        f + "header: invalid JSON at byte 54 (line 1, column 55): unexpected NUL byte (JSON text holds none)");
  CHECK(open_error(raw_file("[1, 2]")) == f + "the header must be a JSON object, found an array");
  CHECK(open_error(raw_file(entry(R"({"dtype":"F8","shape":[1],"data_offsets":[0,1]})"), "\x01")) ==
        f + "tensor 'x': unknown dtype \"F8\" (known: BOOL, U8, I8, U16, I16, U32, I32, U64, I64, F16, BF16, F32, F64)");
  CHECK(open_error(raw_file(entry(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,16]})"), x4)) ==
        f + "tensor 'x': shape (2, 3) of F32 needs 6 x 4 = 24 bytes, data_offsets [0, 16] hold 16");
  CHECK(open_error(raw_file(entry(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})"), "abcd")) ==
        f + "tensor 'x': shape entry 0 must be a non-negative integer");
  CHECK(open_error(raw_file(entry(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})"), "abcd")) ==
        f + "tensor 'x': shape entry 0 must be a non-negative integer");
  CHECK(open_error(raw_file(entry(R"({"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]})"), "abcd")) ==
        f + "tensor 'x': shape (4611686018427387904, 4) has too many elements");
  CHECK(open_error(raw_file(entry(R"({"dtype":"F32","shape":[1],"data_offsets":[4]})"), "abcd")) ==
        f + "tensor 'x': data_offsets must be an array of two non-negative integers");
  CHECK(open_error(raw_file(entry(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})"), "abcdefgh")) ==
        f + "tensor 'x': data_offsets [8, 4] end before they begin");
  CHECK(open_error(raw_file(entry(R"({"dtype":"F32","shape":[1]})"), "abcd")) == f + "tensor 'x': the entry lacks \"data_offsets\"");
  CHECK(open_error(raw_file(entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1})"), "abcd")) ==
        f + "tensor 'x': unknown key \"extra\" (an entry has dtype, shape and data_offsets)");
  CHECK(open_error(raw_file(R"({"x":[1]})")) == f + "tensor 'x': the entry must be an object, found an array");
  CHECK(open_error(raw_file(R"({"__metadata__":{"a":"b","n":1}})")) ==
        f + "\"__metadata__\" must be an object of strings; \"n\" is an integer");
  CHECK(open_error(raw_file(R"({"__metadata__":[]})")) == f + "\"__metadata__\" must be an object of strings, found an array");
  // the data section: overlaps, holes, truncation, trailing bytes
  const std::string two = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  CHECK(open_error(raw_file(two, std::string(12, 'z'))) == f + "tensors 'a' [0, 8] and 'b' [4, 12] overlap in the data section");
  const std::string hole = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  CHECK(open_error(raw_file(hole, std::string(12, 'z'))) == f + "bytes [4, 8) of the data section belong to no tensor");
  const std::string one = R"({"a":{"dtype":"F64","shape":[3],"data_offsets":[0,24]}})";
  CHECK(open_error(raw_file(one, std::string(20, 'z'))) ==
        f + "tensor 'a': data_offsets [0, 24] run past the end of the data section, which has 20 bytes: the file is "
            "truncated or the offsets are wrong");
  CHECK(open_error(raw_file(one, std::string(30, 'z'))) == f + "the data section has 30 bytes, the tensors end at byte 24");
  CHECK(error_of([] { safetensors_reader r("/nonexistent/dir/x.safetensors"); }) ==
        "safetensors: /nonexistent/dir/x.safetensors: cannot open the file");
}

TEST_CASE("safetensors: a file that shrinks after opening is reported, not read past") {
  std::vector<double> v(1000, 2.5);
  safetensors_writer w;
  w.add("v", {1000}, std::span<const double>(v));
  const fs::path p = tmp() / "shrink.safetensors";
  w.write(p);
  safetensors_reader r(p);
  const std::uint64_t start = r.data_start();
  fs::resize_file(p, start + 100);
  CHECK(error_of([&] { (void)r.read<double>("v"); }) ==
        "safetensors: " + p.string() + ": tensor 'v': reading bytes [" + std::to_string(start) + ", " +
            std::to_string(start + 8000) + ") got 100 bytes: the file is shorter than when it was opened");
}

TEST_CASE("safetensors: a failed write leaves neither a file nor a temporary") {
  const fs::path dir = tmp() / "failing";
  fs::create_directories(dir);
  const std::vector<float> x{1, 2, 3};
  auto written = [&](auto&& f) {
    const std::string e = error_of(f);
    CHECK(!fs::exists(dir / "out.safetensors"));
    CHECK(temp_files(dir) == 0);
    return e;
  };
  const std::string at = "write_safetensors: " + (dir / "out.safetensors").string() + ": ";
  CHECK(written([&] {
          safetensors_writer w;
          w.add("a", {3}, std::span<const float>(x));
          w.add("a", {3}, std::span<const float>(x));
          w.write(dir / "out.safetensors");
        }) == at + "tensor 'a': the name is used twice");
  CHECK(written([&] {
          safetensors_writer w;
          w.add("__metadata__", {3}, std::span<const float>(x));
          w.write(dir / "out.safetensors");
        }) == at + "tensor '__metadata__': the name is reserved for the metadata");
  CHECK(written([&] {
          safetensors_writer w;
          w.add("", {3}, std::span<const float>(x));
          w.write(dir / "out.safetensors");
        }) == at + "tensor 0 has an empty name");
  CHECK(written([&] {
          safetensors_writer w;
          w.add("a", {2, 2}, std::span<const float>(x));
        }) == "safetensors_writer::add: tensor 'a': F32 (2, 2) needs 16 bytes, 12 given");
  std::vector<tensor_spec> specs{{"a", dtype::f32, {3}}, {"b", dtype::i64, {2}}};
  CHECK(written([&] {
          safetensors_stream s(dir / "out.safetensors", specs, {});
          s.write(std::span<const float>(x));
          s.write(std::span<const float>(x.data(), 1));
        }) == at + "tensor 'b' is I64, written as F32");
  CHECK(written([&] {
          safetensors_stream s(dir / "out.safetensors", specs, {});
          s.write(std::span<const float>(x.data(), 2));
          s.commit();
        }) == at + "tensor 'a' (F32 (3,)) needs 12 bytes, 8 were written");
  CHECK(written([&] {
          safetensors_stream s(dir / "out.safetensors", specs, {});
          s.write(std::span<const float>(x.data(), 2));
          s.write(std::span<const float>(x.data(), 2));
        }) == at + "tensor 'a' (F32 (3,)) needs 12 bytes, a write of 8 after 8 runs past its end");
  CHECK(written([&] {
          write_safetensors(dir / "out.safetensors", specs, {}, [&](std::size_t i, safetensors_stream& s) {
            if (i == 0) s.write(std::span<const float>(x.data(), 1));
          });
        }) == at + "tensor 'a' (F32 (3,)) needs 12 bytes, 4 were written");
  CHECK(written([&] { write_file_atomically(dir / "no_such_dir" / "out.safetensors", "x"); })
            .find("cannot create the temporary file") != std::string::npos);
  // an existing file stays as it was when a new write fails
  spit(dir / "out.safetensors", "previous");
  CHECK(error_of([&] {
          safetensors_stream s(dir / "out.safetensors", specs, {});
          s.commit();
        }) == at + "tensor 'a' (F32 (3,)) needs 12 bytes, 0 were written");
  CHECK(slurp(dir / "out.safetensors") == "previous");
  CHECK(temp_files(dir) == 0);
}

TEST_CASE("safetensors: a writer killed midway never leaves a partial file under the final name") {
  const fs::path dir = tmp() / "killed";
  fs::create_directories(dir);
  const fs::path p = dir / "ckpt.safetensors";
  // 4 tensors of 2 MiB; every element of one version holds the version number.
  auto write_version = [&](int version) {
    std::vector<float> v(std::size_t(1) << 19, float(version));
    safetensors_writer w;
    for (const char* name : {"t0", "t1", "t2", "t3"}) w.add(name, {512, 1024}, std::span<const float>(v));
    w.set_metadata("version", std::to_string(version));
    w.write(p);
  };
  write_version(0);
  for (int trial = 0; trial < 4; ++trial) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      try {
        for (int version = 1;; ++version) write_version(version);  // until killed
      } catch (...) {
      }
      ::_exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + 45 * trial));
    ::kill(child, SIGKILL);
    int st = 0;
    ::waitpid(child, &st, 0);
    CHECK(WIFSIGNALED(st));
    // whatever version the file holds, it is whole and consistent
    safetensors_reader r(p);
    const float version = std::stof(r.metadata().at("version"));
    REQUIRE(r.tensors().size() == 4);
    for (const tensor_info& t : r.tensors()) {
      const std::vector<float> got = r.read<float>(t.name);
      CHECK(std::count(got.begin(), got.end(), version) == std::ptrdiff_t(got.size()));
    }
    MESSAGE("trial " << trial << ": the file holds version " << version);
  }
  // the killed writer's temporary may remain, hidden and never under the final name
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    CHECK((name == "ckpt.safetensors" || name.rfind(".ckpt.safetensors.tmp.", 0) == 0));
  }
}

TEST_CASE("safetensors: seeded random truncations and corruptions read correctly or throw tessera::error") {
  // Valid small files of several shapes, then mutations of their bytes.
  std::vector<std::string> seeds;
  {
    const expected_tensors e;
    safetensors_writer w;
    e.add_to(w);
    w.write(tmp() / "seed0.safetensors");
    seeds.push_back(slurp(tmp() / "seed0.safetensors"));
    std::vector<double> d(24);
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = double(i) - 3.25;
    safetensors_writer w2;
    w2.add("m", {2, 3, 4}, std::span<const double>(d));
    w2.add("n", {4, 2}, std::span<const double>(d.data(), 8));
    w2.write(tmp() / "seed1.safetensors");
    seeds.push_back(slurp(tmp() / "seed1.safetensors"));
  }
  std::mt19937_64 rng(1234567);
  const fs::path p = tmp() / "fuzz.safetensors";
  int read_ok = 0, rejected = 0, other = 0;
  const int trials = 600;
  for (int iter = 0; iter < trials; ++iter) {
    std::string s = seeds[iter % seeds.size()];
    const std::uint64_t hlen = std::uint64_t(std::uint8_t(s[0])) | std::uint64_t(std::uint8_t(s[1])) << 8;
    switch (rng() % 7) {
      case 0: s.resize(rng() % s.size()); break;  // truncate anywhere
      case 1: s[8 + rng() % hlen] = char(rng()); break;  // a random header byte
      case 2: {  // a digit of the header changed (shapes, offsets)
        std::vector<std::size_t> digits;
        for (std::size_t i = 8; i < 8 + hlen; ++i)
          if (s[i] >= '0' && s[i] <= '9') digits.push_back(i);
        s[digits[rng() % digits.size()]] = char('0' + rng() % 10);
        break;
      }
      case 3: {  // the length field
        const std::uint64_t n = rng() % 4 == 0 ? rng() : hlen + (rng() % 33) - 16;
        s.replace(0, 8, le64(n));
        break;
      }
      case 4: s.insert(8 + rng() % (s.size() - 8), std::string(1 + rng() % 8, char(rng()))); break;  // inserted bytes
      case 5: s.erase(8 + rng() % (s.size() - 8), 1 + rng() % 8); break;  // deleted bytes
      case 6: s[8 + hlen + rng() % (s.size() - 8 - hlen)] ^= char(1 + rng() % 255); break;  // a data byte
    }
    spit(p, s);
    try {
      safetensors_reader r(p);
      for (const tensor_info& t : r.tensors()) {
        const std::vector<std::byte> b = r.read_host_bytes(t);
        CHECK(b.size() == t.nbytes());
        if (t.shape.size() <= std::size_t(max_tensor_ndim) && t.type != dtype::boolean && t.type != dtype::f16 &&
            t.type != dtype::bf16) {
          const extents shape = t.shape_extents();
          std::vector<std::byte> boxed(b.size());
          extents zero = shape;
          for (int d = 0; d < zero.ndim; ++d) zero.v[d] = 0;
          r.read_box_host_bytes(t, box{zero, shape}, boxed);
          CHECK(boxed == b);
        }
      }
      ++read_ok;
    } catch (const error&) {
      ++rejected;
    } catch (...) {
      ++other;
    }
  }
  MESSAGE(read_ok << " mutated files read, " << rejected << " rejected with tessera::error");
  CHECK(other == 0);
  CHECK(read_ok + rejected == trials);
  CHECK(read_ok > 20);
  CHECK(rejected > 300);
}

TEST_CASE("safetensors: a hand-written Python reader and writer agree with tessera") {
  const std::string python = TESSERA_PYTHON3;
  if (python.empty() || std::system((python + " -c pass > /dev/null 2>&1").c_str()) != 0) {
    MESSAGE("python3 not found: interoperability not checked");
    return;
  }
  const std::string script = std::string(TESSERA_IO_TEST_DIR) + "/safetensors_check.py";
  const expected_tensors e;
  safetensors_writer w;
  e.add_to(w);
  const fs::path ours = tmp() / "for_python.safetensors";
  w.write(ours);
  CHECK(std::system((python + " " + script + " read " + ours.string()).c_str()) == 0);
  const fs::path theirs = tmp() / "from_python.safetensors";
  REQUIRE(std::system((python + " " + script + " write " + theirs.string()).c_str()) == 0);
  safetensors_reader r(theirs);
  e.check(r);
  CHECK(r.tensors().front().name == "empty");  // Python wrote them in reverse order
}
}  // namespace io_test_safetensors
