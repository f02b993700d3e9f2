#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "core/check.h"
#include "io/file_util.h"
#include "io/safetensors.h"
#include "io/tensor_parts.h"
#include "scratch_dir.h"

namespace moecore::io {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    set_write_failure_for_testing(-1);
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes raw bytes: for hand-made (possibly malformed) files.
  std::string write_raw(const std::string& name, const std::string& bytes) const {
    std::ofstream out(path(name), std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path(name);
  }

  // A file with the given JSON header text and data buffer.
  std::string write_file(const std::string& name, const std::string& header,
                         const std::string& buffer) const {
    const uint64_t n = header.size();
    std::string bytes(reinterpret_cast<const char*>(&n), 8);
    return write_raw(name, bytes + header + buffer);
  }

  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  ScratchDir scratch_{"moecore_st"};
  const fs::path dir_ = scratch_.path();
};

// Expects fn to throw moecore::Error whose one-line message contains every fragment.
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

std::string file_contents(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST_F(SafetensorsTest, RoundTripPreservesValuesShapesAndMetadata) {
  const std::vector<float> a = {1.0f, -2.5f, 3.25f, 1e-30f, -0.0f, 6e30f};
  const std::vector<float> b = {7.0f, 8.0f};
  SafetensorsWriter writer;
  writer.add_f32("model.b", {2}, b.data());
  writer.add_f32("model.a", {2, 3}, a.data());
  writer.set_metadata("format", "pt");
  writer.write(path("w.safetensors"));

  const auto reader = SafetensorsReader::open(path("w.safetensors"));
  EXPECT_EQ(reader.names(), (std::vector<std::string>{"model.a", "model.b"}));
  EXPECT_TRUE(reader.has("model.a"));
  EXPECT_FALSE(reader.has("model.c"));
  EXPECT_EQ(reader.info("model.a").dtype, "F32");
  EXPECT_EQ(reader.info("model.a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(reader.info("model.a").end - reader.info("model.a").begin, 24u);
  EXPECT_EQ(reader.metadata().at("format"), "pt");

  std::vector<float> got(6);
  reader.read_f32("model.a", {2, 3}, got.data());
  EXPECT_EQ(std::memcmp(got.data(), a.data(), 24), 0);  // Bit-exact, including -0.0.
  EXPECT_EQ(reader.read_f32("model.b"), b);
  EXPECT_EQ(entries(), (std::vector<std::string>{"w.safetensors"}));  // No temp file left.
}

TEST_F(SafetensorsTest, HeaderIsSortedAndPaddedToEightBytes) {
  const float x = 1.0f;
  SafetensorsWriter writer;
  writer.add_f32("zeta", {1}, &x);
  writer.add_f32("alpha", {1}, &x);
  writer.set_metadata("k", "v");
  writer.write(path("h.safetensors"));

  const std::string bytes = file_contents(path("h.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 8);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.rfind(R"({"__metadata__":{"k":"v"},"alpha":{"data_offsets":[0,4],)", 0), 0u)
      << header;
  EXPECT_LT(header.find("\"alpha\""), header.find("\"zeta\""));
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
}

TEST_F(SafetensorsTest, ReadsBf16AndF16AsFloat) {
  // bf16: 1.0, -2.0, 0.15625, +inf.  f16: 1.0, -2.0, 0.5, smallest subnormal, 65504, -inf.
  const uint16_t bf16[] = {0x3f80, 0xc000, 0x3e20, 0x7f80};
  const uint16_t f16[] = {0x3c00, 0xc000, 0x3800, 0x0001, 0x7bff, 0xfc00};
  std::string buffer(reinterpret_cast<const char*>(bf16), sizeof(bf16));
  buffer.append(reinterpret_cast<const char*>(f16), sizeof(f16));
  const std::string p = write_file("half.safetensors",
                                   R"({"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},)"
                                   R"("h":{"dtype":"F16","shape":[6],"data_offsets":[8,20]}})",
                                   buffer);
  const auto reader = SafetensorsReader::open(p);
  float b[4];
  reader.read_f32("b", {2, 2}, b);
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -2.0f);
  EXPECT_EQ(b[2], 0.15625f);
  EXPECT_EQ(b[3], std::numeric_limits<float>::infinity());
  const std::vector<float> h = reader.read_f32("h");
  ASSERT_EQ(h.size(), 6u);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 0.5f);
  EXPECT_EQ(h[3], 0x1p-24f);
  EXPECT_EQ(h[4], 65504.0f);
  EXPECT_EQ(h[5], -std::numeric_limits<float>::infinity());
}

TEST_F(SafetensorsTest, HandlesScalarAndEmptyTensors) {
  const float s = 42.0f;
  SafetensorsWriter writer;
  writer.add_f32("scalar", {}, &s);
  writer.add_f32("empty", {0, 4}, nullptr);
  writer.write(path("e.safetensors"));
  const auto reader = SafetensorsReader::open(path("e.safetensors"));
  EXPECT_EQ(reader.read_f32("scalar"), std::vector<float>{42.0f});
  EXPECT_TRUE(reader.read_f32("empty").empty());
  EXPECT_EQ(reader.info("empty").shape, (std::vector<int64_t>{0, 4}));
}

TEST_F(SafetensorsTest, ReaderIsMoveOnly) {
  static_assert(!std::is_copy_constructible_v<SafetensorsReader>);
  static_assert(std::is_nothrow_move_constructible_v<SafetensorsReader>);
  const float x = 3.0f;
  SafetensorsWriter writer;
  writer.add_f32("x", {1}, &x);
  writer.write(path("m.safetensors"));
  auto first = SafetensorsReader::open(path("m.safetensors"));
  SafetensorsReader second = std::move(first);
  EXPECT_EQ(second.read_f32("x"), std::vector<float>{3.0f});
}

TEST_F(SafetensorsTest, RejectsMissingFile) {
  expect_error([&] { SafetensorsReader::open(path("nope.safetensors")); },
               {"[safetensors]", "nope.safetensors", "No such file"});
}

TEST_F(SafetensorsTest, RejectsFileShorterThanEightBytes) {
  const std::string p = write_raw("short.safetensors", "abc");
  expect_error([&] { SafetensorsReader::open(p); }, {p, "3 bytes", "shorter"});
  const std::string empty = write_raw("empty.safetensors", "");
  expect_error([&] { SafetensorsReader::open(empty); }, {empty, "0 bytes"});
}

TEST_F(SafetensorsTest, RejectsHeaderLengthBeyondFile) {
  const uint64_t n = 1000;
  const std::string p =
      write_raw("long.safetensors", std::string(reinterpret_cast<const char*>(&n), 8) + "{}");
  expect_error([&] { SafetensorsReader::open(p); }, {p, "header length 1000", "2 bytes"});
}

TEST_F(SafetensorsTest, RejectsMalformedJson) {
  const std::string p = write_file("bad.safetensors", R"({"a": {"dtype": )", "");
  expect_error([&] { SafetensorsReader::open(p); }, {p, "malformed JSON"});
  const std::string q = write_file("array.safetensors", "[1, 2]", "");
  expect_error([&] { SafetensorsReader::open(q); }, {q, "expected an object"});
  const std::string r =
      write_file("noshape.safetensors", R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", "abcd");
  expect_error([&] { SafetensorsReader::open(r); }, {r, "'a'", "shape"});
  const std::string s = write_file(
      "negoff.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", "abcd");
  expect_error([&] { SafetensorsReader::open(s); }, {s, "'a'", "data_offsets"});
  const std::string t = write_file("meta.safetensors", R"({"__metadata__":{"k":1}})", "");
  expect_error([&] { SafetensorsReader::open(t); }, {t, "__metadata__", "'k'"});
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  const std::string p = write_file(
      "dtype.safetensors", R"({"w":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", "abcd");
  expect_error([&] { SafetensorsReader::open(p); }, {p, "'w'", "unknown dtype 'F31'"});
}

TEST_F(SafetensorsTest, RejectsOffsetsOutOfRange) {
  const std::string p = write_file(
      "range.safetensors", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "abcd");
  expect_error([&] { SafetensorsReader::open(p); }, {p, "'w'", "[0, 8]", "4-byte"});
  const std::string q = write_file(
      "reversed.safetensors", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", "abcd");
  expect_error([&] { SafetensorsReader::open(q); }, {q, "'w'", "[4, 0]"});
}

TEST_F(SafetensorsTest, RejectsOverlappingOffsets) {
  const std::string p = write_file("overlap.safetensors",
                                   R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                   std::string(12, 'x'));
  expect_error([&] { SafetensorsReader::open(p); }, {p, "'a'", "'b'", "overlap"});
}

TEST_F(SafetensorsTest, RejectsOffsetsNotMatchingDtypeSize) {
  const std::string p =
      write_file("size.safetensors", R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})",
                 std::string(8, 'x'));
  expect_error([&] { SafetensorsReader::open(p); }, {p, "'w'", "8 bytes", "BF16", "needs 6"});
}

TEST_F(SafetensorsTest, ReadF32RequiresTensorShapeAndFloatDtype) {
  const std::string p = write_file("int.safetensors",
                                   R"({"f":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                                   R"("i":{"dtype":"I32","shape":[1],"data_offsets":[24,28]}})",
                                   std::string(28, '\0'));
  const auto reader = SafetensorsReader::open(p);
  std::vector<float> dst(6);
  expect_error([&] { reader.read_f32("g", {1}, dst.data()); }, {p, "missing tensor 'g'"});
  expect_error([&] { reader.info("g"); }, {p, "missing tensor 'g'"});
  expect_error(
      [&] {
        reader.read_f32("f", {3, 2}, dst.data());
      },
      {p, "'f'", "shape [2, 3], expected [3, 2]"});
  expect_error([&] { reader.read_f32("i", {1}, dst.data()); }, {p, "'i'", "dtype I32"});
  expect_error([&] { reader.read_f32("i"); }, {"I32"});
}

TEST_F(SafetensorsTest, WriterRejectsDuplicateAndInvalidNames) {
  const float x = 1.0f;
  SafetensorsWriter writer;
  writer.add_f32("w", {1}, &x);
  expect_error([&] { writer.add_f32("w", {1}, &x); }, {"duplicate", "'w'"});
  expect_error([&] { writer.add_f32("__metadata__", {1}, &x); }, {"__metadata__"});
  expect_error([&] { writer.add_f32("neg", {-1}, &x); }, {"'neg'", "[-1]"});
}

TEST_F(SafetensorsTest, WriterBorrowsHostValuesUntilWriteAndOwnsMovedOnes) {
  // A borrowed tensor is read when the file is written (a checkpoint holds no copy of the
  // state); a moved vector is the writer's, so its caller's temporary may go.
  std::vector<float> borrowed = {1.0f, 2.0f};
  SafetensorsWriter writer;
  writer.add_f32("borrowed", {2}, borrowed.data());
  {
    std::vector<float> temporary = {7.0f};
    writer.add_f32("owned", {1}, std::move(temporary));
  }
  borrowed[1] = 3.0f;
  writer.write(path("b.safetensors"));
  const SafetensorsReader reader = SafetensorsReader::open(path("b.safetensors"));
  EXPECT_EQ(reader.read_f32("borrowed"), (std::vector<float>{1.0f, 3.0f}));
  EXPECT_EQ(reader.read_f32("owned"), (std::vector<float>{7.0f}));
  expect_error([&] { writer.add_f32("short", {2}, std::vector<float>{1.0f}); },
               {"'short'", "1 values for 2 elements"});
  expect_error([&] { writer.add_f32("null", {2}, static_cast<const float*>(nullptr)); },
               {"'null'", "null data"});
}

TEST_F(SafetensorsTest, AtomicWriteRemovesTheTemporaryWhenAChunkCannotBeMade) {
  write_raw("c.bin", "old");
  const std::string text = "new";
  expect_error(
      [&] {
        write_file_atomic(
            path("c.bin"), 2,
            [&](size_t i) -> std::span<const std::byte> {
              if (i == 1) fail("[test] the second chunk cannot be made");
              return std::as_bytes(std::span(text));
            },
            "[test]");
      },
      {"the second chunk cannot be made"});
  EXPECT_EQ(file_contents(path("c.bin")), "old");
  EXPECT_EQ(entries(), (std::vector<std::string>{"c.bin"}));  // Temporary removed.
}

TEST_F(SafetensorsTest, AtomicWriteFailsCleanlyWhenDirectoryIsMissing) {
  const float x = 1.0f;
  SafetensorsWriter writer;
  writer.add_f32("w", {1}, &x);
  const std::string p = path("missing/dir/w.safetensors");
  expect_error([&] { writer.write(p); }, {"[safetensors]", p, "No such file or directory"});
  EXPECT_TRUE(entries().empty());
}

TEST_F(SafetensorsTest, AtomicWriteKeepsPreviousFileWhenDiskIsFull) {
  const std::vector<float> old_values = {1.0f, 2.0f};
  SafetensorsWriter old_writer;
  old_writer.add_f32("w", {2}, old_values.data());
  old_writer.write(path("c.safetensors"));
  const std::string before = file_contents(path("c.safetensors"));

  const std::vector<float> big(1000, 5.0f);
  SafetensorsWriter writer;
  writer.add_f32("w", {1000}, big.data());
  set_write_failure_for_testing(100);  // Fails mid-way through the data, after the header.
  expect_error([&] { writer.write(path("c.safetensors")); },
               {path("c.safetensors"), "No space left on device"});
  set_write_failure_for_testing(-1);

  EXPECT_EQ(file_contents(path("c.safetensors")), before);
  EXPECT_EQ(entries(), (std::vector<std::string>{"c.safetensors"}));  // Temporary removed.
  EXPECT_EQ(SafetensorsReader::open(path("c.safetensors")).read_f32("w"), old_values);
}

TEST_F(SafetensorsTest, AtomicWriteKeepsPreviousFileWhenRenameFails) {
  // The target's directory is replaced by a file between the write and the rename: rename()
  // fails (ENOTDIR) after the temporary was fully written, and the temporary goes.
  fs::create_directory(path("sub"));
  write_raw("sub/c.bin", "old");
  const std::string text = "new";
  expect_error(
      [&] {
        write_file_atomic(
            path("sub/c.bin"), 1,
            [&](size_t) -> std::span<const std::byte> {
              fs::rename(path("sub/c.bin"), path("sub/moved"));
              fs::create_directory(path("sub/c.bin"));
              write_raw("sub/c.bin/keep", "x");
              return std::as_bytes(std::span(text));
            },
            "[test]");
      },
      {path("sub/c.bin"), "rename"});
  EXPECT_EQ(file_contents(path("sub/c.bin/keep")), "x");
  EXPECT_EQ(file_contents(path("sub/moved")), "old");
  std::vector<std::string> names;  // the temporary removed
  for (const auto& e : fs::directory_iterator(path("sub"))) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"c.bin", "moved"}));
}

