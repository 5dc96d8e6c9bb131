// lazyfuse::distributed (frontend/distributed.h): the job's settings from the launchers'
// variables, and the collectives as lazy ops over the runtime's process group.
#include "lazyfuse/frontend/distributed.h"

#include <cstdlib>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "lazyfuse/frontend/autograd.h"
#include "lazyfuse/frontend/op_builder.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/distributed/process_group.h"
#include "lazyfuse/runtime/lazy.h"

namespace lazyfuse::distributed {
namespace {

std::string at(const Loc& where) {
  return absl::StrCat(" (at ", SourceLoc::from(where).str(), ")");
}

// The first of `names` that is set, as an integer; DistributedError if it is not one.
std::optional<int> env_int(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') continue;
    int value = 0;
    if (!absl::SimpleAtoi(text, &value))
      throw DistributedError(absl::StrCat("init: ", name, "='", text, "' is not an integer"));
    return value;
  }
  return std::nullopt;
}

std::shared_ptr<ProcessGroup> group_for(const char* what, const Loc& where) {
  std::shared_ptr<ProcessGroup> group = default_process_group();
  if (group == nullptr)
    throw DistributedError(absl::StrCat(what, ": the process group is not initialized: call ",
                                        "lazyfuse::distributed::init() first", at(where)));
  return group;
}

ReduceOp checked(ReduceOp op, const Tensor& tensor, const char* what, const Loc& where) {
  if (op == ReduceOp::AVG && !is_floating(tensor.dtype()))
    throw DTypeError(absl::StrCat(what, "(): ReduceOp::AVG needs a floating tensor, not ",
                                  dtype_torch_name(tensor.dtype()), at(where)));
  if (op != ReduceOp::SUM && op != ReduceOp::AVG && op != ReduceOp::MAX && op != ReduceOp::MIN)
    throw DistributedError(
        absl::StrCat(what, "(): unknown ReduceOp ", static_cast<int64_t>(op), at(where)));
  return op;
}

}  // namespace

