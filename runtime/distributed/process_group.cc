// The process group (runtime/distributed/process_group.h): Gloo for CPU tensors, and for the
// processes' agreement before each collective; NCCL for CUDA tensors where it loads, else Gloo on a
// copy in host memory, as PyTorch's Gloo backend does.
#include "lazyfuse/runtime/distributed/process_group.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/transport/tcp/device.h"
#include "lazyfuse/codegen/cpu/cpu_math.h"
#include "lazyfuse/codegen/dtype_dispatch.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"
#include "lazyfuse/runtime/distributed/nccl.h"
#include "lazyfuse/runtime/distributed/tcp_store.h"
#include "lazyfuse/runtime/executor.h"

namespace lazyfuse {
namespace {

// What a process is about to run, exchanged before every collective: the processes compare
// them and throw on any difference, so that no collective pairs different bytes.
struct Intent {
  int64_t sequence = 0;  // collectives this process ran before
  int64_t op = 0;
  int64_t reduce_op = -1;
  int64_t dtype = 0;
  int64_t rank = 0;  // of the shape
  int64_t root = -1;
  int64_t dim = -1;
  int64_t device_type = 0;  // where the operand lives, which picks the engine (Gloo, NCCL)
  int64_t dims[9] = {};     // the sizes; a longer shape's later sizes are folded into dims[8]

  bool operator==(const Intent& other) const {
    return std::memcmp(this, &other, sizeof(Intent)) == 0;
  }
};

Intent intent_of(const Node& node, int64_t sequence) {
  Intent intent;
  intent.sequence = sequence;
  intent.op = static_cast<int64_t>(node.op);
  if (node.attrs.has("reduce_op")) intent.reduce_op = node.attrs.get_int("reduce_op");
  if (node.attrs.has("root")) intent.root = node.attrs.get_int("root");
  if (node.attrs.has("dim")) intent.dim = node.attrs.get_int("dim");
  return intent;
}

void describe_operand(Intent& intent, DType dtype, const Shape& shape) {
  intent.dtype = static_cast<int64_t>(dtype);
  intent.rank = static_cast<int64_t>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d)
    intent.dims[std::min<size_t>(d, 8)] = d < 8 ? shape[d] : intent.dims[8] * 31 + shape[d];
}

// "f32[2,3]": the operand's dtype and sizes (a shape past 9 dims ends in ",...").
std::string operand_text(const Intent& intent) {
  std::vector<int64_t> sizes(intent.dims, intent.dims + std::min<int64_t>(intent.rank, 9));
  return absl::StrCat(dtype_ir_name(static_cast<DType>(intent.dtype)), "[",
                      absl::StrJoin(sizes, ","), intent.rank > 9 ? ",..." : "", "]");
}

std::string describe(const Intent& intent) {
  std::string text = op_name(static_cast<Op>(intent.op));
  if (intent.reduce_op >= 0)
    absl::StrAppend(&text, "(", reduce_op_name(static_cast<ReduceOp>(intent.reduce_op)), ")");
  if (intent.root >= 0) absl::StrAppend(&text, "(root ", intent.root, ")");
  if (intent.dim >= 0) absl::StrAppend(&text, "(dim ", intent.dim, ")");
  const auto type = static_cast<DeviceType>(intent.device_type);
  absl::StrAppend(&text, " of ", operand_text(intent),
                  type == Device::cpu().type() ? "" : absl::StrCat(" on ", device_type_name(type)));
  return text;
}

// c = a op b over n elements of storage type S, computed as the CPU computes S (half types in
// float, rounded once per combine). Bool: sum and max are or, min is and.
template <typename S>
gloo::AllreduceOptions::Func combiner(ReduceOp op) {
  return [op](void* c, const void* a, const void* b, size_t n) {
    using C = ComputeOf<S>;
    S* out = static_cast<S*>(c);
    const S* x = static_cast<const S*>(a);
    const S* y = static_cast<const S*>(b);
    for (size_t i = 0; i < n; ++i) {
      const C u = convert_value<C>(x[i]), v = convert_value<C>(y[i]);
      C r;
      if constexpr (std::is_same_v<S, bool>) {
        r = op == ReduceOp::MIN ? (u && v) : (u || v);
      } else {
        switch (op) {
          case ReduceOp::MAX:
            r = cpu_math::lf_max(u, v);
            break;
          case ReduceOp::MIN:
            r = cpu_math::lf_min(u, v);
            break;
          default:
            r = static_cast<C>(u + v);
        }
      }
      out[i] = convert_value<S>(r);
    }
  };
}

// AVG's last step: the sum divided by the process count, in S's compute type.
template <typename S>
void divide_by_count(void* data, int64_t n, int count) {
  if constexpr (!std::is_same_v<S, bool>) {
    using C = ComputeOf<S>;
    S* values = static_cast<S*>(data);
    for (int64_t i = 0; i < n; ++i)
      values[i] = convert_value<S>(convert_value<C>(values[i]) / static_cast<C>(count));
  }
}

int64_t product(const Shape& shape, size_t from, size_t to) {
  int64_t n = 1;
  for (size_t d = from; d < to; ++d) n *= shape[d];
  return n;
}

class GlooGroup final : public ProcessGroup {
 public:
  explicit GlooGroup(const ProcessGroupOptions& options) : options_(options) {
    // A job of one process meets nobody: its store is in memory, and it needs no port.
    std::unique_ptr<gloo::rendezvous::Store> local;
    if (options.world_size == 1)
      local = std::make_unique<gloo::rendezvous::HashStore>();
    else
      store_ = std::make_shared<TcpStore>(options.master_addr, options.master_port, options.rank,
                                          options.world_size, options.timeout);
    gloo::transport::tcp::attr attr;
    if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface != nullptr && *iface) {
      attr.iface = iface;
    } else if (options.master_addr == "127.0.0.1" || options.master_addr == "localhost") {
      attr.hostname = "127.0.0.1";  // a job on one machine stays on the loopback
    } else {
      char host[256] = {};
      ::gethostname(host, sizeof(host) - 1);
      attr.hostname = host;
    }
    try {
      auto device = gloo::transport::tcp::CreateDevice(attr);
      context_ = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
      context_->setTimeout(options.timeout);
      context_->connectFullMesh(local ? *local : static_cast<gloo::rendezvous::Store&>(*store_),
                                device);
    } catch (const std::exception& error) {
      throw DistributedError(absl::StrCat("init on rank ", options.rank, " of ", options.world_size,
                                          ": ", who_is_missing(), " (", error.what(), ")"));
    }
  }