// A checkpoint's writers refuse values that are not numbers: a diverged run must not replace
// the checkpoints that could restart it. The previous file stays; the error names the tensor.
TEST_F(SafetensorsTest, RequireFiniteRefusesNaNAndInfinityAndKeepsThePreviousFile) {
  const std::vector<float> good = {1.0f, 2.0f, 3.0f};
  SafetensorsWriter first;
  first.require_finite();
  first.add_f32("a", {3}, good.data());
  first.write(path("c.safetensors"));
  const std::string before = file_contents(path("c.safetensors"));
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    const std::vector<float> values = {1.0f, 2.0f, bad};
    SafetensorsWriter writer;
    writer.require_finite();
    writer.add_f32("a", {3}, good.data());
    writer.add_f32("b", {3}, values.data());
    expect_error([&] { writer.write(path("c.safetensors")); },
                 {"refusing to write", path("c.safetensors"), "tensor 'b'", "at element 2"});
    EXPECT_EQ(file_contents(path("c.safetensors")), before);
    EXPECT_EQ(entries(), (std::vector<std::string>{"c.safetensors"}));  // Temporary removed.
  }
  SafetensorsWriter plain;  // without the requirement: written as given (debug-state's NaNs)
  const std::vector<float> nan = {std::numeric_limits<float>::quiet_NaN()};
  plain.add_f32("n", {1}, nan.data());
  plain.write(path("n.safetensors"));
  EXPECT_TRUE(std::isnan(SafetensorsReader::open(path("n.safetensors")).read_f32("n")[0]));
}

