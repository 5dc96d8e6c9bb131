// NCCL communicators (runtime/distributed/nccl.h). NCCL's entry points are declared here with the
// library's own types spelled out, as the driver's and cuBLAS's are, so building needs no NCCL
// header.
#include "lazyfuse/runtime/distributed/nccl.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"
#include "lazyfuse/runtime/cuda/cuda_driver.h"

namespace lazyfuse {
namespace {

using ncclResult_t = int;
using ncclComm_t = struct ncclComm*;
struct ncclUniqueId {
  char internal[128];
};
constexpr ncclResult_t kNcclSuccess = 0;
constexpr ncclResult_t kNcclInProgress = 7;
// ncclDataType_t and ncclRedOp_t.
enum NcclType : int {
  kUint8 = 1,
  kInt32 = 2,
  kInt64 = 4,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9
};
enum NcclOp : int { kSum = 0, kMax = 2, kMin = 3, kAvg = 4 };
constexpr cuda::CUresult kErrorNotReady = 600;

struct Nccl {
  std::string error;  // why it did not load
  std::string path;
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*comm_abort)(ncclComm_t) = nullptr;
  ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t*) = nullptr;
  const char* (*get_error_string)(ncclResult_t) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, int, int, ncclComm_t,
                             cuda::CUstream) = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, int, int, ncclComm_t,
                            cuda::CUstream) = nullptr;
  ncclResult_t (*all_gather)(const void*, void*, size_t, int, ncclComm_t, cuda::CUstream) = nullptr;
  ncclResult_t (*reduce_scatter)(const void*, void*, size_t, int, int, ncclComm_t,
                                 cuda::CUstream) = nullptr;
};

