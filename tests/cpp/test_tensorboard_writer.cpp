#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "io/tensorboard_writer.h"
#include "scratch_dir.h"

namespace moecore::io {
namespace {

namespace fs = std::filesystem;

static_assert(std::is_move_constructible_v<TensorBoardWriter> &&
              std::is_move_assignable_v<TensorBoardWriter>);
static_assert(!std::is_copy_constructible_v<TensorBoardWriter> &&
              !std::is_copy_assignable_v<TensorBoardWriter>);

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

// ---- A tiny TFRecord + protobuf reader, independent of the writer's code.

uint64_t read_le(const std::string& s, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<unsigned char>(s[at + i])} << (8 * i);
  return v;
}

// Splits a TFRecord file into its records, checking both masked CRCs.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  size_t at = 0;
  while (at < file.size()) {
    EXPECT_LE(at + 12, file.size()) << "truncated record header";
    if (at + 12 > file.size()) break;
    const uint64_t length = read_le(file, at, 8);
    EXPECT_EQ(read_le(file, at + 8, 4), masked_crc32c(bytes_of(file.substr(at, 8))));
    EXPECT_LE(at + 12 + length + 4, file.size()) << "truncated record";
    if (at + 12 + length + 4 > file.size()) break;
    std::string data = file.substr(at + 12, length);
    EXPECT_EQ(read_le(file, at + 12 + length, 4), masked_crc32c(bytes_of(data)));
    records.push_back(std::move(data));
    at += 12 + length + 4;
  }
  return records;
}

struct Field {
  uint32_t number = 0;
  uint32_t wire_type = 0;
  uint64_t scalar = 0;  // varint, fixed64 or fixed32
  std::string bytes;    // length-delimited
};

uint64_t read_varint(const std::string& s, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0; at < s.size() && shift < 64; shift += 7) {
    const auto b = static_cast<unsigned char>(s[at++]);
    v |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) return v;
  }
  ADD_FAILURE() << "bad varint";
  return v;
}

std::vector<Field> parse_message(const std::string& s) {
  std::vector<Field> fields;
  size_t at = 0;
  while (at < s.size()) {
    const uint64_t key = read_varint(s, at);
    Field f;
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire_type = static_cast<uint32_t>(key & 7);
    switch (f.wire_type) {
      case 0:
        f.scalar = read_varint(s, at);
        break;
      case 1:
        f.scalar = read_le(s, at, 8);
        at += 8;
        break;
      case 5:
        f.scalar = read_le(s, at, 4);
        at += 4;
        break;
      case 2: {
        const uint64_t n = read_varint(s, at);
        f.bytes = s.substr(at, n);
        at += n;
        break;
      }
      default:
        ADD_FAILURE() << "unexpected wire type " << f.wire_type;
        return fields;
    }
    fields.push_back(std::move(f));
  }
  EXPECT_EQ(at, s.size());
  return fields;
}

const Field* find_field(const std::vector<Field>& fields, uint32_t number) {
  for (const Field& f : fields)
    if (f.number == number) return &f;
  return nullptr;
}

// The tensorflow.Event fields this writer produces.
struct DecodedEvent {
  double wall_time = 0.0;
  int64_t step = 0;
  std::optional<std::string> file_version;
  std::optional<std::string> tag;
  std::optional<float> simple_value;
  std::optional<int64_t> session_status;
};

DecodedEvent decode_event(const std::string& record) {
  DecodedEvent e;
  const std::vector<Field> fields = parse_message(record);
  for (const Field& f : fields) {
    switch (f.number) {
      case 1:
        EXPECT_EQ(f.wire_type, 1u);
        e.wall_time = std::bit_cast<double>(f.scalar);
        break;
      case 2:
        EXPECT_EQ(f.wire_type, 0u);
        e.step = static_cast<int64_t>(f.scalar);
        break;
      case 3:
        EXPECT_EQ(f.wire_type, 2u);
        e.file_version = f.bytes;
        break;
      case 5: {  // Summary { repeated Value value = 1; }
        EXPECT_EQ(f.wire_type, 2u);
        const std::vector<Field> summary = parse_message(f.bytes);
        EXPECT_EQ(summary.size(), 1u);
        const Field* value = find_field(summary, 1);
        if (value == nullptr) {
          ADD_FAILURE() << "summary without value";
          break;
        }
        const std::vector<Field> v = parse_message(value->bytes);
        if (const Field* tag = find_field(v, 1)) e.tag = tag->bytes;
        if (const Field* sv = find_field(v, 2)) {
          EXPECT_EQ(sv->wire_type, 5u);
          e.simple_value = std::bit_cast<float>(static_cast<uint32_t>(sv->scalar));
        }
        break;
      }
      case 7: {  // SessionLog { SessionStatus status = 1; }
        const std::vector<Field> log = parse_message(f.bytes);
        const Field* status = find_field(log, 1);
        e.session_status = status ? static_cast<int64_t>(status->scalar) : 0;
        break;
      }
      default:
        ADD_FAILURE() << "unexpected Event field " << f.number;
    }
  }
  return e;
}