  ~GlooGroup() override {
    {
      std::lock_guard lock(queue_mutex_);
      stopping_ = true;
    }
    queued_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  std::future<BufferView> start_collective(Node node, BufferView input,
                                           bool in_background) override {
    if (!in_background || !input.storage->device().is_cpu()) {
      // After the ones in flight, so that every process runs them in the same order.
      {
        std::unique_lock lock(queue_mutex_);
        idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
      }
      std::promise<BufferView> done;
      done.set_value(run_collective(node, input));
      return done.get_future();
    }
    std::packaged_task<BufferView()> task([this, node = std::move(node), input = std::move(input)] {
      return run_collective(node, input);
    });
    std::future<BufferView> result = task.get_future();
    {
      std::lock_guard lock(queue_mutex_);
      if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
      queue_.push_back(std::move(task));
    }
    queued_.notify_one();
    return result;
  }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.world_size; }
  int local_rank() const override { return options_.local_rank; }
  std::chrono::milliseconds timeout() const override { return options_.timeout; }

  BufferView run_collective(const Node& node, const BufferView& input) override {
    std::lock_guard lock(mutex_);
    Intent intent = intent_of(node, collectives_);
    describe_operand(intent, input.dtype, input.shape);
    intent.device_type = static_cast<int64_t>(input.storage->device().type());
    const std::string what =
        absl::StrCat(describe(intent), " (collective #", collectives_, " of rank ", rank(), ")");
    ensure_usable(what);
    // A node made for a job of another size (before a new init()) would exchange other sizes.
    if (node.attrs.has("world") && node.attrs.get_int("world") != size())
      throw DistributedError(absl::StrCat(what, ": made at ", node.where.str(), " for a job of ",
                                          node.attrs.get_int("world"), " processes; this job has ",
                                          size()));
    if (node.attrs.has("root") && node.attrs.get_int("root") >= size())
      throw DistributedError(absl::StrCat(what, ": root ", node.attrs.get_int("root"),
                                          " is not a rank of the ", size(), " processes"));
    agree(intent, what);
    const Device device = input.storage->device();
    // NCCL is loaded at the first CUDA collective, not before: a CPU job never maps it.
    if (device.is_cuda() && options_.backend != "gloo" && nccl_available()) {
      BufferView out = allocate_buffer(device, node.dtype, node.shape);
      try {
        nccl_for(device.index()).run(node, input, out);
      } catch (const DistributedError& error) {
        broken_ = absl::StrCat(what, ": ", who_is_missing(), " [", error.what(), "]");
        throw DistributedError(broken_);
      }
      ++collectives_;
      return out;
    }
    // Gloo; CUDA tensors staged through the host.
    const BufferView host = copy_to_device(input, Device::cpu());
    BufferView out = allocate_buffer(Device::cpu(), node.dtype, node.shape);
    guarded(what, [&] {
      const uint32_t tag = next_tag();
      switch (node.op) {
        case Op::AllReduce:
          all_reduce(host, out, static_cast<ReduceOp>(node.attrs.get_int("reduce_op")), tag);
          break;
        case Op::Broadcast:
          broadcast(host, out, static_cast<int>(node.attrs.get_int("root")), tag);
          break;
        case Op::AllGather:
          all_gather(host, out, node.attrs.get_int("dim"), tag);
          break;
        case Op::ReduceScatter:
          reduce_scatter(host, out, static_cast<ReduceOp>(node.attrs.get_int("reduce_op")),
                         node.attrs.get_int("dim"), tag);
          break;
        default:
          throw VerifierError(absl::StrCat(op_name(node.op), " is not a collective"));
      }
    });
    ++collectives_;
    return device.is_cpu() ? out : copy_to_device(out, device);
  }

