// Token shards and the loader of [B, T] batches (frontend/data.h).
#include "lazyfuse/frontend/data.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lazyfuse/frontend/distributed.h"
#include "lazyfuse/frontend/interop.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse::data {
namespace {

[[noreturn]] void fail(const std::string& path, int64_t offset, const std::string& what) {
  throw SerializationError(absl::StrCat(path, ": at byte ", offset, ": ", what));
}

int32_t read_int32(const unsigned char* at) {
  // Little-endian, as the scripts' numpy int32 writes it on every machine they run on.
  return static_cast<int32_t>(static_cast<uint32_t>(at[0]) | static_cast<uint32_t>(at[1]) << 8 |
                              static_cast<uint32_t>(at[2]) << 16 |
                              static_cast<uint32_t>(at[3]) << 24);
}

}  // namespace

TokenShard::TokenShard(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path_, 0, absl::StrCat("cannot open: ", std::strerror(errno)));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    fail(path_, 0, absl::StrCat("cannot stat: ", std::strerror(error)));
  }
  bytes_ = info.st_size;
  constexpr int64_t kHeaderBytes = kTokenShardHeaderInts * 4;
  if (bytes_ < kHeaderBytes) {
    ::close(fd);
    fail(path_, bytes_,
         absl::StrCat("the file ends inside the ", kHeaderBytes, "-byte header (", bytes_,
                      " bytes)"));
  }
  void* mapped = ::mmap(nullptr, static_cast<size_t>(bytes_), PROT_READ, MAP_PRIVATE, fd, 0);
  const int error = errno;
  ::close(fd);
  if (mapped == MAP_FAILED) fail(path_, 0, absl::StrCat("cannot map: ", std::strerror(error)));
  mapping_ = static_cast<const unsigned char*>(mapped);
  // From here a failure unmaps through the destructor of a moved-from shard: release by hand.
  auto reject = [&](int64_t offset, const std::string& what) {
    ::munmap(const_cast<unsigned char*>(mapping_), static_cast<size_t>(bytes_));
    mapping_ = nullptr;
    fail(path_, offset, what);
  };
  const int32_t magic = read_int32(mapping_);
  if (magic != kTokenShardMagic && magic != kTokenShardMagicLlama3)
    reject(0, absl::StrCat("magic ", magic, ", not a token shard's (", kTokenShardMagic, " or ",
                           kTokenShardMagicLlama3, ")"));
  version_ = read_int32(mapping_ + 4);
  const int expected = magic == kTokenShardMagic ? 1 : 7;
  if (version_ != expected)
    reject(4, absl::StrCat("version ", version_, ": magic ", magic, " takes version ", expected));
  const int32_t count = read_int32(mapping_ + 8);
  if (count < 0) reject(8, absl::StrCat("a negative token count, ", count));
  size_ = count;
  const int64_t token_bytes = version_ == 1 ? 2 : 4;
  const int64_t needed = kHeaderBytes + size_ * token_bytes;
  if (bytes_ < needed)
    reject(bytes_, absl::StrCat("truncated: the header's ", size_, " tokens need ", needed,
                                " bytes, the file has ", bytes_));
}

TokenShard::~TokenShard() {
  if (mapping_ != nullptr)
    ::munmap(const_cast<unsigned char*>(mapping_), static_cast<size_t>(bytes_));
}

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      bytes_(other.bytes_),
      version_(other.version_),
      size_(other.size_) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    if (mapping_ != nullptr)
      ::munmap(const_cast<unsigned char*>(mapping_), static_cast<size_t>(bytes_));
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    bytes_ = other.bytes_;
    version_ = other.version_;
    size_ = other.size_;
  }
  return *this;
}

int64_t TokenShard::operator[](int64_t i) const {
  if (i < 0 || i >= size_) throw IndexError(absl::StrCat(path_, ": token ", i, " of ", size_));
  const unsigned char* at = mapping_ + kTokenShardHeaderInts * 4 + i * (version_ == 1 ? 2 : 4);
  if (version_ == 1) return static_cast<int64_t>(at[0] | at[1] << 8);
  return static_cast<int64_t>(static_cast<uint32_t>(read_int32(at)));
}

