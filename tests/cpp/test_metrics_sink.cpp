#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "io/metrics_sink.h"
#include "scratch_dir.h"

namespace moecore::io {
namespace {

namespace fs = std::filesystem;

static_assert(std::is_move_constructible_v<MetricsSink> && std::is_move_assignable_v<MetricsSink>);
static_assert(!std::is_copy_constructible_v<MetricsSink> &&
              !std::is_copy_assignable_v<MetricsSink>);

class MetricsSinkTest : public ::testing::Test {
 protected:
  std::string jsonl() const { return (dir_ / "metrics.jsonl").string(); }

  std::string read_text() const {
    std::ifstream in(jsonl(), std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  // Every line parsed as JSON; fails the test on a line that does not parse.
  std::vector<nlohmann::json> read_lines() const {
    std::vector<nlohmann::json> lines;
    std::istringstream in(read_text());
    std::string line;
    while (std::getline(in, line)) {
      EXPECT_TRUE(nlohmann::json::accept(line)) << line;
      lines.push_back(nlohmann::json::parse(line));
    }
    return lines;
  }

  std::vector<int64_t> steps() const {
    std::vector<int64_t> s;
    for (const auto& j : read_lines()) s.push_back(j.at("step").get<int64_t>());
    return s;
  }

  size_t tb_files() const {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir_ / "tb")) {
      EXPECT_EQ(e.path().filename().string().rfind("events.out.tfevents.", 0), 0u);
      ++n;
    }
    return n;
  }

  ScratchDir scratch_{"moecore_metrics"};
  fs::path dir_ = scratch_.path();  // a test may move it into a subdirectory
};

TEST_F(MetricsSinkTest, LinesParseBackAsJson) {
  {
    MetricsSink sink((dir_ / "run").string());
    EXPECT_EQ(sink.jsonl_path(), (dir_ / "run" / "metrics.jsonl").string());
  }
  dir_ /= "run";
  {
    MetricsSink sink(dir_.string());
    sink.log(1, {{"train/loss", 5.5}, {"train/lr", 1e-3}});
    sink.log(2, {{"train/loss", 0.1 + 0.2}, {"val/ppl", 123456789.125}});
    sink.log(3, {{"train/loss", std::numeric_limits<double>::quiet_NaN()},
                 {"train/grad_norm", std::numeric_limits<double>::infinity()},
                 {"train/z", -std::numeric_limits<double>::infinity()}});
    sink.log(4, {});
    // Each line is on disk as soon as log() returns: no flush, no close.
    EXPECT_EQ(read_lines().size(), 4u);
  }
  const std::string text = read_text();
  EXPECT_EQ(text.rfind("{\"step\":1,\"train/loss\":5.5,\"train/lr\":0.001}\n", 0), 0u) << text;
  const std::vector<nlohmann::json> lines = read_lines();
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].at("step"), 1);
  EXPECT_EQ(lines[0].at("train/loss").get<double>(), 5.5);
  EXPECT_EQ(lines[0].at("train/lr").get<double>(), 1e-3);
  EXPECT_EQ(lines[1].at("train/loss").get<double>(), 0.1 + 0.2);  // bit-exact round trip
  EXPECT_EQ(lines[1].at("val/ppl").get<double>(), 123456789.125);
  // NaN and +-Inf are written as null.
  EXPECT_TRUE(lines[2].at("train/loss").is_null());
  EXPECT_TRUE(lines[2].at("train/grad_norm").is_null());
  EXPECT_TRUE(lines[2].at("train/z").is_null());
  EXPECT_EQ(lines[3], (nlohmann::json{{"step", 4}}));
  EXPECT_EQ(tb_files(), 2u);  // one per MetricsSink opened
}

