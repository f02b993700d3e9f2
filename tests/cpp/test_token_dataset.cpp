#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/instance_order.h"
#include "data/npy.h"
#include "data/numpy_shuffle.h"
#include "data/token_dataset.h"
#include "scratch_dir.h"

namespace moecore::data {
namespace {

namespace fs = std::filesystem;

// ---- InstanceOrder
// -------------------------------------------------------------------------------

TEST(SplitMix64Test, MatchesTheReferenceStream) {
  // First outputs of the reference SplitMix64 (Vigna's splitmix64.c) from state 0: pins the
  // generator itself, independently of how InstanceOrder seeds it.
  SplitMix64 rng(0);
  EXPECT_EQ(rng.next(), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(rng.next(), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(rng.next(), 0x06c45d188009454fULL);
}

TEST(SplitMix64Test, BoundedStaysInRange) {
  SplitMix64 rng(42);
  EXPECT_EQ(rng.bounded(1), 0u);
  const uint64_t huge = (uint64_t{1} << 63) + 1;  // Rejects almost half the raw draws.
  for (int i = 0; i < 1000; ++i) {
    EXPECT_LT(rng.bounded(7), 7u);
    EXPECT_LT(rng.bounded(huge), huge);
  }
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

TEST(InstanceOrderTest, EachEpochIsAPermutation) {
  for (const int64_t n : {1, 2, 7, 1000}) {
    const InstanceOrder order(3, n);
    for (uint64_t epoch = 0; epoch < 4; ++epoch) {
      std::vector<int64_t> p = order.permutation(epoch);
      std::sort(p.begin(), p.end());
      EXPECT_EQ(p, iota(n)) << "n=" << n << " epoch=" << epoch;
    }
  }
}

TEST(InstanceOrderTest, DiffersAcrossEpochsAndSeeds) {
  const InstanceOrder a(0, 100), b(1, 100);
  EXPECT_NE(a.permutation(0), a.permutation(1));
  EXPECT_NE(a.permutation(0), b.permutation(0));
  EXPECT_NE(a.permutation(0), iota(100));
  EXPECT_EQ(a.permutation(5), InstanceOrder(0, 100).permutation(5));
}

TEST(InstanceOrderTest, PinnedOrderIsPlatformIndependent) {
  // Hard-coded so that a change of generator, seeding or shuffle (which would silently change the
  // data order of resumed runs) fails here, on every platform.
  const InstanceOrder order(0, 10);
  EXPECT_EQ(order.permutation(0), (std::vector<int64_t>{8, 6, 4, 2, 0, 7, 9, 1, 5, 3}));
  EXPECT_EQ(order.permutation(1), (std::vector<int64_t>{9, 3, 8, 2, 6, 1, 7, 0, 4, 5}));
}

TEST(InstanceOrderTest, UnshuffledIsFileOrder) {
  InstanceOrder order(9, 5, /*shuffle=*/false);
  for (uint64_t c = 0; c < 12; ++c) EXPECT_EQ(order.instance_at(c), static_cast<int64_t>(c % 5));
}

TEST(InstanceOrderTest, ResumeFromAnyCursorContinuesTheSameSequence) {
  const int64_t n = 13;
  InstanceOrder straight(7, n);
  std::vector<int64_t> expected;
  for (uint64_t c = 0; c < 5 * n; ++c) expected.push_back(straight.instance_at(c));
  for (uint64_t start = 0; start < 5 * n; ++start) {
    InstanceOrder resumed(7, n);  // Fresh object: nothing cached from before the interruption.
    for (uint64_t c = start; c < 5 * n; ++c) {
      ASSERT_EQ(resumed.instance_at(c), expected[c]) << "resumed at " << start << ", cursor " << c;
    }
  }
  // Epochs are whole permutations laid end to end.
  for (uint64_t epoch = 0; epoch < 5; ++epoch) {
    const std::vector<int64_t> p = straight.permutation(epoch);
    EXPECT_TRUE(std::equal(p.begin(), p.end(), expected.begin() + static_cast<long>(epoch * n)));
  }
}

TEST(InstanceOrderTest, RejectsEmptyDataset) {
  EXPECT_THROW(InstanceOrder(0, 0), Error);
}

// ---- TokenDataset
// --------------------------------------------------------------------------------

class TokenDatasetTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  template <typename T>
  std::string npy(const std::string& name, const std::string& descr, std::vector<T> values) const {
    write_npy(path(name), descr, {static_cast<int64_t>(values.size())}, values.data());
    return path(name);
  }

  // OLMo-core / Dolma layout: the bare array, no header.
  template <typename T>
  std::string raw(const std::string& name, const std::vector<T>& values) const {
    std::ofstream out(path(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(values.data()),
              static_cast<std::streamsize>(values.size() * sizeof(T)));
    return path(name);
  }

  static std::vector<int32_t> instance(const TokenDataset& ds, int64_t i) {
    std::vector<int32_t> t(static_cast<size_t>(ds.seq_len()));
    ds.read_instance(i, t.data());
    return t;
  }

  static std::string error_of(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }

  ScratchDir scratch_{"moecore_tokens"};
  const fs::path dir_ = scratch_.path();
};

std::vector<uint16_t> range_u16(int first, int count) {
  std::vector<uint16_t> v;
  for (int i = 0; i < count; ++i) v.push_back(static_cast<uint16_t>(first + i));
  return v;
}

TEST_F(TokenDatasetTest, CutsInstancesPerFileAndDropsRemainders) {
  const std::string a = npy("a.npy", "<u2", range_u16(0, 10));  // 2 instances + 2
  const std::string b = npy("b.npy", "<u4", std::vector<uint32_t>{100, 101, 102, 103, 104});  // 1+1
  const std::string c = npy("c.npy", "<u2", range_u16(200, 3));                         // none
  const std::string d = npy("d.npy", "<i4", std::vector<int32_t>{300, 301, 302, 303});  // 1
  const TokenDataset ds = TokenDataset::open({a, b, c, d}, 4, 1000);
  EXPECT_EQ(ds.num_instances(), 4);
  EXPECT_EQ(ds.total_tokens(), 22);
  EXPECT_EQ(ds.instance_tokens(), 16);
  EXPECT_EQ(ds.num_files(), 4u);
  EXPECT_EQ(instance(ds, 0), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(instance(ds, 1), (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(instance(ds, 2), (std::vector<int32_t>{100, 101, 102, 103}));  // Not 8, 9, 100, 101.
  EXPECT_EQ(instance(ds, 3), (std::vector<int32_t>{300, 301, 302, 303}));
  EXPECT_THROW(instance(ds, 4), Error);

  std::vector<int32_t> tokens(4), targets(4);
  ds.read_example(1, tokens.data(), targets.data());
  EXPECT_EQ(tokens, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(targets, (std::vector<int32_t>{5, 6, 7, -100}));
}

TEST_F(TokenDatasetTest, DirectoriesExpandToSortedNpyFiles) {
  fs::create_directory(dir_ / "train");
  npy("train/part-00001.npy", "<u2", range_u16(10, 2));
  npy("train/part-00000.npy", "<u2", range_u16(0, 2));
  std::ofstream(path("train/README.txt")) << "not tokens";
  const TokenDataset ds = TokenDataset::open({path("train")}, 2, 100);
  ASSERT_EQ(ds.num_files(), 2u);
  EXPECT_EQ(fs::path(ds.file_path(0)).filename(), "part-00000.npy");
  EXPECT_EQ(instance(ds, 0), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(instance(ds, 1), (std::vector<int32_t>{10, 11}));

  fs::create_directory(dir_ / "empty");
  EXPECT_NE(error_of([&] { TokenDataset::open({path("empty")}, 2, 100); }).find("no .npy"),
            std::string::npos);
}

TEST_F(TokenDatasetTest, ReadsHeaderlessOlmoCoreFilesOfTheDeclaredType) {
  const std::string small = raw("olmo16.npy", range_u16(50, 6));
  const TokenDataset ds16 = TokenDataset::open({small}, 3, 50280, "uint16");
  EXPECT_EQ(ds16.num_instances(), 2);
  EXPECT_EQ(instance(ds16, 1), (std::vector<int32_t>{53, 54, 55}));
  EXPECT_EQ(ds16.file_dtype(0), "<u2");
  // uint32 with a vocabulary that fits uint16: the declaration decides, not the vocabulary.
  const std::string big = raw("olmo32.npy", std::vector<uint32_t>{100000, 7, 4, 1});
  const TokenDataset ds32 = TokenDataset::open({big}, 2, 200000, "uint32");
  EXPECT_EQ(instance(ds32, 0), (std::vector<int32_t>{100000, 7}));
  const std::string small_ids = raw("u32small.npy", std::vector<uint32_t>{5, 6, 7, 8});
  const TokenDataset narrow = TokenDataset::open({small_ids}, 2, 100, "uint32");
  EXPECT_EQ(narrow.num_instances(), 2);
  EXPECT_EQ(instance(narrow, 1), (std::vector<int32_t>{7, 8}));
  // Headered and headerless files mix; the header's type wins for its file.
  const std::string headered = npy("h.npy", "<u4", std::vector<uint32_t>{0, 1, 2});
  const TokenDataset mixed = TokenDataset::open({small, headered}, 3, 50280, "uint16");
  EXPECT_EQ(mixed.num_instances(), 3);
  EXPECT_EQ(instance(mixed, 2), (std::vector<int32_t>{0, 1, 2}));

  const std::string odd = raw("odd.npy", std::vector<uint8_t>{1, 2, 3});
  const std::string message = error_of([&] { TokenDataset::open({odd}, 1, 100, "uint16"); });
  EXPECT_NE(message.find("odd.npy"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  EXPECT_THROW(TokenDataset::open({small}, 3, 100, "float32"), Error);
}

TEST_F(TokenDatasetTest, UndeclaredHeaderlessFileIsAnErrorNotAGuess) {
  // Before: a headerless file was read as uint16 whenever the vocabulary fit, so this uint32 file
  // gave 8 tokens with zeros interleaved. Now the type must be declared or in meta.json.
  const std::string file = raw("u32.npy", std::vector<uint32_t>{5, 6, 7, 8});
  const std::string message = error_of([&] { TokenDataset::open({file}, 2, 100); });
  EXPECT_NE(message.find("u32.npy"), std::string::npos) << message;
  EXPECT_NE(message.find("unknown element type"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  // A meta.json that is not moecore's, or does not list the file, decides nothing.
  std::ofstream(path("meta.json")) << R"({"format": "something-else", "dtype": "uint32",
                                          "train": {"files": ["u32.npy"]}})";
  EXPECT_THROW(TokenDataset::open({file}, 2, 100), Error);
  std::ofstream(path("meta.json")) << R"({"format": "moecore-tokens", "dtype": "uint32",
                                          "eos_id": 3, "train": {"files": ["other.npy"]}})";
  EXPECT_THROW(TokenDataset::open({file}, 2, 100), Error);
  // One that lists it does.
  std::ofstream(path("meta.json")) << R"({"format": "moecore-tokens", "dtype": "uint32",
                                          "eos_id": 3, "train": {"files": ["u32.npy"]}})";
  const TokenDataset ds = TokenDataset::open({file}, 2, 100);
  EXPECT_EQ(ds.total_tokens(), 4);
  EXPECT_EQ(ds.metadata_eos_id(), 3);
  // A broken meta.json is reported, not skipped.
  std::ofstream(path("meta.json")) << "{not json";
  EXPECT_NE(error_of([&] { TokenDataset::open({file}, 2, 100); }).find("meta.json"),
            std::string::npos);
}

TEST_F(TokenDatasetTest, RejectsBadFilesWithOneLineErrors) {
  const auto expect_error = [&](const std::vector<std::string>& paths, int64_t vocab,
                                const std::string& needle) {
    const std::string message = error_of([&] { TokenDataset::open(paths, 2, vocab); });
    EXPECT_NE(message.find(needle), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  };

  // Truncated data: the header promises 8 tokens, 5 bytes of data remain.
  const std::string good = npy("trunc.npy", "<u2", range_u16(0, 8));
  fs::resize_file(good, fs::file_size(good) - 11);
  expect_error({good}, 100, "truncated");
  expect_error({good}, 100, "trunc.npy");

  const std::vector<uint16_t> grid = range_u16(0, 6);
  write_npy(path("grid.npy"), "<u2", {2, 3}, grid.data());
  expect_error({path("grid.npy")}, 100, "1-D");

  npy("float.npy", "<f4", std::vector<float>{1.0F, 2.0F});
  expect_error({path("float.npy")}, 100, "unsupported token dtype '<f4'");

  expect_error({path("missing.npy")}, 100, "missing.npy");
  expect_error({npy("short.npy", "<u2", range_u16(0, 1))}, 100, "no instance of seq_len=2");
}

TEST_F(TokenDatasetTest, OutOfVocabularyIdsAreReportedWhenRead) {
  const std::string file = npy("ids.npy", "<u2", std::vector<uint16_t>{1, 2, 3, 4, 5, 99, 7, 8});
  const TokenDataset ds = TokenDataset::open({file}, 2, 50);  // Opening does not scan the data.
  EXPECT_EQ(instance(ds, 0), (std::vector<int32_t>{1, 2}));
  const std::string message = error_of([&] { instance(ds, 2); });
  EXPECT_NE(message.find("ids.npy"), std::string::npos) << message;
  EXPECT_NE(message.find("token id 99 at position 5"), std::string::npos) << message;

  const std::string negative = npy("neg.npy", "<i8", std::vector<int64_t>{3, -1});
  const TokenDataset ds8 = TokenDataset::open({negative}, 2, 50);
  EXPECT_NE(error_of([&] { instance(ds8, 0); }).find("token id -1 at position 1"),
            std::string::npos);
}

TEST_F(TokenDatasetTest, DataLoaderFollowsTheOrderAndResumesExactly) {
  const std::string file = npy("data.npy", "<u2", range_u16(0, 5 * 3));  // 5 instances of 3.
  const TokenDataset ds = TokenDataset::open({file}, 3, 100);
  DataLoader straight(ds, InstanceOrder(11, 5));
  InstanceOrder order(11, 5);
  std::vector<int32_t> tokens, targets;
  std::vector<std::vector<int32_t>> seen;
  for (int step = 0; step < 7; ++step) {  // 14 instances: crosses two epoch boundaries.
    straight.next_batch(2, tokens, targets);
    ASSERT_EQ(tokens.size(), 6u);
    for (int r = 0; r < 2; ++r) {
      const int64_t index = order.instance_at(static_cast<uint64_t>(step * 2 + r));
      EXPECT_EQ(tokens[static_cast<size_t>(r * 3)], index * 3);
      EXPECT_EQ(targets[static_cast<size_t>(r * 3 + 2)], -100);
    }
    seen.push_back(tokens);
  }
  EXPECT_EQ(straight.cursor(), 14u);
  EXPECT_EQ(straight.epoch(), 2u);

  for (uint64_t resume_step = 0; resume_step < 7; ++resume_step) {
    DataLoader resumed(ds, InstanceOrder(11, 5), resume_step * 2);
    for (size_t step = resume_step; step < 7; ++step) {
      resumed.next_batch(2, tokens, targets);
      EXPECT_EQ(tokens, seen[step]) << "resumed at step " << resume_step;
    }
  }
}

// OLMo-core's order: each epoch a NumPy shuffle cut to whole global batches, a global batch dealt
// to the data-parallel ranks round-robin. tests/reference/test_olmo_core_data_order.py holds the
// whole of it against NumPy and OLMo-core's loader; these pin it where no Python is at hand.
TEST(NumpyShuffleTest, MatchesNumpyPinnedValues) {
  // np.random.SeedSequence(7).generate_state(4, np.uint64)
  EXPECT_EQ(numpy_seed_sequence_state(7),
            (std::array<uint64_t, 4>{0xead0f7017c326e58ULL, 0x879c4f0f97e037aULL,
                                     0x623a8c4b6745675fULL, 0xb3443fad60386cacULL}));
  // np.random.PCG64(0).random_raw(3); a seed of two 32-bit words: PCG64(2**40 + 5).random_raw(2)
  NumpyPcg64 zero(0), wide((uint64_t{1} << 40) + 5);
  EXPECT_EQ(zero.next_uint64(), 0xa30febcfd9c2825fULL);
  EXPECT_EQ(zero.next_uint64(), 0x4510bdf882d9d721ULL);
  EXPECT_EQ(zero.next_uint64(), 0xa7d3da94ecde8b8ULL);
  EXPECT_EQ(wide.next_uint64(), 0x1369aef039fedebULL);
  EXPECT_EQ(wide.next_uint64(), 0x5f61b40473314316ULL);
  // a = np.arange(10); np.random.Generator(np.random.PCG64(s)).shuffle(a)
  std::vector<int64_t> one = iota(10), two = iota(10);
  numpy_shuffle(1, one);
  numpy_shuffle(2, two);
  EXPECT_EQ(one, (std::vector<int64_t>{8, 4, 7, 0, 1, 2, 5, 9, 6, 3}));
  EXPECT_EQ(two, (std::vector<int64_t>{2, 0, 7, 6, 9, 5, 3, 4, 8, 1}));
}

TEST(InstanceOrderTest, OlmoCoreEpochsAreWholeBatchesOfAOneBasedNumpyShuffle) {
  // 10 instances, global batches of 4: an epoch visits 8, the shuffle's first 8.
  InstanceOrder order = InstanceOrder::with_rule(OrderRule::kOlmoCore, 0, 10, 4);
  EXPECT_EQ(order.epoch_length(), 8);
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> shuffled = iota(10);
    numpy_shuffle(epoch + 1, shuffled);  // seed 0 + OLMo-core's epoch (1-based)
    shuffled.resize(8);
    EXPECT_EQ(order.permutation(epoch), shuffled) << "epoch " << epoch;
    for (uint64_t k = 0; k < 8; ++k)
      EXPECT_EQ(order.instance_at(epoch * 8 + k), shuffled[k]) << "epoch " << epoch << ", " << k;
  }
  EXPECT_EQ(order.epoch_of(15), 1u);
  EXPECT_EQ(order.epoch_of(16), 2u);
  // moecore's rule visits every instance each epoch and ignores the batch.
  EXPECT_EQ(InstanceOrder::with_rule(OrderRule::kMoecore, 0, 10, 4).epoch_length(), 10);
  EXPECT_EQ(InstanceOrder::with_rule(OrderRule::kMoecore, 5, 10, 4).permutation(2),
            InstanceOrder(5, 10).permutation(2));
}

TEST(InstanceOrderTest, OlmoCoreChunksAreShuffledWhole) {
  // 12 instances in chunks of 4 (max_target_seq_len = 4 x seq_len), batches of 8: the 3 chunks'
  // first indices are what NumPy shuffles, each chunk read in order; an epoch is 8 of them.
  InstanceOrder order = InstanceOrder::with_rule(OrderRule::kOlmoCore, 7, 12, 8, 4);
  EXPECT_EQ(order.epoch_length(), 8);
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> chunks = iota(3);
    numpy_shuffle(7 + epoch + 1, chunks);
    std::vector<int64_t> expected;
    for (int64_t c : chunks)
      for (int64_t i = 0; i < 4; ++i) expected.push_back(c * 4 + i);
    expected.resize(8);
    EXPECT_EQ(order.permutation(epoch), expected) << "epoch " << epoch;
  }
  EXPECT_THROW(InstanceOrder::with_rule(OrderRule::kOlmoCore, 7, 10, 8, 4), Error);
}

TEST_F(TokenDatasetTest, MaxTargetSeqLenCutsWholeBlocksFirst) {
  // Blocks of 8 tokens, instances of 4: a file of 10 tokens gives one block (2 instances), one of
  // 5 none (it would give one instance of 4 without blocks), one of 16 two blocks.
  const std::string a = npy("a.npy", "<u2", range_u16(0, 10));
  const std::string b = npy("b.npy", "<u2", range_u16(100, 5));
  const std::string c = npy("c.npy", "<u2", range_u16(200, 16));
  const TokenDataset ds = TokenDataset::open({a, b, c}, 4, 1000, "", 8);
  EXPECT_EQ(ds.num_instances(), 6);
  EXPECT_EQ(ds.instances_per_chunk(), 2);
  EXPECT_EQ(instance(ds, 1), (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(instance(ds, 2), (std::vector<int32_t>{200, 201, 202, 203}));  // past b
  EXPECT_EQ(instance(ds, 5), (std::vector<int32_t>{212, 213, 214, 215}));
  EXPECT_EQ(TokenDataset::open({a, b, c}, 4, 1000).num_instances(), 7);
  for (const int64_t bad : {int64_t{6}, int64_t{2}, int64_t{-8}})
    EXPECT_NE(error_of([&] {
                TokenDataset::open({a}, 4, 1000, "", bad);
              }).find("must be 0 (none) or a positive multiple of seq_len=4"),
              std::string::npos)
        << bad;
}

TEST_F(TokenDatasetTest, OlmoCoreOrderRefusesASetSmallerThanOneBatch) {
  const std::string message =
      error_of([] { InstanceOrder::with_rule(OrderRule::kOlmoCore, 0, 3, 4); });
  EXPECT_NE(message.find("do not fill one of train.batch_size = 4"), std::string::npos) << message;
  EXPECT_THROW(InstanceOrder::with_rule(OrderRule::kOlmoCore, uint64_t{1} << 63, 10, 4), Error);
}

TEST_F(TokenDatasetTest, OlmoCoreOrderDealsABatchToRanksRoundRobin) {
  const std::string file = npy("data.npy", "<u2", range_u16(0, 12 * 2));  // 12 instances of 2.
  const TokenDataset ds = TokenDataset::open({file}, 2, 100);
  // Global batches of 8 over 2 ranks in 2 micro-batches of 4 rows (2 per rank). OLMo-core: rank r
  // takes global positions r, r + 2, r + 4, r + 6, its micro-batches the first two and the last
  // two.
  const auto order = [] { return InstanceOrder::with_rule(OrderRule::kOlmoCore, 3, 12, 8); };
  DataLoader loader(ds, order(), 0, /*dp_ranks=*/2);
  const std::vector<int64_t> epoch0 = order().permutation(0);
  const auto at = [&](size_t position) { return epoch0[position]; };
  std::vector<int32_t> tokens, targets;
  const auto rows = [&](DataLoader& l) {
    const std::span<const int64_t> read = l.next_batch(4, tokens, targets);
    return std::vector<int64_t>(read.begin(), read.end());
  };
  EXPECT_EQ(rows(loader), (std::vector<int64_t>{at(0), at(2), at(1), at(3)}));
  EXPECT_EQ(tokens[2], at(2) * 2);  // row 1: rank 0's second instance
  EXPECT_EQ(rows(loader), (std::vector<int64_t>{at(4), at(6), at(5), at(7)}));
  // The epoch ends after 8: the next batch is epoch 1's (1-based 2) start.
  const std::vector<int64_t> epoch1 = order().permutation(1);
  EXPECT_EQ(rows(loader), (std::vector<int64_t>{epoch1[0], epoch1[2], epoch1[1], epoch1[3]}));
  // One rank: rows follow the order.
  DataLoader single(ds, order());
  EXPECT_EQ(rows(single), (std::vector<int64_t>{at(0), at(1), at(2), at(3)}));
  // A batch that does not split over the ranks is refused, the cursor left where it was.
  EXPECT_THROW(loader.next_batch(3, tokens, targets), Error);
  EXPECT_EQ(loader.cursor(), 12u);
}

TEST_F(TokenDatasetTest, ValidationBatchesAreTheFirstInstancesInFileOrder) {
  const std::string file = npy("val.npy", "<u2", range_u16(0, 5 * 2));
  const TokenDataset ds = TokenDataset::open({file}, 2, 100);
  ValidationBatches val(ds, /*batch=*/2, /*max_instances=*/3);
  std::vector<int32_t> tokens, targets;
  EXPECT_EQ(val.next(tokens, targets), 2);
  EXPECT_EQ(tokens, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(targets, (std::vector<int32_t>{1, -100, 3, -100}));
  EXPECT_EQ(val.next(tokens, targets), 1);
  EXPECT_EQ(tokens, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(val.next(tokens, targets), 0);
  val.reset();
  EXPECT_EQ(val.next(tokens, targets), 2);
  EXPECT_EQ(ValidationBatches(ds, 4).num_instances(), 5);  // 0: all instances.
}

}  // namespace
}  // namespace moecore::data