  void barrier() override {
    std::lock_guard lock(mutex_);
    const std::string what = absl::StrCat("barrier (rank ", rank(), ")");
    ensure_usable(what);
    guarded(what, [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      opts.setTimeout(options_.timeout);
      gloo::barrier(opts);
    });
  }

  void send(const BufferView& input, int dst) override {
    std::lock_guard lock(mutex_);
    check_peer(dst, "send");
    const std::string what = absl::StrCat("send from rank ", rank(), " to rank ", dst);
    ensure_usable(what);
    const BufferView host = copy_to_device(input, Device::cpu());
    Intent header;
    describe_operand(header, host.dtype, host.shape);
    const uint64_t slot = next_slot(rank(), dst);
    guarded(what, [&] {
      auto head = context_->createUnboundBuffer(&header, sizeof(header));
      head->send(dst, slot);
      const size_t bytes = static_cast<size_t>(numel(host.shape) * dtype_size(host.dtype));
      std::unique_ptr<gloo::transport::UnboundBuffer> data;
      if (bytes > 0) {
        data = context_->createUnboundBuffer(host.data(), bytes);
        data->send(dst, slot + 1);
      }
      wait_send(*head, what);
      if (data) wait_send(*data, what);
    });
  }

  BufferView recv(DType dtype, const Shape& shape, const Device& device, int src) override {
    std::lock_guard lock(mutex_);
    check_peer(src, "recv");
    const std::string what = absl::StrCat("recv on rank ", rank(), " from rank ", src);
    ensure_usable(what);
    Intent expected, header;
    describe_operand(expected, dtype, shape);
    const uint64_t slot = next_slot(src, rank());
    BufferView out = allocate_buffer(Device::cpu(), dtype, shape);
    guarded(what, [&] {
      auto head = context_->createUnboundBuffer(&header, sizeof(header));
      head->recv(src, slot);
      wait_recv(*head, what);
      if (!(header == expected)) {
        // The sender's bytes are on their way: taken and dropped, so that the pair stays in step.
        if (header.rank <= 8) {
          int64_t elements = 1;
          for (int64_t d = 0; d < header.rank; ++d) elements *= header.dims[d];
          std::vector<char> dropped(
              static_cast<size_t>(elements * dtype_size(static_cast<DType>(header.dtype))));
          if (!dropped.empty()) {
            auto data = context_->createUnboundBuffer(dropped.data(), dropped.size());
            data->recv(src, slot + 1);
            wait_recv(*data, what);
          }
        }
        throw DistributedError(absl::StrCat(what, ": rank ", src, " sent ", operand_text(header),
                                            ", the receiver expects ", operand_text(expected)));
      }
      const size_t bytes = static_cast<size_t>(numel(shape) * dtype_size(dtype));
      if (bytes > 0) {
        auto data = context_->createUnboundBuffer(out.data(), bytes);
        data->recv(src, slot + 1);
        wait_recv(*data, what);
      }
    });
    return device.is_cpu() ? out : copy_to_device(out, device);
  }