namespace {

std::vector<std::string> matching(const std::string& pattern) {
  glob_t found{};
  const int status = ::glob(pattern.c_str(), 0, nullptr, &found);
  std::vector<std::string> paths;
  if (status == 0)
    for (size_t i = 0; i < found.gl_pathc; ++i) paths.emplace_back(found.gl_pathv[i]);
  ::globfree(&found);
  if (paths.empty()) throw SerializationError(absl::StrCat(pattern, ": no file matches"));
  return paths;  // glob sorts them
}

}  // namespace

TokenLoader::TokenLoader(const std::string& pattern, int64_t batch_size, int64_t sequence_length,
                         TokenLoaderOptions options)
    : TokenLoader(matching(pattern), batch_size, sequence_length, std::move(options)) {}

TokenLoader::TokenLoader(std::vector<std::string> paths, int64_t batch_size,
                         int64_t sequence_length, TokenLoaderOptions options)
    : batch_size_(batch_size), sequence_length_(sequence_length), options_(std::move(options)) {
  if (batch_size < 1 || sequence_length < 1)
    throw ValueError(absl::StrCat("TokenLoader: batch size ", batch_size, " and sequence length ",
                                  sequence_length, " must be positive"));
  if (paths.empty()) throw ValueError("TokenLoader: no shards");
  for (std::string& path : paths) {
    shards_.emplace_back(std::move(path));
    const TokenShard& shard = shards_.back();
    for (int64_t k = 0; k < (shard.size() - 1) / sequence_length; ++k) {
      sample_shard_.push_back(static_cast<int32_t>(shards_.size() - 1));
      sample_start_.push_back(k * sequence_length);
    }
  }
  start_epoch(0);
  if (batches_per_epoch_ == 0)
    throw ValueError(absl::StrCat("TokenLoader: ", samples(), " sequences of ", sequence_length,
                                  " tokens in ", shards_.size(), " shards make no batch of ",
                                  batch_size, " for this process"));
}

void TokenLoader::start_epoch(int64_t epoch) {
  distributed::DistributedSampler sampler(samples(), options_.num_replicas, options_.rank,
                                          options_.shuffle, options_.seed, /*drop_last=*/false);
  sampler.set_epoch(epoch);
  order_ = sampler.indices();
  batches_per_epoch_ = static_cast<int64_t>(order_.size()) / batch_size_;
  position_ = {epoch, 0};
}

void TokenLoader::set_position(TokenLoaderPosition position) {
  if (position.epoch < 0 || position.batch < 0 || position.batch > batches_per_epoch_)
    throw ValueError(absl::StrCat("TokenLoader: position epoch ", position.epoch, " batch ",
                                  position.batch, " is not within an epoch of ", batches_per_epoch_,
                                  " batches"));
  start_epoch(position.epoch);
  position_.batch = position.batch;
}

TokenBatch TokenLoader::next() {
  if (position_.batch == batches_per_epoch_) start_epoch(position_.epoch + 1);
  const int64_t count = batch_size_ * sequence_length_;
  auto inputs = std::make_unique<int64_t[]>(static_cast<size_t>(count));
  auto targets = std::make_unique<int64_t[]>(static_cast<size_t>(count));
  for (int64_t b = 0; b < batch_size_; ++b) {
    const int64_t sample = order_[static_cast<size_t>(position_.batch * batch_size_ + b)];
    const TokenShard& shard = shards_[static_cast<size_t>(sample_shard_[sample])];
    const int64_t start = sample_start_[sample];
    for (int64_t t = 0; t < sequence_length_; ++t) {
      inputs[b * sequence_length_ + t] = shard[start + t];
      targets[b * sequence_length_ + t] = shard[start + t + 1];
    }
  }
  ++position_.batch;
  auto owned = [&](std::unique_ptr<int64_t[]> values) {
    int64_t* data = values.release();
    const Tensor host = from_blob(
        data, {batch_size_, sequence_length_}, [](void* p) { delete[] static_cast<int64_t*>(p); },
        kInt64);
    return options_.device.is_cpu() ? host : host.to(options_.device);
  };
  return {owned(std::move(inputs)), owned(std::move(targets))};
}

}  // namespace lazyfuse::data