class TensorBoardWriterTest : public ::testing::Test {
 protected:
  std::vector<std::string> event_files(const fs::path& dir) const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  ScratchDir scratch_{"moecore_tb"};
  const fs::path dir_ = scratch_.path();
};

// ---- CRC-32C

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(crc32c(bytes_of("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c(bytes_of("")), 0x00000000u);
  EXPECT_EQ(crc32c(bytes_of("a")), 0xC1D04330u);
  // RFC 3720, B.4.
  EXPECT_EQ(crc32c(bytes_of(std::string(32, '\0'))), 0x8A9136AAu);
  EXPECT_EQ(crc32c(bytes_of(std::string(32, '\xff'))), 0x62A8AB43u);
  std::string ascending;
  std::string descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc32c(bytes_of(ascending)), 0x46DD794Eu);
  EXPECT_EQ(crc32c(bytes_of(descending)), 0x113FDB5Cu);
}

TEST(Crc32cTest, MaskIsTheTfRecordRotateAndAdd) {
  const uint32_t crc = 0xE3069283u;
  const uint32_t masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
  EXPECT_EQ(masked_crc32c(bytes_of("123456789")), masked);
  // Unmasking (as TensorFlow's reader does) gives the CRC back.
  const uint32_t rot = masked - 0xa282ead8u;
  EXPECT_EQ((rot >> 17) | (rot << 15), crc);
}

// ---- Event files

TEST_F(TensorBoardWriterTest, FileNameAndFirstEvent) {
  const fs::path log_dir = dir_ / "a" / "b";  // parents are created
  const double before = static_cast<double>(::time(nullptr));
  std::string path;
  {
    TensorBoardWriter writer(log_dir.string());
    path = writer.path();
    // The first event is already visible, before any flush.
    const std::vector<std::string> records = read_records(path);
    ASSERT_EQ(records.size(), 1u);
  }
  const std::string name = fs::path(path).filename().string();
  const std::string prefix = "events.out.tfevents.";
  ASSERT_EQ(name.rfind(prefix, 0), 0u) << name;
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  const std::string suffix = "." + std::string(host) + "." + std::to_string(::getpid()) + ".0";
  ASSERT_GE(name.size(), suffix.size());
  EXPECT_EQ(name.substr(name.size() - suffix.size()), suffix) << name;
  const std::string seconds =
      name.substr(prefix.size(), name.size() - suffix.size() - prefix.size());
  EXPECT_NEAR(std::stod(seconds), before, 5.0) << name;

  const std::vector<std::string> records = read_records(path);
  ASSERT_EQ(records.size(), 1u);
  const DecodedEvent first = decode_event(records[0]);
  EXPECT_EQ(first.file_version, "brain.Event:2");
  EXPECT_EQ(first.step, 0);
  EXPECT_NEAR(first.wall_time, before, 5.0);
}

TEST_F(TensorBoardWriterTest, ScalarsRoundTrip) {
  std::string path;
  {
    TensorBoardWriter writer(dir_.string());
    path = writer.path();
    writer.add_scalar("train/loss", 5.5, 1);
    writer.add_scalar("train/lr", 1e-3, 1);
    writer.add_scalar("train/loss", 4.25, 2);
    writer.add_scalar("train/grad_norm", std::numeric_limits<double>::quiet_NaN(), 3);
    writer.add_scalar("train/z", std::numeric_limits<double>::infinity(), 3);
    writer.add_scalar("big/step", -2.0, int64_t{1} << 40);
    writer.add_scalar("neg/step", 7.0, -5);
    writer.add_session_start(17);
    writer.flush();
    EXPECT_EQ(read_records(path).size(), 9u);  // visible after flush, before close
    writer.close();
    writer.close();  // a no-op
    EXPECT_FALSE(writer.is_open());
  }
  const std::vector<std::string> records = read_records(path);
  ASSERT_EQ(records.size(), 9u);
  struct Expected {
    const char* tag;
    float value;
    int64_t step;
  };
  const Expected expected[] = {{"train/loss", 5.5f, 1},
                               {"train/lr", 1e-3f, 1},
                               {"train/loss", 4.25f, 2},
                               {"train/grad_norm", std::numeric_limits<float>::quiet_NaN(), 3},
                               {"train/z", std::numeric_limits<float>::infinity(), 3},
                               {"big/step", -2.0f, int64_t{1} << 40},
                               {"neg/step", 7.0f, -5}};
  for (size_t i = 0; i < std::size(expected); ++i) {
    SCOPED_TRACE(expected[i].tag);
    const DecodedEvent e = decode_event(records[i + 1]);
    EXPECT_EQ(e.tag, expected[i].tag);
    EXPECT_EQ(e.step, expected[i].step);
    ASSERT_TRUE(e.simple_value.has_value());
    if (std::isnan(expected[i].value)) {
      EXPECT_TRUE(std::isnan(*e.simple_value));
    } else {
      EXPECT_EQ(*e.simple_value, expected[i].value);
    }
    EXPECT_FALSE(e.file_version.has_value());
    EXPECT_GT(e.wall_time, 1.6e9);
  }
  const DecodedEvent start = decode_event(records[8]);
  EXPECT_EQ(start.step, 17);
  EXPECT_EQ(start.session_status, 1);  // SessionLog.START
  EXPECT_FALSE(start.tag.has_value());
}

TEST_F(TensorBoardWriterTest, SecondWriterInTheSameSecondGetsANewFile) {
  TensorBoardWriter a(dir_.string());
  TensorBoardWriter b(dir_.string());
  TensorBoardWriter c(dir_.string());
  EXPECT_NE(a.path(), b.path());
  EXPECT_NE(b.path(), c.path());
  EXPECT_NE(a.path(), c.path());
  EXPECT_EQ(event_files(dir_).size(), 3u);
}

TEST_F(TensorBoardWriterTest, MoveKeepsTheFile) {
  TensorBoardWriter a(dir_.string());
  const std::string path = a.path();
  TensorBoardWriter b(std::move(a));
  b.add_scalar("x", 1.0, 1);
  TensorBoardWriter c(dir_.string());
  c = std::move(b);  // closes c's own file first
  c.add_scalar("x", 2.0, 2);
  c.close();
  EXPECT_EQ(c.path(), path);
  EXPECT_EQ(read_records(path).size(), 3u);
}

TEST_F(TensorBoardWriterTest, UnwritableLogDirIsAOneLineError) {
  // A regular file where a directory should be: fails even for root.
  const fs::path blocker = dir_ / "not_a_dir";
  std::ofstream(blocker) << "x";
  const std::string log_dir = (blocker / "tb").string();
  try {
    TensorBoardWriter writer(log_dir);
    FAIL() << "expected moecore::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("[tensorboard]"), std::string::npos) << msg;
    EXPECT_NE(msg.find(log_dir), std::string::npos) << msg;
    EXPECT_NE(msg.find("Not a directory"), std::string::npos) << msg;
  }
}

TEST_F(TensorBoardWriterTest, UseAfterCloseAndEmptyTagAreErrors) {
  TensorBoardWriter writer(dir_.string());
  EXPECT_THROW(writer.add_scalar("", 1.0, 1), Error);
  writer.close();
  try {
    writer.add_scalar("x", 1.0, 1);
    FAIL() << "expected moecore::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(writer.path()), std::string::npos) << e.what();
  }
  EXPECT_THROW(writer.flush(), Error);
}

TEST_F(TensorBoardWriterTest, DirectoryThatCannotBeCreatedIsAnError) {
  // /proc refuses new directories, for root too.
  if (!fs::exists("/proc/self")) GTEST_SKIP() << "no /proc";
  try {
    TensorBoardWriter writer("/proc/self/moecore_tb");
    FAIL() << "expected moecore::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("/proc/self/moecore_tb"), std::string::npos) << msg;
  }
}

// RLIMIT_FSIZE makes writes past a size fail with EFBIG, like a full disk, even for root.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &previous_);
    rlimit limit = previous_;
    limit.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &previous_);
    std::signal(SIGXFSZ, previous_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit previous_{};
  void (*previous_handler_)(int) = nullptr;
};

TEST_F(TensorBoardWriterTest, FailedWriteIsAnErrorNamingTheFile) {
  TensorBoardWriter writer(dir_.string());
  const FileSizeLimit limit(16384);
  try {
    for (int64_t step = 1; step <= 100000; ++step) {
      writer.add_scalar("train/loss", 1.0, step);
      if (step % 100 == 0) writer.flush();
    }
    FAIL() << "expected moecore::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find(writer.path()), std::string::npos) << msg;
    EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace moecore::io