TEST_F(MetricsSinkTest, ReopenAppends) {
  {
    MetricsSink sink(dir_.string());
    sink.log(1, {{"train/loss", 3.0}});
    sink.log(2, {{"train/loss", 2.0}});
  }
  {
    MetricsSink sink(dir_.string());
    sink.log(3, {{"train/loss", 1.0}});
    sink.close();
    EXPECT_THROW(sink.log(4, {{"train/loss", 1.0}}), Error);
  }
  EXPECT_EQ(steps(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(tb_files(), 2u);  // one event file per writer; TensorBoard merges them
}

TEST_F(MetricsSinkTest, ReopenDropsATornLastLine) {
  {
    MetricsSink sink(dir_.string());
    sink.log(1, {{"train/loss", 3.0}});
  }
  std::ofstream(jsonl(), std::ios::app) << "{\"step\":2,\"train/lo";  // killed mid-line
  {
    MetricsSink sink(dir_.string());
    sink.log(2, {{"train/loss", 2.0}});
  }
  EXPECT_EQ(steps(), (std::vector<int64_t>{1, 2}));
}

TEST_F(MetricsSinkTest, ResumeKeepsOnlyStepsUpToTheCheckpoint) {
  {
    MetricsSink sink(dir_.string());
    for (int64_t step = 1; step <= 8; ++step) sink.log(step, {{"train/loss", 1.0 / step}});
    sink.log(8, {{"val/loss", 0.5}});
  }
  std::ofstream(jsonl(), std::ios::app) << "{\"step\":9,";  // and a torn line
  {
    MetricsSink sink(dir_.string(), /*resume_step=*/5);  // the checkpoint was at step 5
    EXPECT_EQ(steps(), (std::vector<int64_t>{1, 2, 3, 4, 5}));
    sink.log(6, {{"train/loss", 0.25}});
  }
  EXPECT_EQ(steps(), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(read_lines().back().at("train/loss").get<double>(), 0.25);
  // The lines kept are byte-identical to what was written.
  EXPECT_EQ(
      read_text().rfind("{\"step\":1,\"train/loss\":1.0}\n{\"step\":2,\"train/loss\":0.5}\n", 0),
      0u);
  // No temporary left behind by the atomic rewrite.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"metrics.jsonl", "tb"}));
}

TEST_F(MetricsSinkTest, FreshRunInAnOldDirectoryIsResumeFromZero) {
  {
    MetricsSink sink(dir_.string());
    sink.log(1, {{"train/loss", 3.0}});
  }
  MetricsSink sink(dir_.string(), 0);
  EXPECT_EQ(read_text(), "");
  sink.log(1, {{"train/loss", 2.0}});
  EXPECT_EQ(steps(), (std::vector<int64_t>{1}));
}

TEST_F(MetricsSinkTest, TruncateAfterOnAMissingFileIsANoOp) {
  MetricsSink::truncate_after(jsonl(), 3);
  EXPECT_FALSE(fs::exists(jsonl()));
  MetricsSink sink(dir_.string(), 3);  // resume with no metrics yet
  sink.log(4, {{"a", 1.0}});
  EXPECT_EQ(steps(), (std::vector<int64_t>{4}));
}

TEST_F(MetricsSinkTest, CorruptLineIsAnErrorNamingFileAndLine) {
  std::ofstream(jsonl()) << "{\"step\":1}\nnot json\n{\"step\":3}\n";
  try {
    MetricsSink::truncate_after(jsonl(), 2);
    FAIL() << "expected moecore::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(jsonl() + ":2"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_EQ(read_text(), "{\"step\":1}\nnot json\n{\"step\":3}\n");  // untouched
}

TEST_F(MetricsSinkTest, BadNamesAreErrors) {
  MetricsSink sink(dir_.string());
  EXPECT_THROW(sink.log(1, {{"step", 1.0}}), Error);
  EXPECT_THROW(sink.log(1, {{"", 1.0}}), Error);
  EXPECT_THROW(sink.log(1, {{"a", 1.0}, {"a", 2.0}}), Error);
  EXPECT_EQ(read_text(), "");  // nothing written by a rejected call
}

TEST_F(MetricsSinkTest, UnwritableDirectoryIsAOneLineError) {
  const fs::path blocker = dir_ / "file";
  std::ofstream(blocker) << "x";
  const std::string dir = (blocker / "run").string();
  try {
    MetricsSink sink(dir);
    FAIL() << "expected moecore::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find(dir), std::string::npos) << msg;
    EXPECT_NE(msg.find("Not a directory"), std::string::npos) << msg;
  }
}

TEST_F(MetricsSinkTest, MoveKeepsWriting) {
  MetricsSink a(dir_.string());
  a.log(1, {{"x", 1.0}});
  MetricsSink b(std::move(a));
  b.log(2, {{"x", 2.0}});
  MetricsSink c((dir_ / "other").string());
  c = std::move(b);
  c.log(3, {{"x", 3.0}});
  EXPECT_EQ(steps(), (std::vector<int64_t>{1, 2, 3}));
}

TEST_F(MetricsSinkTest, FailedWriteIsAnErrorNamingTheFile) {
  {
    std::ofstream out(jsonl());  // 900 bytes already there: metrics.jsonl reaches the limit first
    for (int i = 0; i < 100; ++i) out << "{\"step\":0}\n";
  }
  MetricsSink sink(dir_.string());
  // RLIMIT_FSIZE: writes past 1000 bytes fail with EFBIG, like a full disk, even for root.
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit previous{};
  ::getrlimit(RLIMIT_FSIZE, &previous);
  rlimit limit = previous;
  limit.rlim_cur = 1000;
  ::setrlimit(RLIMIT_FSIZE, &limit);
  std::string message;
  try {
    for (int64_t step = 1; step <= 1000; ++step) sink.log(step, {{"train/loss", 1.0}});
  } catch (const Error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &previous);
  std::signal(SIGXFSZ, previous_handler);
  EXPECT_NE(message.find(jsonl()), std::string::npos) << message;
  EXPECT_NE(message.find("File too large"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const auto& line : read_lines()) EXPECT_TRUE(line.contains("step"));  // no torn line
}

}  // namespace
}  // namespace moecore::io