const Nccl& nccl() {
  static const Nccl* loaded = [] {
    auto* n = new Nccl;
    std::vector<std::string> names;
    if (const char* given = std::getenv("LAZYFUSE_NCCL_LIBRARY"); given != nullptr && *given)
      names.push_back(given);
    names.insert(names.end(), {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2"});
    void* lib = nullptr;
    for (const std::string& name : names)
      if ((lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    if (lib == nullptr) {
      n->error = "libnccl.so.2 is not installed (LAZYFUSE_NCCL_LIBRARY names another path)";
      return n;
    }
    if (link_map* map = nullptr; dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr)
      n->path = map->l_name;
    auto load = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      if (fn == nullptr && n->error.empty()) n->error = absl::StrCat(n->path, " has no ", symbol);
    };
    load(n->get_unique_id, "ncclGetUniqueId");
    load(n->comm_init_rank, "ncclCommInitRank");
    load(n->comm_destroy, "ncclCommDestroy");
    load(n->comm_abort, "ncclCommAbort");
    load(n->comm_get_async_error, "ncclCommGetAsyncError");
    load(n->get_error_string, "ncclGetErrorString");
    load(n->all_reduce, "ncclAllReduce");
    load(n->broadcast, "ncclBroadcast");
    load(n->all_gather, "ncclAllGather");
    load(n->reduce_scatter, "ncclReduceScatter");
    return n;
  }();
  return *loaded;
}

void check_nccl(ncclResult_t result, const std::string& what) {
  if (result == kNcclSuccess || result == kNcclInProgress) return;
  throw DistributedError(
      absl::StrCat(what, ": NCCL error ", result, ": ", nccl().get_error_string(result)));
}

int nccl_type(DType dtype) {
  switch (dtype) {
    case DType::Bool:
      return kUint8;
    case DType::Int32:
      return kInt32;
    case DType::Int64:
      return kInt64;
    case DType::Float16:
      return kFloat16;
    case DType::BFloat16:
      return kBfloat16;
    case DType::Float32:
      return kFloat32;
    case DType::Float64:
      return kFloat64;
  }
  return kFloat32;
}

// Bool travels as bytes of 0 and 1: a sum of them is their max (or), a min their and.
int nccl_op(ReduceOp op, DType dtype) {
  switch (op) {
    case ReduceOp::SUM:
      return dtype == DType::Bool ? kMax : kSum;
    case ReduceOp::AVG:
      return kAvg;
    case ReduceOp::MAX:
      return kMax;
    case ReduceOp::MIN:
      return kMin;
  }
  return kSum;
}

cuda::CUdeviceptr address(const void* p, size_t byte_offset = 0) {
  return reinterpret_cast<cuda::CUdeviceptr>(p) + byte_offset;
}

// `rows` runs of `run` bytes from a buffer with `source_pitch` between them to one with
// `target_pitch`.
void copy_runs(cuda::CUdeviceptr target, size_t target_pitch, cuda::CUdeviceptr source,
               size_t source_pitch, size_t run, size_t rows, cuda::CUstream stream) {
  cuda::CudaMemcpy2D copy;
  copy.srcDevice = source;
  copy.srcPitch = source_pitch;
  copy.dstDevice = target;
  copy.dstPitch = target_pitch;
  copy.WidthInBytes = run;
  copy.Height = rows;
  cuda::check(cuda::driver()->cuMemcpy2DAsync(&copy, stream), "cuMemcpy2DAsync");
}

}  // namespace

bool nccl_available() { return nccl().error.empty(); }
std::string nccl_unavailable_reason() { return nccl().error; }
std::string nccl_library_path() { return nccl().path; }

NcclUniqueId nccl_unique_id() {
  if (!nccl_available()) throw UnsupportedError(nccl_unavailable_reason());
  ncclUniqueId id;
  check_nccl(nccl().get_unique_id(&id), "ncclGetUniqueId");
  NcclUniqueId out;
  std::copy(std::begin(id.internal), std::end(id.internal), out.begin());
  return out;
}

NcclCommunicator::NcclCommunicator(int device, int rank, int world_size, const NcclUniqueId& id,
                                   std::chrono::milliseconds timeout)
    : device_(device), rank_(rank), world_size_(world_size), timeout_(timeout) {
  if (!nccl_available()) throw UnsupportedError(nccl_unavailable_reason());
  cuda::activate(device);
  ncclUniqueId unique;
  std::copy(id.begin(), id.end(), unique.internal);
  ncclComm_t comm = nullptr;
  check_nccl(
      nccl().comm_init_rank(&comm, world_size, unique, rank),
      absl::StrCat("ncclCommInitRank on cuda:", device, " (rank ", rank, " of ", world_size, ")"));
  comm_ = comm;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) nccl().comm_destroy(static_cast<ncclComm_t>(comm_));
}

void NcclCommunicator::run(const Node& node, const BufferView& input, const BufferView& out) {
  auto comm = static_cast<ncclComm_t>(comm_);
  if (comm == nullptr)
    throw DistributedError(absl::StrCat(op_name(node.op), " on cuda:", device_, " (rank ", rank_,
                                        "): the NCCL communicator was aborted by an earlier "
                                        "failure"));
  cuda::activate(device_);
  const cuda::CUstream stream = cuda::device_stream(device_);
  const int64_t n = numel(input.shape);
  const size_t element = static_cast<size_t>(dtype_size(input.dtype));
  const int type = nccl_type(input.dtype);
  const std::string what = absl::StrCat(op_name(node.op), " on cuda:", device_, " (rank ", rank_,
                                        " of ", world_size_, ")");
  if (n == 0) return;
  // Along a dim other than the first, rank r's part of each index before dim is a run of its own:
  // all_gather gathers whole tensors and then moves the runs; reduce_scatter moves them first.
  const int64_t dim =
      node.attrs.has("dim")
          ? normalize_dim(node.attrs.get_int("dim"), static_cast<int64_t>(input.shape.size()),
                          op_name(node.op))
          : 0;
  int64_t outer = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= input.shape[d];
  switch (node.op) {
    case Op::AllReduce: {
      const auto op = static_cast<ReduceOp>(node.attrs.get_int("reduce_op"));
      check_nccl(nccl().all_reduce(input.data(), out.data(), static_cast<size_t>(n), type,
                                   nccl_op(op, input.dtype), comm, stream),
                 what);
      break;
    }
    case Op::Broadcast:
      check_nccl(nccl().broadcast(input.data(), out.data(), static_cast<size_t>(n), type,
                                  static_cast<int>(node.attrs.get_int("root")), comm, stream),
                 what);
      break;
    case Op::AllGather: {
      if (outer == 1) {
        check_nccl(
            nccl().all_gather(input.data(), out.data(), static_cast<size_t>(n), type, comm, stream),
            what);
        break;
      }
      BufferView gathered = allocate_buffer(out.storage->device(), input.dtype, {n * world_size_});
      check_nccl(nccl().all_gather(input.data(), gathered.data(), static_cast<size_t>(n), type,
                                   comm, stream),
                 what);
      const size_t run = static_cast<size_t>(n / outer) * element;
      for (int r = 0; r < world_size_; ++r)
        copy_runs(address(out.data(), r * run), run * world_size_,
                  address(gathered.data(), r * outer * run), run, run, static_cast<size_t>(outer),
                  stream);
      break;
    }
    case Op::ReduceScatter: {
      const auto op = static_cast<ReduceOp>(node.attrs.get_int("reduce_op"));
      const size_t count = static_cast<size_t>(n / world_size_);
      const void* source = input.data();
      BufferView arranged;
      if (outer > 1) {
        arranged = allocate_buffer(out.storage->device(), input.dtype, {n});
        const size_t part = count / static_cast<size_t>(outer) * element;
        for (int r = 0; r < world_size_; ++r)
          copy_runs(address(arranged.data(), r * outer * part), part,
                    address(input.data(), r * part), part * world_size_, part,
                    static_cast<size_t>(outer), stream);
        source = arranged.data();
      }
      check_nccl(nccl().reduce_scatter(source, out.data(), count, type, nccl_op(op, input.dtype),
                                       comm, stream),
                 what);
      break;
    }
    default:
      throw VerifierError(absl::StrCat(op_name(node.op), " is not a collective"));
  }
  wait(what.c_str());
}

void NcclCommunicator::wait(const char* what) {
  auto comm = static_cast<ncclComm_t>(comm_);
  const cuda::CUstream stream = cuda::device_stream(device_);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (true) {
    const cuda::CUresult state = cuda::driver()->cuStreamQuery(stream);
    if (state == 0) return;
    if (state != kErrorNotReady) cuda::check(state, "cuStreamQuery after an NCCL collective");
    ncclResult_t async = kNcclSuccess;
    nccl().comm_get_async_error(comm, &async);
    const bool failed = async != kNcclSuccess && async != kNcclInProgress;
    if (failed || std::chrono::steady_clock::now() >= deadline) {
      nccl().comm_abort(comm);
      comm_ = nullptr;
      throw DistributedError(
          failed ? absl::StrCat(what, ": NCCL error ", async, ": ", nccl().get_error_string(async))
                 : absl::StrCat(what, ": did not finish within ", timeout_.count() / 1000.0,
                                " s; the communicator was aborted"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace lazyfuse