// The rename would turn a device (/dev/null written as root), a FIFO, a directory or a symbolic
// link into a plain file: refused before anything is written, whatever is there left as it was.
TEST_F(SafetensorsTest, AtomicWriteRefusesToReplaceWhatIsNotARegularFile) {
  const std::string text = "new";
  const std::span<const std::byte> bytes = std::as_bytes(std::span(text));
  const std::span<const std::byte> chunks[] = {bytes};
  write_raw("real.bin", "old");
  fs::create_symlink(path("real.bin"), path("link.bin"));
  expect_error([&] { write_file_atomic(path("link.bin"), chunks, "[test]"); },
               {"[test]", path("link.bin"), "symbolic link"});
  EXPECT_TRUE(fs::is_symlink(path("link.bin")));
  EXPECT_EQ(file_contents(path("real.bin")), "old");

  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  expect_error([&] { write_file_atomic(path("fifo"), chunks, "[test]"); },
               {path("fifo"), "not a regular file"});
  EXPECT_TRUE(fs::is_fifo(path("fifo")));

  fs::create_directory(path("dir"));
  expect_error([&] { write_file_atomic(path("dir"), chunks, "[test]"); },
               {path("dir"), "a directory"});
  EXPECT_TRUE(fs::is_directory(path("dir")));
  EXPECT_EQ(entries(), (std::vector<std::string>{"dir", "fifo", "link.bin", "real.bin"}));
}

