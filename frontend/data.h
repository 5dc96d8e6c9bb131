// Token data for training a language model: the shard files that llm.c's and nanoGPT's
// preprocessing scripts write (llm.c's dev/data/data_common.py, write_datafile), read through a
// memory map and cut into [B, T] batches of inputs and next-token targets.
//
// A shard is a header of 256 little-endian int32 — magic and version (20240520 and 1: uint16
// tokens, GPT-2's; 20240801 and 7: uint32 tokens, Llama 3's), the count of tokens — and then the
// tokens. A sequence never spans two shards, as in llm.c: shard s holds (n_s - 1) / T sequences,
// sequence k its tokens [k T, k T + T] (the inputs are the first T, the targets the last T),
// and the loader's samples are every shard's sequences in order. Which samples a process takes
// in an epoch are distributed::DistributedSampler's (torch.utils.data.DistributedSampler's
// rules: the same permutation on every process where shuffled, process r taking every
// world_size-th), B of them a batch, the last partial batch dropped.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lazyfuse/frontend/tensor.h"

namespace lazyfuse::data {

inline constexpr int32_t kTokenShardMagic = 20240520;        // GPT-2's, version 1
inline constexpr int32_t kTokenShardMagicLlama3 = 20240801;  // Llama 3's, version 7
inline constexpr int64_t kTokenShardHeaderInts = 256;

// One shard, memory-mapped. A SerializationError naming the file and the byte offset where it
// cannot be read, its header is wrong, or it holds fewer bytes than its header says.
class TokenShard {
 public:
  explicit TokenShard(std::string path);
  ~TokenShard();
  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  int version() const { return version_; }  // 1 (uint16 tokens) or 7 (uint32)
  int64_t size() const { return size_; }    // tokens
  int64_t operator[](int64_t i) const;      // token i, 0 <= i < size()

 private:
  std::string path_;
  const unsigned char* mapping_ = nullptr;
  int64_t bytes_ = 0;
  int version_ = 0;
  int64_t size_ = 0;
};

struct TokenBatch {
  Tensor inputs;   // int64 [B, T]
  Tensor targets;  // int64 [B, T]: each input's next token
};

struct TokenLoaderOptions {
  bool shuffle = false;  // a new permutation of the samples every epoch, from seed + epoch
  uint64_t seed = 0;
  // This process's share: distributed::world_size() and rank() where unset.
  std::optional<int> num_replicas, rank;
  Device device = Device::cpu();  // where the batches' tensors are
};

// Where a loader stands: the epoch, and the batches of it already taken. Saved beside a
// checkpoint and given back to set_position, a resumed run reads the batches it would have read.
struct TokenLoaderPosition {
  int64_t epoch = 0, batch = 0;
};

class TokenLoader {
 public:
  // The shards in `paths`' order, or those matching a glob pattern ("fineweb_train_*.bin",
  // sorted by name). SerializationError where a shard cannot be read or nothing matches; a
  // ValueError where the sizes are not positive or there is not one batch an epoch.
  TokenLoader(std::vector<std::string> paths, int64_t batch_size, int64_t sequence_length,
              TokenLoaderOptions options = {});
  TokenLoader(const std::string& pattern, int64_t batch_size, int64_t sequence_length,
              TokenLoaderOptions options = {});

  // The next batch; past an epoch's last, the first of the next epoch.
  TokenBatch next();
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t samples() const { return static_cast<int64_t>(sample_shard_.size()); }
  TokenLoaderPosition position() const { return position_; }
  // ValueError where the batch is past the epoch's last.
  void set_position(TokenLoaderPosition position);
  const std::vector<TokenShard>& shards() const { return shards_; }

 private:
  void start_epoch(int64_t epoch);

  std::vector<TokenShard> shards_;
  int64_t batch_size_, sequence_length_;
  TokenLoaderOptions options_;
  // Sample i's shard and first token.
  std::vector<int32_t> sample_shard_;
  std::vector<int64_t> sample_start_;
  std::vector<int64_t> order_;  // this process's samples in the current epoch
  int64_t batches_per_epoch_ = 0;
  TokenLoaderPosition position_;
};

}  // namespace lazyfuse::data