 private:
  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= size() || peer == rank())
      throw DistributedError(absl::StrCat(what, " on rank ", rank(), ": peer ", peer,
                                          " is not another rank of the ", size(), " processes"));
  }

  uint32_t next_tag() { return static_cast<uint32_t>(tags_++ & 0x3fffffff); }
  // Sends from `from` to `to` are numbered on both sides alike; two slots each (header, data).
  uint64_t next_slot(int from, int to) {
    const uint64_t pair =
        static_cast<uint64_t>(from) * static_cast<uint64_t>(size()) + static_cast<uint64_t>(to);
    return (uint64_t{1} << 62) | (pair << 32) | (2 * (messages_[pair]++ & 0x7fffffff));
  }

  void wait_send(gloo::transport::UnboundBuffer& buffer, const std::string& what) {
    if (!buffer.waitSend(nullptr, options_.timeout))
      throw gloo::IoException(absl::StrCat(what, ": timed out"));
  }
  void wait_recv(gloo::transport::UnboundBuffer& buffer, const std::string& what) {
    if (!buffer.waitRecv(nullptr, options_.timeout))
      throw gloo::IoException(absl::StrCat(what, ": timed out"));
  }

  void ensure_usable(const std::string& what) const {
    if (!broken_.empty())
      throw DistributedError(absl::StrCat(what, ": the process group failed earlier and cannot ",
                                          "run collectives until the job makes a new one (",
                                          broken_, ")"));
  }

  // Every process's intent, compared: the same on all, or a DistributedError on all.
  void agree(const Intent& mine, const std::string& what) {
    std::vector<Intent> all(static_cast<size_t>(size()));
    guarded(what, [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<Intent*>(&mine), 1);
      opts.setOutput(all.data(), all.size());
      opts.setTag(next_tag());
      opts.setTimeout(options_.timeout);
      gloo::allgather(opts);
    });
    for (int r = 0; r < size(); ++r) {
      if (all[r] == all[0]) continue;
      throw DistributedError(
          absl::StrCat(what, ": the processes disagree: rank 0 runs ", describe(all[0]),
                       " as its collective #", all[0].sequence, ", rank ", r, " runs ",
                       describe(all[r]), " as its collective #", all[r].sequence,
                       " (every process must evaluate the same collectives, in the same order, "
                       "on tensors of the same dtype and shape)"));
    }
  }

  // Runs `body`; an engine failure becomes a DistributedError that names who is at fault, and
  // breaks the group.
  template <typename F>
  void guarded(const std::string& what, F&& body) {
    try {
      body();
    } catch (const DistributedError&) {
      throw;
    } catch (const std::exception& error) {
      broken_ = absl::StrCat(what, ": ", who_is_missing(), " [", error.what(), "]");
      throw DistributedError(broken_);
    }
  }

  // Which processes have left or never came, as the rendezvous server saw their connections.
  std::string who_is_missing() {
    if (store_ == nullptr) return "the only process failed";
    for (int attempt = 0; attempt < 30; ++attempt) {
      TcpStore::Presence presence;
      try {
        presence = store_->presence();
      } catch (const DistributedError&) {
        return "rank 0 has left the job (it served the rendezvous)";
      }
      if (!presence.gone.empty())
        return absl::StrCat(presence.gone.size() == 1 ? "rank " : "ranks ",
                            absl::StrJoin(presence.gone, ", "),
                            presence.gone.size() == 1 ? " has" : " have", " left the job");
      if (!presence.never_arrived.empty() && attempt == 29)
        return absl::StrCat(presence.never_arrived.size() == 1 ? "rank " : "ranks ",
                            absl::StrJoin(presence.never_arrived, ", "), " never arrived within ",
                            options_.timeout.count() / 1000.0, " s");
      // A process that just died may not have been noticed by the server yet: up to 3 s.
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return absl::StrCat("no process has left the job, but the others did not take part within ",
                        options_.timeout.count() / 1000.0,
                        " s (every process must evaluate the same collectives in the same order)");
  }

  void all_reduce(const BufferView& in, BufferView& out, ReduceOp op, uint32_t tag) {
    const int64_t n = numel(in.shape);
    std::memcpy(out.data(), in.data(), static_cast<size_t>(n * dtype_size(in.dtype)));
    if (n == 0) return;
    dispatch_storage(in.dtype, [&]<typename S>() {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(static_cast<S*>(out.data()), static_cast<size_t>(n));
      opts.setReduceFunction(combiner<S>(op == ReduceOp::AVG ? ReduceOp::SUM : op));
      opts.setTag(tag);
      opts.setTimeout(options_.timeout);
      gloo::allreduce(opts);
      if (op == ReduceOp::AVG) divide_by_count<S>(out.data(), n, size());
    });
  }

  void broadcast(const BufferView& in, BufferView& out, int root, uint32_t tag) {
    const size_t bytes = static_cast<size_t>(numel(in.shape) * dtype_size(in.dtype));
    std::memcpy(out.data(), in.data(), bytes);
    if (bytes == 0) return;
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<char*>(out.data()), bytes);
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::broadcast(opts);
  }

  void all_gather(const BufferView& in, BufferView& out, int64_t dim, uint32_t tag) {
    const size_t element = static_cast<size_t>(dtype_size(in.dtype));
    const int64_t n = numel(in.shape);
    if (n == 0) return;
    dim = normalize_dim(dim, static_cast<int64_t>(in.shape.size()), "all_gather");
    std::vector<char> gathered(static_cast<size_t>(n * size()) * element);
    gloo::AllgatherOptions opts(context_);
    opts.setInput(static_cast<char*>(in.data()), static_cast<size_t>(n) * element);
    opts.setOutput(gathered.data(), gathered.size());
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::allgather(opts);
    // Rank r's x is part r along dim: for each index before dim, the ranks' runs in turn.
    const int64_t outer = product(in.shape, 0, static_cast<size_t>(dim));
    const size_t run = static_cast<size_t>(n / outer) * element;
    char* target = static_cast<char*>(out.data());
    for (int64_t o = 0; o < outer; ++o)
      for (int r = 0; r < size(); ++r, target += run)
        std::memcpy(target, gathered.data() + (static_cast<size_t>(r * outer + o) * run), run);
  }

  void reduce_scatter(const BufferView& in, BufferView& out, ReduceOp op, int64_t dim,
                      uint32_t tag) {
    const size_t element = static_cast<size_t>(dtype_size(in.dtype));
    const int64_t n = numel(in.shape);
    if (n == 0) return;
    dim = normalize_dim(dim, static_cast<int64_t>(in.shape.size()), "reduce_scatter");
    // Part r of every index before dim, gathered into one run for rank r.
    const int64_t outer = product(in.shape, 0, static_cast<size_t>(dim));
    const size_t part = static_cast<size_t>(n / outer / size()) * element;
    const size_t chunk = part * static_cast<size_t>(outer);
    std::vector<char> arranged(static_cast<size_t>(n) * element), received(arranged.size());
    const char* source = static_cast<const char*>(in.data());
    for (int64_t o = 0; o < outer; ++o)
      for (int r = 0; r < size(); ++r, source += part)
        std::memcpy(arranged.data() + r * chunk + o * part, source, part);
    gloo::AlltoallOptions opts(context_);
    opts.setInput(arranged.data(), arranged.size());
    opts.setOutput(received.data(), received.size());
    opts.setTag(tag);
    opts.setTimeout(options_.timeout);
    gloo::alltoall(opts);
    // The ranks' parts combined in rank order, so every element's bits are defined.
    std::memcpy(out.data(), received.data(), chunk);
    const int64_t count = static_cast<int64_t>(chunk / element);
    dispatch_storage(in.dtype, [&]<typename S>() {
      const auto combine = combiner<S>(op == ReduceOp::AVG ? ReduceOp::SUM : op);
      for (int r = 1; r < size(); ++r)
        combine(out.data(), out.data(), received.data() + r * chunk, static_cast<size_t>(count));
      if (op == ReduceOp::AVG) divide_by_count<S>(out.data(), count, size());
    });
  }

  // Device `index`'s NCCL communicator, made at this collective on every process: rank 0's
  // unique id goes through the store under the collective's number.
  NcclCommunicator& nccl_for(int index) {
    std::unique_ptr<NcclCommunicator>& comm = nccl_[index];
    if (comm == nullptr) {
      const std::string key = absl::StrCat("nccl/cuda:", index, "/", collectives_);
      NcclUniqueId id{};
      if (rank() == 0) {
        id = nccl_unique_id();
        if (store_ != nullptr) store_->set(key, std::vector<char>(id.begin(), id.end()));
      } else {
        const std::vector<char> bytes = store_->get(key);
        std::copy_n(bytes.begin(), std::min(bytes.size(), id.size()), id.begin());
      }
      comm = std::make_unique<NcclCommunicator>(index, rank(), size(), id, options_.timeout);
    }
    return *comm;
  }

  // The communication thread: runs started collectives one at a time, in the order started.
  void work() {
    while (true) {
      std::packaged_task<BufferView()> task;
      {
        std::unique_lock lock(queue_mutex_);
        queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      task();
      {
        std::lock_guard lock(queue_mutex_);
        busy_ = false;
      }
      idle_.notify_all();
    }
  }

  const ProcessGroupOptions options_;
  std::mutex queue_mutex_;
  std::condition_variable queued_, idle_;
  bool busy_ = false;  // the thread runs a collective
  std::deque<std::packaged_task<BufferView()>> queue_;
  bool stopping_ = false;
  std::thread worker_;
  std::map<int, std::unique_ptr<NcclCommunicator>> nccl_;
  std::shared_ptr<TcpStore> store_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::mutex mutex_;  // one collective at a time, in the order the process asks for them
  int64_t collectives_ = 0;
  uint64_t tags_ = 0;
  std::map<uint64_t, uint64_t> messages_;  // per (from, to): messages numbered so far
  std::string broken_;                     // why the group failed, once it has
};