// A mapped file truncated by another program: the next read past its new end raises SIGBUS,
// which ends the process with one line naming the file and status 1, not a bare "Bus error".
TEST_F(SafetensorsTest, MappedFileTruncatedUnderTheReaderEndsWithItsName) {
  const std::string p = write_raw("tokens.bin", std::string(3 * 4096, 'x'));
  const auto read_after_truncation = [&] {
    const MappedFile file = MappedFile::open(p, "[test]");
    ASSERT_EQ(::truncate(p.c_str(), 0), 0);
    const volatile std::byte* data = file.data();
    [[maybe_unused]] const std::byte value = data[2 * 4096];
  };
  EXPECT_EXIT(read_after_truncation(), ::testing::ExitedWithCode(1),
              "moecore: error: .*tokens.bin: the file shrank while this process was reading it");
}

TEST_F(SafetensorsTest, AtomicWriteKeepsPreviousFileInReadOnlyDirectory) {
  const float x = 1.0f;
  SafetensorsWriter old_writer;
  old_writer.add_f32("w", {1}, &x);
  old_writer.write(path("ro.safetensors"));
  const std::string before = file_contents(path("ro.safetensors"));
  // r-x for everyone: readable and searchable, writable by no one but root.
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                            fs::perms::group_exec | fs::perms::others_read |
                            fs::perms::others_exec);
  const float y = 2.0f;
  SafetensorsWriter writer;
  writer.add_f32("w", {1}, &y);
  // Root ignores directory permissions (CI runs as root): the write is tried in a child process
  // that gives root up for the user nobody, so the check runs everywhere. Its exit status says
  // what happened: 0 the expected one-line error, 1 another error, 2 no error, 3 root kept.
  const auto attempt = [&] {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) std::_Exit(3);
    try {
      writer.write(path("ro.safetensors"));
    } catch (const Error& e) {
      const std::string message = e.what();
      std::fprintf(stderr, "%s\n", message.c_str());
      const bool expected = message.find(path("ro.safetensors")) != std::string::npos &&
                            message.find("Permission denied") != std::string::npos;
      std::_Exit(expected ? 0 : 1);
    }
    std::_Exit(2);
  };
  EXPECT_EXIT(attempt(), ::testing::ExitedWithCode(0), "Permission denied");
  EXPECT_EQ(file_contents(path("ro.safetensors")), before);
}

