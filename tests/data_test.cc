// Token shards and their loader (frontend/data.h) against the shards scripts/make-token-shards.py
// wrote in llm.c's layout (tests/fixtures/tokens), whose tokens follow a formula computed here
// again; malformed shards are written by the tests.
#include <filesystem>
#include <fstream>
#include <set>

#include "gtest/gtest.h"
#include "lazyfuse/frontend/data.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse::data {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) {
  return (fs::path(LAZYFUSE_SOURCE_DIR) / "tests/fixtures/tokens" / name).string();
}

// scripts/make-token-shards.py's tokens.
int64_t token(int64_t shard, int64_t i, int64_t vocab) {
  return (shard * 1000003 + i * 7919) % vocab;
}

// A batch's rows as the sequences they hold: shard index (0 or 1 of the two GPT-2 shards) and
// first token, checked against the formula for every input and target.
std::vector<std::pair<int64_t, int64_t>> sequences_of(const TokenBatch& batch, int64_t t) {
  const std::vector<int64_t> inputs = batch.inputs.to_vector<int64_t>();
  const std::vector<int64_t> targets = batch.targets.to_vector<int64_t>();
  std::vector<std::pair<int64_t, int64_t>> found;
  for (int64_t row = 0; row < batch.inputs.size(0); ++row) {
    // The first token names the sequence: the formula's values at multiples of t are distinct.
    std::pair<int64_t, int64_t> which{-1, -1};
    for (int64_t s = 0; s < 2 && which.first < 0; ++s)
      for (int64_t k = 0; k * t < 1000; ++k)
        if (token(s, k * t, 50257) == inputs[row * t]) which = {s, k * t};
    EXPECT_GE(which.first, 0) << "row " << row;
    for (int64_t j = 0; j < t; ++j) {
      EXPECT_EQ(inputs[row * t + j], token(which.first, which.second + j, 50257));
      EXPECT_EQ(targets[row * t + j], token(which.first, which.second + j + 1, 50257));
    }
    found.push_back(which);
  }
  return found;
}

TEST(TokenShard, ReadsWhatOurScriptWroteInLlmcsLayout) {
  for (auto [name, shard, version, count, vocab] :
       std::vector<std::tuple<std::string, int64_t, int, int64_t, int64_t>>{
           {"gpt2_train_000.bin", 0, 1, 1000, 50257},
           {"gpt2_train_001.bin", 1, 1, 517, 50257},
           {"llama_train_000.bin", 2, 7, 300, 128256}}) {
    const TokenShard file(fixture(name));
    EXPECT_EQ(file.version(), version) << name;
    ASSERT_EQ(file.size(), count) << name;
    for (int64_t i = 0; i < count; ++i)
      ASSERT_EQ(file[i], token(shard, i, vocab)) << name << " " << i;
    EXPECT_THROW(file[count], IndexError);
  }
  // Llama 3's tokens pass 65535: version 7 holds them in 32 bits.
  const TokenShard llama(fixture("llama_train_000.bin"));
  int64_t largest = 0;
  for (int64_t i = 0; i < llama.size(); ++i) largest = std::max(largest, llama[i]);
  EXPECT_GT(largest, 65535);
}

// Sequences of T + 1 tokens a stride of T apart, shard after shard, none spanning two; B a
// batch, the last partial batch of an epoch dropped; the next epoch starts over.
TEST(TokenLoader, BatchesAreEveryShardsSequencesInOrder) {
  const int64_t b = 4, t = 16;
  TokenLoader loader({fixture("gpt2_train_000.bin"), fixture("gpt2_train_001.bin")}, b, t,
                     TokenLoaderOptions{.num_replicas = 1, .rank = 0});
  ASSERT_EQ(loader.samples(), 999 / 16 + 516 / 16);  // 62 + 32
  ASSERT_EQ(loader.batches_per_epoch(), 94 / 4);
  std::vector<std::pair<int64_t, int64_t>> seen;
  for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
    const TokenBatch batch = loader.next();
    EXPECT_EQ(batch.inputs.shape(), (Shape{b, t}));
    EXPECT_EQ(batch.inputs.dtype(), kInt64);
    for (auto s : sequences_of(batch, t)) seen.push_back(s);
  }
  for (size_t k = 0; k < seen.size(); ++k) {
    const std::pair<int64_t, int64_t> want = k < 62 ? std::pair<int64_t, int64_t>{0, k * t}
                                                    : std::pair<int64_t, int64_t>{1, (k - 62) * t};
    EXPECT_EQ(seen[k], want) << "sequence " << k;
  }
  EXPECT_EQ(loader.position().epoch, 0);
  const TokenBatch again = loader.next();
  EXPECT_EQ(loader.position().epoch, 1);
  EXPECT_EQ(sequences_of(again, t)[0], (std::pair<int64_t, int64_t>{0, 0}));
}

TEST(TokenLoader, AGlobPatternTakesTheMatchingShardsByName) {
  TokenLoader loader(fixture("gpt2_train_*.bin"), 2, 100,
                     TokenLoaderOptions{.num_replicas = 1, .rank = 0});
  ASSERT_EQ(loader.shards().size(), 2u);
  EXPECT_EQ(fs::path(loader.shards()[0].path()).filename(), "gpt2_train_000.bin");
  EXPECT_EQ(fs::path(loader.shards()[1].path()).filename(), "gpt2_train_001.bin");
  EXPECT_EQ(loader.samples(), 9 + 5);
}