void init(const InitOptions& options) {
  if (default_process_group() != nullptr)
    throw DistributedError("init: the process group is already initialized");
  ProcessGroupOptions settings;
  settings.backend = options.backend;
  settings.rank =
      options.rank ? *options.rank : env_int({"RANK", "OMPI_COMM_WORLD_RANK"}).value_or(0);
  settings.world_size = options.world_size
                            ? *options.world_size
                            : env_int({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"}).value_or(1);
  settings.local_rank =
      options.local_rank
          ? *options.local_rank
          : env_int({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"}).value_or(settings.rank);
  if (options.master_addr) {
    settings.master_addr = *options.master_addr;
  } else if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr) {
    settings.master_addr = addr;
  }
  if (options.master_port) {
    settings.master_port = *options.master_port;
  } else if (std::optional<int> port = env_int({"LAZYFUSE_STORE_PORT"})) {
    settings.master_port = *port;
  } else {
    settings.master_port = env_int({"MASTER_PORT"}).value_or(29500);
    // torchrun's agent serves PyTorch's own store on MASTER_PORT: lazyfuse's takes the next.
    if (const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
        agent != nullptr && std::string(agent) == "True")
      settings.master_port += 1;
  }
  settings.timeout = options.timeout;
  set_default_process_group(ProcessGroup::create(settings));
}

bool is_initialized() { return default_process_group() != nullptr; }

int rank() {
  auto group = default_process_group();
  return group ? group->rank() : 0;
}

int world_size() {
  auto group = default_process_group();
  return group ? group->size() : 1;
}

int local_rank() {
  auto group = default_process_group();
  return group ? group->local_rank() : 0;
}

void barrier() { group_for("barrier", Loc::current())->barrier(); }

void destroy_process_group() {
  std::shared_ptr<ProcessGroup> group = default_process_group();
  if (group == nullptr) return;
  set_default_process_group(nullptr);
  try {
    group->barrier();
  } catch (const DistributedError&) {
    // A job whose group failed still leaves it.
  }
}

Tensor all_reduce(const Tensor& tensor, ReduceOp op, Loc where) {
  group_for("all_reduce", where);
  Attrs attrs;
  attrs.set("reduce_op", static_cast<int64_t>(checked(op, tensor, "all_reduce", where)));
  return detail::make_op(Op::AllReduce, {tensor}, std::move(attrs), where);
}

Tensor all_gather(const Tensor& tensor, int64_t dim, Loc where) {
  auto group = group_for("all_gather", where);
  Attrs attrs;
  attrs.set("dim", dim);
  attrs.set("world", int64_t{group->size()});
  return detail::make_op(Op::AllGather, {tensor}, std::move(attrs), where);
}

Tensor reduce_scatter(const Tensor& tensor, ReduceOp op, int64_t dim, Loc where) {
  auto group = group_for("reduce_scatter", where);
  Attrs attrs;
  attrs.set("reduce_op", static_cast<int64_t>(checked(op, tensor, "reduce_scatter", where)));
  attrs.set("dim", dim);
  attrs.set("world", int64_t{group->size()});
  return detail::make_op(Op::ReduceScatter, {tensor}, std::move(attrs), where);
}

Tensor broadcast(const Tensor& tensor, int root, Loc where) {
  auto group = group_for("broadcast", where);
  if (root < 0 || root >= group->size())
    throw DistributedError(absl::StrCat("broadcast(): root ", root, " is not a rank of the ",
                                        group->size(), " processes", at(where)));
  Attrs attrs;
  attrs.set("root", int64_t{root});
  return detail::make_op(Op::Broadcast, {tensor}, std::move(attrs), where);
}

void send(const Tensor& tensor, int dst, Loc where) {
  auto group = group_for("send", where);
  eval(tensor);
  group->send(*tensor.value()->buffer, dst);
}

Tensor recv(Shape shape, TensorOptions options, int src, Loc where) {
  auto group = group_for("recv", where);
  BufferView buffer = group->recv(options.dtype(), shape, options.device(), src);
  return Tensor(make_leaf(std::move(buffer), SourceLoc::from(where)));
}

void recv(Tensor& tensor, int src, Loc where) {
  Tensor received =
      recv(tensor.sizes(), TensorOptions(tensor.dtype()).device(tensor.device()), src, where);
  NoGradGuard no_grad;
  tensor.copy_(received, where);
}

DistributedSampler::DistributedSampler(int64_t size, std::optional<int> num_replicas,
                                       std::optional<int> rank, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : size_(size),
      num_replicas_(num_replicas.value_or(world_size())),
      rank_(rank.value_or(distributed::rank())),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  if (size < 0 || num_replicas_ < 1 || rank_ < 0 || rank_ >= num_replicas_)
    throw Error(absl::StrCat("DistributedSampler: rank ", rank_, " of ", num_replicas_,
                             " replicas over ", size, " samples is not a valid split"));
  num_samples_ = drop_last ? size / num_replicas_ : (size + num_replicas_ - 1) / num_replicas_;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order(static_cast<size_t>(size_));
  for (int64_t i = 0; i < size_; ++i) order[i] = i;
  if (shuffle_) {
    // Fisher-Yates over a 64-bit Mersenne twister, written out so that every process (and every
    // standard library) draws the same permutation.
    std::mt19937_64 bits(seed_ + static_cast<uint64_t>(epoch_));
    for (int64_t i = size_ - 1; i > 0; --i)
      std::swap(order[i], order[bits() % static_cast<uint64_t>(i + 1)]);
  }
  const int64_t total = num_samples_ * num_replicas_;
  if (!drop_last_ && size_ > 0)
    for (int64_t i = size_; i < total; ++i) order.push_back(order[i % size_]);
  order.resize(static_cast<size_t>(total));
  std::vector<int64_t> mine;
  for (int64_t i = rank_; i < total; i += num_replicas_) mine.push_back(order[i]);
  return mine;
}

}  // namespace lazyfuse::distributed