// Issue 13: as strict as the reference reader (the `safetensors` package 0.6.2, whose verdict on
// each of these files is checked in tests/cli/test_safetensors_strict.py).
constexpr const char* kA = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
constexpr const char* kB = R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]})";

TEST_F(SafetensorsTest, RejectsTrailingBytesAfterTheData) {
  const std::string header = std::string("{") + kA + "," + kB + "}";
  const std::string p = write_file("trailing.safetensors", header, std::string(17, 'x'));
  expect_error([&] { SafetensorsReader::open(p); }, {p, "1 trailing bytes"});
  const std::string q = write_file("empty_trailing.safetensors", "{}", "abc");
  expect_error([&] { SafetensorsReader::open(q); }, {q, "3 trailing bytes"});
}

TEST_F(SafetensorsTest, RejectsGapsBetweenTensors) {
  const std::string p = write_file(
      "gap.safetensors",
      std::string("{") + kA + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
      std::string(20, 'x'));
  expect_error([&] { SafetensorsReader::open(p); }, {p, "'b'", "starts at byte 12", "a gap"});
  const std::string q =
      write_file("late.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 std::string(12, 'x'));
  expect_error([&] { SafetensorsReader::open(q); }, {q, "'a'", "starts at byte 4"});
}

TEST_F(SafetensorsTest, RejectsNulPaddingAndTrailingGarbageInTheHeader) {
  const std::string body = std::string("{") + kA + "}";
  const std::string p =
      write_file("nul.safetensors", body + std::string(3, '\0'), std::string(8, 'x'));
  expect_error([&] { SafetensorsReader::open(p); }, {p, "NUL byte at offset"});
  const std::string q = write_file("garbage.safetensors", body + "x", std::string(8, 'x'));
  expect_error([&] { SafetensorsReader::open(q); }, {q, "malformed JSON header"});
}

TEST_F(SafetensorsTest, RejectsDuplicateKeys) {
  const std::string p =
      write_file("dup.safetensors", std::string("{") + kA + "," + kA + "}", std::string(8, 'x'));
  expect_error([&] { SafetensorsReader::open(p); }, {p, "key 'a' twice"});
  const std::string q = write_file("dup_meta.safetensors",
                                   std::string(R"({"__metadata__":{"k":"1","k":"2"},)") + kA + "}",
                                   std::string(8, 'x'));
  expect_error([&] { SafetensorsReader::open(q); }, {q, "key 'k' twice"});
}

TEST_F(SafetensorsTest, AcceptsWhatTheReferenceAccepts) {
  // Whitespace around the JSON, no 8-byte padding, __metadata__ null, unknown entry fields, an F32
  // tensor at an odd offset, empty tensors anywhere inside the buffer.
  const std::string body = std::string("{") + kA + "," + kB + "}";
  for (const std::string& header : {" \t\n" + body + " \n", body + "  "}) {
    const std::string p = write_file("ws.safetensors", header, std::string(16, 'x'));
    EXPECT_EQ(SafetensorsReader::open(p).names(), (std::vector<std::string>{"a", "b"}));
  }
  const std::string q =
      write_file("misc.safetensors",
                 R"({"__metadata__":null,"u":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                 R"("f":{"dtype":"F32","shape":[1],"data_offsets":[1,5],"extra":1},)"
                 R"("e":{"dtype":"F32","shape":[0],"data_offsets":[1,1]}})",
                 std::string(5, '\0'));
  const SafetensorsReader r = SafetensorsReader::open(q);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"e", "f", "u"}));
  EXPECT_EQ(r.read_f32("f"), (std::vector<float>{0.0f}));
}

