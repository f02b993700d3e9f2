#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/npy.h"
#include "io/file_util.h"
#include "scratch_dir.h"

namespace moecore::data {
namespace {

namespace fs = std::filesystem;

class NpyTest : public ::testing::Test {
 protected:
  void TearDown() override { io::set_write_failure_for_testing(-1); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string write_raw(const std::string& name, const std::string& bytes) const {
    std::ofstream out(path(name), std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path(name);
  }

  // A v1.0 file exactly as numpy.save lays it out: header padded to 64 bytes with a newline.
  std::string write_npy_by_hand(const std::string& name, const std::string& dict,
                                const std::string& data, char major = 1) const {
    const size_t prefix = major == 1 ? 10 : 12;
    std::string header = dict;
    header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
    header.push_back('\n');
    std::string bytes = "\x93NUMPY";
    bytes.push_back(major);
    bytes.push_back('\0');
    const uint32_t len = static_cast<uint32_t>(header.size());
    bytes.append(reinterpret_cast<const char*>(&len), major == 1 ? 2 : 4);
    return write_raw(name, bytes + header + data);
  }

  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  ScratchDir scratch_{"moecore_npy"};
  const fs::path dir_ = scratch_.path();
};

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    for (const auto& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message '" << message << "' lacks '" << fragment << "'";
    }
    return;
  }
  ADD_FAILURE() << "no moecore::Error thrown";
}

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST_F(NpyTest, RoundTripsEveryWritableDtype) {
  const std::vector<uint16_t> u2 = {0, 1, 65535, 50257};
  const std::vector<uint32_t> u4 = {0, 4294967295u, 151643, 7};
  const std::vector<int32_t> i4 = {-2147483647 - 1, -1, 0, 2147483647};
  const std::vector<int64_t> i8 = {INT64_MIN, -5, 0, INT64_MAX};
  write_npy(path("u2.npy"), "<u2", {2, 2}, u2.data());
  write_npy(path("u4.npy"), "<u4", {4}, u4.data());
  write_npy(path("i4.npy"), "<i4", {1, 4}, i4.data());
  write_npy(path("i8.npy"), "<i8", {4, 1}, i8.data());

  const auto check = [&](const std::string& name, const std::string& descr,
                         std::vector<int64_t> shape, std::vector<int64_t> expected) {
    const NpyFile f = NpyFile::open(path(name));
    EXPECT_EQ(f.dtype(), descr);
    EXPECT_EQ(f.shape(), shape);
    EXPECT_EQ(f.numel(), expected.size());
    std::vector<int64_t> got;
    f.read_ints(got);
    EXPECT_EQ(got, expected) << name;
    EXPECT_EQ(f.int_at(2), expected[2]) << name;
  };
  check("u2.npy", "<u2", {2, 2}, {0, 1, 65535, 50257});
  check("u4.npy", "<u4", {4}, {0, 4294967295ll, 151643, 7});
  check("i4.npy", "<i4", {1, 4}, {-2147483648ll, -1, 0, 2147483647});
  check("i8.npy", "<i8", {4, 1}, {INT64_MIN, -5, 0, INT64_MAX});

  const std::vector<float> f4 = {1.5f, -2.0f, 3.0e-7f};
  write_npy(path("f4.npy"), "<f4", {3}, f4.data());
  const NpyFile f = NpyFile::open(path("f4.npy"));
  EXPECT_EQ(f.dtype(), "<f4");
  EXPECT_EQ(std::memcmp(f.data(), f4.data(), 12), 0);
  EXPECT_EQ(entries().size(), 5u);  // No temporaries left behind.
}

TEST_F(NpyTest, WritesNumpyCompatibleHeader) {
  const std::vector<uint16_t> v = {1, 2, 3};
  write_npy(path("h.npy"), "<u2", {3}, v.data());
  std::ifstream in(path("h.npy"), std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  ASSERT_EQ(bytes.size(), 128u + 6u);  // 10 + 58-byte dict + newline > 64.
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(
      bytes.substr(10, 117).rfind("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }", 0),
      0u);
  EXPECT_EQ(bytes.substr(8, 2), std::string("\x76\x00", 2));  // Header length 118.
  EXPECT_EQ(bytes[127], '\n');
}

TEST_F(NpyTest, ReadsHandWrittenVersion1And2Files) {
  const std::vector<uint8_t> u1 = {0, 7, 255};
  const std::string p = write_npy_by_hand(
      "u1.npy", "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }", bytes_of(u1));
  const NpyFile a = NpyFile::open(p);
  EXPECT_EQ(a.dtype(), "|u1");
  EXPECT_EQ(a.int_at(2), 255);

  const std::vector<int32_t> i4 = {1, -2, 3, -4, 5, -6};
  const std::string q = write_npy_by_hand(
      "v2.npy", "{\"descr\": \"<i4\", \"fortran_order\": False, \"shape\": (2, 3)}", bytes_of(i4),
      2);
  const NpyFile b = NpyFile::open(q);
  EXPECT_EQ(b.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b.int_at(5), -6);
}

TEST_F(NpyTest, ReadsScalarAndEmptyShapes) {
  const std::vector<int64_t> one = {42};
  const std::string p = write_npy_by_hand(
      "scalar.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (), }", bytes_of(one));
  const NpyFile s = NpyFile::open(p);
  EXPECT_TRUE(s.shape().empty());
  EXPECT_EQ(s.numel(), 1u);
  EXPECT_EQ(s.int_at(0), 42);

  write_npy(path("empty.npy"), "<u4", {0}, nullptr);
  const NpyFile e = NpyFile::open(path("empty.npy"));
  EXPECT_EQ(e.numel(), 0u);
  std::vector<int64_t> out = {1, 2};
  e.read_ints(out);
  EXPECT_TRUE(out.empty());
}

TEST_F(NpyTest, RejectsBigEndian) {
  const std::string p = write_npy_by_hand(
      "be.npy", "{'descr': '>i4', 'fortran_order': False, 'shape': (1,), }", "abcd");
  expect_error([&] { NpyFile::open(p); }, {"[npy]", p, "big-endian", "'>i4'"});
}

TEST_F(NpyTest, RejectsFortranOrder) {
  const std::string p = write_npy_by_hand(
      "f.npy", "{'descr': '<i4', 'fortran_order': True, 'shape': (1, 1), }", "abcd");
  expect_error([&] { NpyFile::open(p); }, {p, "fortran_order"});
}

TEST_F(NpyTest, RejectsTruncatedData) {
  const std::string p = write_npy_by_hand(
      "t.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (10,), }", "abcdef");
  expect_error([&] { NpyFile::open(p); }, {p, "truncated: expected 20 bytes of data, found 6"});
}

TEST_F(NpyTest, RejectsUnsupportedDtype) {
  const std::string p = write_npy_by_hand(
      "f8.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", "abcdefgh");
  expect_error([&] { NpyFile::open(p); }, {p, "unsupported dtype '<f8'"});
  const std::string q = write_npy_by_hand(
      "rec.npy", "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (1,), }", "abcd");
  expect_error([&] { NpyFile::open(q); }, {q, "structured"});
  expect_error([&] { write_npy(path("x.npy"), "<f8", {1}, "abcdefgh"); }, {path("x.npy"), "'<f8'"});
}

TEST_F(NpyTest, RejectsBadMagicVersionAndMalformedHeader) {
  const std::string p = write_raw("magic.npy", "PK\x03\x04 not numpy at all");
  expect_error([&] { NpyFile::open(p); }, {p, "bad magic"});
  const std::string q = write_raw("short.npy", "\x93NUM");
  expect_error([&] { NpyFile::open(q); }, {q, "bad magic"});
  std::string v9 = "\x93NUMPY";
  v9 += std::string("\x09\x00\x00\x00", 4);
  const std::string r = write_raw("v9.npy", v9);
  expect_error([&] { NpyFile::open(r); }, {r, "version 9.0"});
  const std::string s =
      write_npy_by_hand("dict.npy", "{'descr': '<i4', 'fortran_order': Nope, 'shape': (1,)}", "");
  expect_error([&] { NpyFile::open(s); }, {s, "malformed header", "True or False"});
  const std::string t = write_npy_by_hand("keys.npy", "{'descr': '<i4', 'shape': (1,)}", "abcd");
  expect_error([&] { NpyFile::open(t); }, {t, "fortran_order"});
  std::string huge = "\x93NUMPY";
  huge += std::string("\x01\x00\xff\x00{", 5);
  const std::string u = write_raw("hlen.npy", huge);
  expect_error([&] { NpyFile::open(u); }, {u, "header length 255"});
  expect_error([&] { NpyFile::open(path("absent.npy")); }, {"absent.npy", "No such file"});
}

TEST_F(NpyTest, IntAccessRejectsFloatAndOutOfRange) {
  const std::vector<float> f4 = {1.0f};
  write_npy(path("f.npy"), "<f4", {1}, f4.data());
  const NpyFile f = NpyFile::open(path("f.npy"));
  expect_error([&] { f.int_at(0); }, {path("f.npy"), "'<f4'"});
  std::vector<int64_t> out;
  expect_error([&] { f.read_ints(out); }, {"'<f4'"});
  const std::vector<uint16_t> u2 = {1, 2};
  write_npy(path("u.npy"), "<u2", {2}, u2.data());
  const NpyFile u = NpyFile::open(path("u.npy"));
  expect_error([&] { u.int_at(2); }, {"index 2", "2 elements"});
}

TEST_F(NpyTest, WriteIsAtomic) {
  const std::vector<int32_t> v(1000, 7);
  expect_error([&] { write_npy(path("no/such/dir/x.npy"), "<i4", {1000}, v.data()); },
               {"[npy]", "no/such/dir/x.npy", "No such file or directory"});

  const std::vector<int32_t> old_values = {1, 2, 3};
  write_npy(path("x.npy"), "<i4", {3}, old_values.data());
  io::set_write_failure_for_testing(200);
  expect_error([&] { write_npy(path("x.npy"), "<i4", {1000}, v.data()); },
               {path("x.npy"), "No space left on device"});
  io::set_write_failure_for_testing(-1);
  EXPECT_EQ(entries(), (std::vector<std::string>{"x.npy"}));
  std::vector<int64_t> got;
  NpyFile::open(path("x.npy")).read_ints(got);
  EXPECT_EQ(got, (std::vector<int64_t>{1, 2, 3}));
}

}  // namespace
}  // namespace moecore::data