std::mutex default_group_mutex;
std::shared_ptr<ProcessGroup>& default_group() {
  static auto* group = new std::shared_ptr<ProcessGroup>();
  return *group;
}

}  // namespace

std::shared_ptr<ProcessGroup> ProcessGroup::create(const ProcessGroupOptions& options) {
  if (options.backend == "nccl" && !nccl_available())
    throw UnsupportedError(absl::StrCat("init: backend 'nccl': ", nccl_unavailable_reason()));
  if (!options.backend.empty() && options.backend != "gloo" && options.backend != "nccl")
    throw UnsupportedError(absl::StrCat("init: unknown backend '", options.backend,
                                        "' ('gloo', 'nccl', or empty for both)"));
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size)
    throw DistributedError(absl::StrCat("init: rank ", options.rank, " is not one of ",
                                        options.world_size, " processes"));
  // Gloo writes to its peers' sockets without MSG_NOSIGNAL: a peer that died would end this
  // process with SIGPIPE rather than raise the error that names it. A program that left SIGPIPE
  // at its default has it ignored from here on, as Python (and so PyTorch) does at startup.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL)
    ::signal(SIGPIPE, SIG_IGN);
  return std::make_shared<GlooGroup>(options);
}

std::shared_ptr<ProcessGroup> default_process_group() {
  std::lock_guard lock(default_group_mutex);
  return default_group();
}

void set_default_process_group(std::shared_ptr<ProcessGroup> group) {
  std::lock_guard lock(default_group_mutex);
  default_group() = std::move(group);
}

std::future<BufferView> start_collective_step(const Node& node, const BufferView& input,
                                              bool in_background) {
  std::shared_ptr<ProcessGroup> group = default_process_group();
  if (group == nullptr)
    throw DistributedError(absl::StrCat(op_name(node.op), " made at ", node.where.str(),
                                        " runs with no process group: call "
                                        "lazyfuse::distributed::init() first"));
  return group->start_collective(node, contiguous(input), in_background);
}

}  // namespace lazyfuse
