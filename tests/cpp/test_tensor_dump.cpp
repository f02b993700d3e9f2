// The dump format of `moecore dump` (io/tensor_dump.h): what is written reads back in execution
// order with its phases, kinds, shapes, values and run identity; an incomplete or inconsistent
// directory is a one-line error naming the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "core/check.h"
#include "io/file_util.h"
#include "io/tensor_dump.h"
#include "scratch_dir.h"

namespace moecore::io {
namespace {

namespace fs = std::filesystem;

class TensorDumpTest : public ::testing::Test {
 protected:
  void TearDown() override { set_write_failure_for_testing(-1); }

  // Names out of alphabetical order, so that the order can only come from the manifest.
  static TensorDump sample() {
    TensorDump dump;
    dump.run = {{"precision", "bf16"}, {"backend", "cpu"}};
    dump.tensors.push_back({"model.embed_tokens", "forward", false, {2, 3}, {1, 2, 3, 4, 5, 6}});
    dump.tensors.push_back({"model.layers.0.mlp.topk_index", "forward", true, {2, 1}, {3, 0}});
    dump.tensors.push_back({"loss.total", "forward", false, {}, {2.5f}});
    dump.tensors.push_back({"grad.lm_head", "backward", false, {3}, {-1, 0, 1}});
    return dump;
  }

  std::string expect_error(const std::string& dir) const {
    try {
      read_tensor_dump(dir);
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      return message;
    }
    ADD_FAILURE() << "reading " << dir << " did not fail";
    return "";
  }

  ScratchDir scratch_{"moecore_dump"};
  const fs::path root_ = scratch_.path();
};

TEST_F(TensorDumpTest, RoundTripKeepsExecutionOrderKindsAndIdentity) {
  const TensorDump written = sample();
  const std::string dir = (root_ / "dump").string();
  write_tensor_dump(written, dir);
  const TensorDump read = read_tensor_dump(dir);
  EXPECT_EQ(read.run, written.run);
  ASSERT_EQ(read.tensors.size(), written.tensors.size());
  for (size_t i = 0; i < written.tensors.size(); ++i) {
    EXPECT_EQ(read.tensors[i].name, written.tensors[i].name);
    EXPECT_EQ(read.tensors[i].phase, written.tensors[i].phase);
    EXPECT_EQ(read.tensors[i].index, written.tensors[i].index);
    EXPECT_EQ(read.tensors[i].shape, written.tensors[i].shape);
    EXPECT_EQ(read.tensors[i].values, written.tensors[i].values);
  }
}

TEST_F(TensorDumpTest, RefusesANonEmptyOutputDirectory) {
  const std::string dir = (root_ / "dump").string();
  write_tensor_dump(sample(), dir);
  EXPECT_THROW(write_tensor_dump(sample(), dir), Error);
}

TEST_F(TensorDumpTest, AFailedWriteLeavesNothingARerunTakesForADump) {
  // A full disk (the writers' injected ENOSPC; root ignores permissions) while the tensors are
  // written, then while the manifest after them is: neither leaves a directory at --out, nor
  // its staging sibling, and the rerun writes a complete dump there.
  write_tensor_dump(sample(), (root_ / "whole").string());
  const auto tensors_bytes =
      static_cast<int64_t>(fs::file_size(root_ / "whole" / "tensors.safetensors"));
  fs::remove_all(root_ / "whole");
  const std::string dir = (root_ / "dump").string();
  for (const int64_t budget : {int64_t{10}, tensors_bytes + 10}) {
    SCOPED_TRACE(budget);
    set_write_failure_for_testing(budget);
    try {
      write_tensor_dump(sample(), dir);
      ADD_FAILURE() << "the write did not fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos)
          << e.what();
    }
    set_write_failure_for_testing(-1);
    EXPECT_TRUE(fs::is_empty(root_)) << "left " << fs::directory_iterator(root_)->path();
  }
  write_tensor_dump(sample(), dir);
  EXPECT_EQ(read_tensor_dump(dir).tensors.size(), sample().tensors.size());
}

// An existing empty --out (made for the run, a link to one, a mount point) is written into, not
// replaced: the link stays a link and the dump lands where it points. A failed write there takes
// back what it wrote and leaves the directory empty.
TEST_F(TensorDumpTest, AnExistingEmptyDirectoryIsWrittenIntoThroughALink) {
  fs::create_directories(root_ / "target");
  fs::create_directory_symlink(root_ / "target", root_ / "link");
  const auto tensors_bytes = [&] {
    write_tensor_dump(sample(), (root_ / "whole").string());
    return static_cast<int64_t>(fs::file_size(root_ / "whole" / "tensors.safetensors"));
  }();
  for (const int64_t budget : {int64_t{10}, tensors_bytes + 10}) {
    SCOPED_TRACE(budget);
    set_write_failure_for_testing(budget);
    EXPECT_THROW(write_tensor_dump(sample(), (root_ / "link").string()), Error);
    set_write_failure_for_testing(-1);
    EXPECT_TRUE(fs::is_symlink(root_ / "link"));
    EXPECT_TRUE(fs::is_empty(root_ / "target"));
  }
  write_tensor_dump(sample(), (root_ / "link").string());
  EXPECT_TRUE(fs::is_symlink(root_ / "link"));
  EXPECT_EQ(read_tensor_dump((root_ / "target").string()).tensors.size(), sample().tensors.size());
}

TEST_F(TensorDumpTest, InconsistentDirectoriesAreOneLineErrorsNamingTheTensor) {
  EXPECT_NE(expect_error((root_ / "absent").string()).find("not a directory"), std::string::npos);

  const std::string dir = (root_ / "dump").string();
  write_tensor_dump(sample(), dir);
  const std::string manifest = (fs::path(dir) / "manifest.json").string();
  const nlohmann::json good = nlohmann::json::parse(read_text(manifest, "[test]"));
  auto with_manifest = [&](const auto& edit) {
    nlohmann::json changed = good;
    edit(changed);
    write_text_atomic(manifest, changed.dump(), "[test]");
    return expect_error(dir);
  };
  auto last = [](nlohmann::json& m) -> nlohmann::json& { return m["tensors"].back(); };
  // A listed tensor the safetensors file lacks; one it holds but the manifest does not list; a
  // shape that disagrees; another format; an unknown phase.
  EXPECT_NE(with_manifest([&](nlohmann::json& m) {
              last(m)["name"] = "grad.lm_head_";
            }).find("grad.lm_head_"),
            std::string::npos);
  EXPECT_NE(
      with_manifest([](nlohmann::json& m) { m["tensors"].erase(0); }).find("model.embed_tokens"),
      std::string::npos);
  EXPECT_NE(with_manifest([&](nlohmann::json& m) { last(m)["shape"] = {4}; }).find("grad.lm_head"),
            std::string::npos);
  EXPECT_NE(with_manifest([](nlohmann::json& m) { m["format"] = "other"; }).find("format"),
            std::string::npos);
  EXPECT_NE(
      with_manifest([&](nlohmann::json& m) { last(m)["phase"] = "sideways"; }).find("sideways"),
      std::string::npos);
  write_text_atomic(manifest, "{not json", "[test]");
  EXPECT_NE(expect_error(dir).find("not valid JSON"), std::string::npos);
  fs::remove(manifest);
  EXPECT_NE(expect_error(dir).find("manifest.json"), std::string::npos);
}

}  // namespace
}  // namespace moecore::io