TEST_F(SafetensorsTest, RejectsHeadersOverTheFormatLimit) {
  const uint64_t n = 100'000'001;
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  const std::string p = write_raw("huge.safetensors", bytes + "{}");
  expect_error([&] { SafetensorsReader::open(p); }, {p, "header length 100000001", "limit"});
}

TEST_F(SafetensorsTest, ControlCharactersInNamesAreEscaped) {
  const std::string p = write_file(
      "ctrl.safetensors", R"({"a\nb\r\u0001":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})",
      std::string(4, 'x'));
  expect_error([&] { SafetensorsReader::open(p); }, {"'a\\nb\\r\\x01'", "F33"});
}

TEST_F(SafetensorsTest, ReadsFromBytesInMemory) {
  const std::string header = std::string("{") + kA + "}";
  const uint64_t n = header.size();
  std::string bytes = std::string(reinterpret_cast<const char*>(&n), 8) + header;
  bytes += std::string(8, '\0');
  std::vector<std::byte> buffer(bytes.size());
  std::memcpy(buffer.data(), bytes.data(), bytes.size());
  const SafetensorsReader r = SafetensorsReader::from_bytes(std::move(buffer), "<memory>");
  EXPECT_EQ(r.read_f32("a"), (std::vector<float>{0.0f, 0.0f}));
  expect_error([] { SafetensorsReader::from_bytes({}, "<memory>"); }, {"<memory>", "8-byte"});
}