// Two processes split each epoch's sequences as DistributedSampler does: process r takes
// sequences r, r + 2, ...; together they read each at most once.
TEST(TokenLoader, ProcessesSplitTheSequencesAsDistributedSampler) {
  const int64_t t = 16;
  std::set<std::pair<int64_t, int64_t>> all;
  for (int rank = 0; rank < 2; ++rank) {
    TokenLoader loader({fixture("gpt2_train_000.bin"), fixture("gpt2_train_001.bin")}, 4, t,
                       TokenLoaderOptions{.num_replicas = 2, .rank = rank});
    ASSERT_EQ(loader.batches_per_epoch(), 47 / 4);
    const auto first = sequences_of(loader.next(), t);
    for (int64_t row = 0; row < 4; ++row)
      EXPECT_EQ(first[row], (std::pair<int64_t, int64_t>{0, (rank + 2 * row) * t}));
    for (auto s : first) EXPECT_TRUE(all.insert(s).second);
    for (int64_t i = 1; i < loader.batches_per_epoch(); ++i)
      for (auto s : sequences_of(loader.next(), t)) EXPECT_TRUE(all.insert(s).second);
  }
  EXPECT_EQ(all.size(), 2u * 11 * 4);
}

// Shuffled: every epoch a new permutation, the same for the same seed; a loader set to a saved
// position reads exactly the batches the first one reads next, across an epoch's end too.
TEST(TokenLoader, ShuffledEpochsAndResumingFromAPosition) {
  const int64_t t = 16;
  const std::vector<std::string> paths = {fixture("gpt2_train_000.bin"),
                                          fixture("gpt2_train_001.bin")};
  const TokenLoaderOptions options{.shuffle = true, .seed = 7, .num_replicas = 1, .rank = 0};
  TokenLoader a(paths, 4, t, options), b(paths, 4, t, options);
  std::vector<std::pair<int64_t, int64_t>> epoch0, epoch1;
  for (int64_t i = 0; i < a.batches_per_epoch(); ++i)
    for (auto s : sequences_of(a.next(), t)) epoch0.push_back(s);
  for (int64_t i = 0; i < a.batches_per_epoch(); ++i)
    for (auto s : sequences_of(a.next(), t)) epoch1.push_back(s);
  EXPECT_EQ(std::set(epoch0.begin(), epoch0.end()).size(), epoch0.size()) << "no repeats";
  EXPECT_NE(epoch0, epoch1);
  std::vector<std::pair<int64_t, int64_t>> in_order(epoch0);
  std::sort(in_order.begin(), in_order.end());
  EXPECT_NE(epoch0, in_order) << "shuffled";
  for (int64_t i = 0; i < b.batches_per_epoch(); ++i)
    EXPECT_EQ(sequences_of(b.next(), t),
              std::vector(epoch0.begin() + 4 * i, epoch0.begin() + 4 * i + 4));

  // Resume at epoch 0, batch 20: batches 20..22, then epoch 1.
  TokenLoader resumed(paths, 4, t, options);
  resumed.set_position({0, 20});
  for (int64_t i = 20; i < 23 + 5; ++i) {
    const auto& from = i < 23 ? epoch0 : epoch1;
    const int64_t at = 4 * (i < 23 ? i : i - 23);
    EXPECT_EQ(sequences_of(resumed.next(), t),
              std::vector(from.begin() + at, from.begin() + at + 4))
        << "batch " << i;
  }
  EXPECT_EQ(resumed.position().epoch, 1);
  EXPECT_EQ(resumed.position().batch, 5);
  EXPECT_THROW(resumed.set_position({0, 24}), ValueError);
}

// Bad shards: a SerializationError naming the file and the byte where it goes wrong.
TEST(TokenShard, MalformedOrTruncatedShardsAreErrorsNamingFileAndOffset) {
  const fs::path dir =
      fs::temp_directory_path() / ("lazyfuse_tokens_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, std::vector<int32_t> header, int64_t token_bytes) {
    header.resize(256, 0);
    const fs::path path = dir / name;
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    const std::string tokens(static_cast<size_t>(token_bytes), '\1');
    out.write(tokens.data(), static_cast<std::streamsize>(tokens.size()));
    return path.string();
  };
  auto message = [](const std::string& path) {
    try {
      TokenShard shard(path);
    } catch (const SerializationError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string magic = write("magic.bin", {20240519, 1, 4}, 8);
  EXPECT_EQ(message(magic),
            magic + ": at byte 0: magic 20240519, not a token shard's (20240520 or 20240801)");
  const std::string version = write("version.bin", {20240520, 7, 4}, 8);
  EXPECT_EQ(message(version), version + ": at byte 4: version 7: magic 20240520 takes version 1");
  const std::string truncated = write("truncated.bin", {20240520, 1, 1000}, 10);
  EXPECT_EQ(message(truncated),
            truncated +
                ": at byte 1034: truncated: the header's 1000 tokens need 3024 bytes, "
                "the file has 1034");
  const std::string wide = write("wide.bin", {20240801, 7, 4}, 8);
  EXPECT_NE(message(wide).find("the header's 4 tokens need 1040 bytes"), std::string::npos);
  const fs::path short_header = dir / "short.bin";
  std::ofstream(short_header, std::ios::binary) << "12345";
  EXPECT_NE(message(short_header.string()).find(": at byte 5: the file ends inside"),
            std::string::npos);
  EXPECT_NE(message((dir / "absent.bin").string()).find("cannot open"), std::string::npos);
  EXPECT_THROW(TokenLoader((dir / "none_*.bin").string(), 1, 1), SerializationError);
  // A shard too short for one batch.
  const std::string tiny = write("tiny.bin", {20240520, 1, 8}, 16);
  EXPECT_THROW(TokenLoader({tiny}, 2, 4, TokenLoaderOptions{.num_replicas = 1, .rank = 0}),
               ValueError);
  EXPECT_THROW(TokenLoader({tiny}, 0, 4), ValueError);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lazyfuse::data