TEST_F(SafetensorsTest, TensorPartsErrorsCarryTheCallersTagAndNameTheIndex) {
  // Two parts and their index, as transformers shards a model.
  const float x = 1.0f, y = 2.0f;
  for (const auto& [name, value, index] : {std::tuple{"x", &x, 0}, std::tuple{"y", &y, 1}}) {
    SafetensorsWriter writer;
    writer.add_f32(name, {1}, value);
    writer.write(path(part_file_name("model", index, 2)));
  }
  write_part_index(dir_.string(), "model",
                   {{"x", part_file_name("model", 0, 2)}, {"y", part_file_name("model", 1, 2)}}, 8);
  const std::string index = path("model.safetensors.index.json");
  const std::string second = path("model-00002-of-00002.safetensors");
  EXPECT_EQ(TensorParts::open(dir_.string(), "model", "[import]").file_of("y"), second);
  // The index lists a part that is not there: the index, the tensor and the part, one line.
  fs::rename(second, path("moved"));
  expect_error(
      [&] { TensorParts::open(dir_.string(), "model", "[import]"); },
      {"[import] " + index + ": weight_map puts tensor 'y' in " + second, "does not exist"});
  // A part that is not safetensors: its own error, with the caller's tag.
  write_raw("model-00002-of-00002.safetensors", "abc");
  expect_error([&] { TensorParts::open(dir_.string(), "model", "[import]"); },
               {"[import] " + second + ": file is 3 bytes"});
  write_raw("model.safetensors.index.json", "{");
  expect_error([&] { TensorParts::open(dir_.string(), "model", "[checkpoint]"); },
               {"[checkpoint] " + index + ": malformed index"});
}

}  // namespace
}  // namespace moecore::io
