// cuBLASLt through dlopen: bare products where it is the preferred library, and products with
// a bias (and relu) epilogue, each with an algorithm chosen once per problem and checked against
// the bare product's bits (cuBLAS's half is cublas.cc).
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/cuda/cublas.h"
#include "lazyfuse/runtime/cuda/cublas_shared.h"
#include "lazyfuse/runtime/cuda/cuda_driver.h"
#include "lazyfuse/runtime/cuda/cuda_graphs.h"
#include "lazyfuse/runtime/cuda/cuda_memory.h"
#include "lazyfuse/runtime/env.h"

namespace lazyfuse::cuda {
namespace {

using namespace blas;  // NOLINT: the constants and types both halves share

// cuBLASLt (cublasLt.h), declared here as the rest of the driver and cuBLAS are: opaque
// handles, and the enum values this file uses.
using cublasLtHandle_t = struct cublasLtContext*;
using cublasLtMatmulDesc_t = struct cublasLtMatmulDescOpaque*;
using cublasLtMatrixLayout_t = struct cublasLtMatrixLayoutOpaque*;
using cublasLtMatmulPreference_t = struct cublasLtMatmulPreferenceOpaque*;
struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};
constexpr int kLtDescTransA = 3, kLtDescTransB = 4, kLtDescEpilogue = 7, kLtDescBiasPointer = 8,
              kLtDescBiasDataType = 26;
constexpr uint32_t kLtEpilogueDefault = 1, kLtEpilogueBias = 4, kLtEpilogueReluBias = 2 | 4;
constexpr int kLtPrefMaxWorkspaceBytes = 1, kLtPrefReductionSchemeMask = 3,
              kLtPrefMinAlignmentA = 5, kLtPrefMinAlignmentB = 6, kLtPrefMinAlignmentC = 7,
              kLtPrefMinAlignmentD = 8;
// cublasLtReductionScheme_t: NONE computes each dot product in one sequence, in one kernel;
// the other schemes split K and add the parts up in the output or in a kernel of their own.
constexpr uint32_t kLtReductionNone = 0, kLtReductionAny = 7;
// The workspace each device's cuBLASLt calls may use: what the heuristics ask for the shapes
// of a training step's layers, allocated once per device.
constexpr size_t kLtWorkspaceBytes = 4 << 20;

struct CublasLt {
  bool ok = false;
  cublasStatus_t (*create)(cublasLtHandle_t*);
  cublasStatus_t (*desc_create)(cublasLtMatmulDesc_t*, int, int);
  cublasStatus_t (*desc_set)(cublasLtMatmulDesc_t, int, const void*, size_t);
  cublasStatus_t (*layout_create)(cublasLtMatrixLayout_t*, int, uint64_t, uint64_t, int64_t);
  cublasStatus_t (*preference_create)(cublasLtMatmulPreference_t*);
  cublasStatus_t (*preference_set)(cublasLtMatmulPreference_t, int, const void*, size_t);
  cublasStatus_t (*preference_destroy)(cublasLtMatmulPreference_t);
  cublasStatus_t (*heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                              cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                              cublasLtMatmulHeuristicResult_t*, int*);
  cublasStatus_t (*algo_check)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                               cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                               cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t*,
                               cublasLtMatmulHeuristicResult_t*);
  cublasStatus_t (*matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*,
                           cublasLtMatrixLayout_t, const void*, cublasLtMatrixLayout_t, const void*,
                           const void*, cublasLtMatrixLayout_t, void*, cublasLtMatrixLayout_t,
                           const cublasLtMatmulAlgo_t*, void*, size_t, void*);
};

const CublasLt& cublas_lt() {
  static const CublasLt c = [] {
    CublasLt c;
    void* lib = open_library("libcublasLt");
    if (lib == nullptr) return c;
    auto load = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      return fn != nullptr;
    };
    c.ok = load(c.create, "cublasLtCreate") && load(c.desc_create, "cublasLtMatmulDescCreate") &&
           load(c.desc_set, "cublasLtMatmulDescSetAttribute") &&
           load(c.layout_create, "cublasLtMatrixLayoutCreate") &&
           load(c.preference_create, "cublasLtMatmulPreferenceCreate") &&
           load(c.preference_set, "cublasLtMatmulPreferenceSetAttribute") &&
           load(c.preference_destroy, "cublasLtMatmulPreferenceDestroy") &&
           load(c.heuristic, "cublasLtMatmulAlgoGetHeuristic") &&
           load(c.algo_check, "cublasLtMatmulAlgoCheck") && load(c.matmul, "cublasLtMatmul");
    return c;
  }();
  return c;
}

void check_lt(cublasStatus_t status, const char* what) {
  if (status != 0)
    throw CudaError(absl::StrCat("cuBLASLt ", what, " failed (status ", status, ")"));
}

// A problem's descriptors and the algorithm chosen for it, kept for its next call: a training
// step repeats the same few shapes, and the heuristics cost more than the call.
struct LtPlan {
  bool ok = false;  // an algorithm was found
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// A problem: the cudaDataType, the ops of B^T and A^T, n, k, m, the leading dimensions of B and
// A, the epilogue (kLtEpilogueDefault for the bare product), whether the bare product is
// cuBLASLt's (a float32 epilogue's algorithm reproduces the bare product's bits), and the byte
// alignment of B's, A's, D's and the bias's addresses (up to 256): the heuristics assume 256 unless
// told, and an algorithm chosen for aligned operands refuses a view that starts a few elements in.
struct LtKey {
  int type, op_b, op_a;
  int64_t n, k, m, b_ld, a_ld;
  uint32_t epilogue;
  bool bare_through_lt;
  uint32_t b_alignment, a_alignment, d_alignment, bias_alignment;
  auto operator<=>(const LtKey&) const = default;
};

uint32_t alignment(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  return address == 0 ? 256 : static_cast<uint32_t>(std::min<uintptr_t>(address & -address, 256));
}

LtKey lt_key(DType dtype, const GemmOperand& a, const GemmOperand& b, const void* d,
             const void* bias, int64_t n, int64_t k, int64_t m, uint32_t epilogue,
             bool bare_through_lt) {
  return LtKey{cuda_data_type(dtype),
               b.transposed ? kOpT : kOpN,
               a.transposed ? kOpT : kOpN,
               n,
               k,
               m,
               b.ld,
               a.ld,
               epilogue,
               bare_through_lt,
               alignment(b.data),
               alignment(a.data),
               alignment(d),
               alignment(bias)};
}

struct LtDevice {
  cublasLtHandle_t handle = nullptr;
  CUstream stream = nullptr;  // device_stream's
  void* workspace = nullptr;
  std::map<LtKey, LtPlan> plans;
};

// Every device's cuBLASLt state, behind one lock: the plans are built on first use.
struct LtState {
  std::mutex mutex;
  std::map<int, LtDevice> devices;  // never destroyed: they go with the process
};

LtState& lt_state() {
  static LtState* state = new LtState;
  return *state;
}

// Candidates the heuristics are asked for per problem.
constexpr int kLtCandidates = 32;

// The plan of problem `key` on `state`'s device, its descriptors made on first use (its
// algorithm chosen by the caller). The column-major D^T (m x n) = B^T (m x k) A^T (k x n), as
// gemm_strided_batched computes it.
LtPlan& lt_plan(LtDevice& state, const LtKey& key, const GemmOperand& a, const GemmOperand& b) {
  LtPlan& plan = state.plans[key];
  if (plan.desc != nullptr) return plan;
  const int type = key.type, op_b = key.op_b, op_a = key.op_a;
  const int64_t n = key.n, k = key.k, m = key.m;
  const uint32_t epilogue = key.epilogue;
  const CublasLt& lt = cublas_lt();
  check_lt(lt.desc_create(&plan.desc, kComputeF32, kCudaR32F), "matmul descriptor");
  check_lt(lt.desc_set(plan.desc, kLtDescTransA, &op_b, sizeof(op_b)), "transa");
  check_lt(lt.desc_set(plan.desc, kLtDescTransB, &op_a, sizeof(op_a)), "transb");
  check_lt(lt.desc_set(plan.desc, kLtDescEpilogue, &epilogue, sizeof(epilogue)), "epilogue");
  if (epilogue != kLtEpilogueDefault)
    check_lt(lt.desc_set(plan.desc, kLtDescBiasDataType, &type, sizeof(type)), "bias type");
  // Stored as cuBLASLt reads them: B^T is m x k (k x m when stored transposed), A^T k x n.
  check_lt(lt.layout_create(&plan.a, type, b.transposed ? k : m, b.transposed ? m : k, key.b_ld),
           "layout");
  check_lt(lt.layout_create(&plan.b, type, a.transposed ? n : k, a.transposed ? k : n, key.a_ld),
           "layout");
  check_lt(lt.layout_create(&plan.d, type, m, n, m), "layout");
  return plan;
}

// The algorithms the heuristics offer for `plan` that fit the workspace, best first; with
// `one_sequence`, only those that do not split K.
std::vector<cublasLtMatmulAlgo_t> lt_candidates(LtDevice& state, const LtKey& key,
                                                const LtPlan& plan, bool one_sequence = false) {
  const CublasLt& lt = cublas_lt();
  cublasLtMatmulPreference_t raw_preference = nullptr;
  check_lt(lt.preference_create(&raw_preference), "preference");
  const std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                        cublasStatus_t (*)(cublasLtMatmulPreference_t)>
      owned(raw_preference, lt.preference_destroy);
  cublasLtMatmulPreference_t preference = raw_preference;
  const uint64_t workspace = kLtWorkspaceBytes;
  check_lt(lt.preference_set(preference, kLtPrefMaxWorkspaceBytes, &workspace, sizeof(workspace)),
           "workspace preference");
  const uint32_t reduction_schemes = one_sequence ? kLtReductionNone : kLtReductionAny;
  check_lt(lt.preference_set(preference, kLtPrefReductionSchemeMask, &reduction_schemes,
                             sizeof(reduction_schemes)),
           "reduction scheme preference");
  // cuBLASLt's A is B^T, its B is A^T, its C and D are D^T.
  for (const auto& [attribute, bytes] : {std::pair{kLtPrefMinAlignmentA, key.b_alignment},
                                         std::pair{kLtPrefMinAlignmentB, key.a_alignment},
                                         std::pair{kLtPrefMinAlignmentC, key.d_alignment},
                                         std::pair{kLtPrefMinAlignmentD, key.d_alignment}})
    check_lt(lt.preference_set(preference, attribute, &bytes, sizeof(bytes)),
             "alignment preference");
  cublasLtMatmulHeuristicResult_t results[kLtCandidates] = {};
  int found = 0;
  const cublasStatus_t status = lt.heuristic(state.handle, plan.desc, plan.a, plan.b, plan.d,
                                             plan.d, preference, kLtCandidates, results, &found);
  std::vector<cublasLtMatmulAlgo_t> candidates;
  for (int i = 0; status == 0 && i < found; ++i)
    if (results[i].state == 0 && results[i].workspaceSize <= kLtWorkspaceBytes)
      candidates.push_back(results[i].algo);
  return candidates;
}

// The device's cuBLASLt handle and workspace, made on first use; the caller holds the lock.
LtDevice& lt_device(int device) {
  LtDevice& state = lt_state().devices[device];
  if (state.handle == nullptr) {
    check_replayable("the cuBLASLt handle is made", false);
    // The workspace first: a handle is only kept with its workspace, so a failed allocation
    // is tried again on the next call.
    void* workspace = allocate(device, kLtWorkspaceBytes);
    cublasLtHandle_t handle = nullptr;
    if (cublasStatus_t status = cublas_lt().create(&handle); status != 0) {
      release(device, workspace, kLtWorkspaceBytes);
      check_lt(status, "create");
    }
    state.workspace = workspace;
    state.handle = handle;
  }
  // The device's stream as this call sees it: a user's stream under a CUDAStreamGuard.
  state.stream = device_stream(device);
  return state;
}

// D = the product by `plan` with `algo`, on the device's stream: cuBLASLt's status.
cublasStatus_t lt_call(const LtDevice& state, const LtPlan& plan, const cublasLtMatmulAlgo_t& algo,
                       const GemmOperand& a, const GemmOperand& b, void* d) {
  const float one = 1, zero = 0;
  return cublas_lt().matmul(state.handle, plan.desc, &one, b.data, plan.a, a.data, plan.b, &zero, d,
                            plan.d, d, plan.d, &algo, state.workspace, kLtWorkspaceBytes,
                            state.stream);
}

// One call of `plan` with `algo` on the device's stream (`bias`: the pointer its epilogue was
// given, or null), or its record while a run is recorded (Note [CUDA graph replay]).
void lt_matmul(LtDevice& state, const LtPlan& plan, const cublasLtMatmulAlgo_t& algo,
               const GemmOperand& a, const GemmOperand& b, void* d, const void* bias = nullptr) {
  if (recording() != Recording::Off) {
    const uint64_t words[] = {
        reinterpret_cast<uint64_t>(&plan),  reinterpret_cast<uint64_t>(a.data),
        reinterpret_cast<uint64_t>(b.data), reinterpret_cast<uint64_t>(d),
        reinterpret_cast<uint64_t>(bias),   reinterpret_cast<uint64_t>(state.workspace)};
    record_words(words);
    record_words(algo.data);
    if (recording() == Recording::Dry) return;
  }
  check_lt(lt_call(state, plan, algo, a, b, d), "matmul");
}

// Two events on the device's stream, destroyed however their scope ends.
class EventPair {
 public:
  EventPair() {
    check(driver()->cuEventCreate(&start_, 0), "cuEventCreate");
    if (CUresult result = driver()->cuEventCreate(&stop_, 0); result != 0) {
      driver()->cuEventDestroy(start_);
      check(result, "cuEventCreate");
    }
  }
  ~EventPair() {
    driver()->cuEventDestroy(start_);
    driver()->cuEventDestroy(stop_);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  CUevent start() const { return start_; }
  CUevent stop() const { return stop_; }

 private:
  CUevent start_ = nullptr, stop_ = nullptr;
};

// The GPU time of one call of `algo` on `plan`'s problem (its bias pointer set where it has an
// epilogue), in microseconds: the best of three rounds of four calls, after one to warm up. D is
// written; the caller computes it again.
double lt_call_microseconds(LtDevice& state, const LtPlan& plan, const cublasLtMatmulAlgo_t& algo,
                            const GemmOperand& a, const GemmOperand& b, void* d) {
  constexpr int kRounds = 3, kCalls = 4;
  const DriverApi& api = *driver();
  const EventPair events;
  lt_matmul(state, plan, algo, a, b, d);
  float best_ms = std::numeric_limits<float>::infinity();
  for (int round = 0; round < kRounds; ++round) {
    check(api.cuEventRecord(events.start(), state.stream), "cuEventRecord");
    for (int call = 0; call < kCalls; ++call) lt_matmul(state, plan, algo, a, b, d);
    check(api.cuEventRecord(events.stop(), state.stream), "cuEventRecord");
    check(api.cuEventSynchronize(events.stop()), "cuEventSynchronize");
    float ms = 0;
    check(api.cuEventElapsedTime(&ms, events.start(), events.stop()), "cuEventElapsedTime");
    best_ms = std::min(best_ms, ms);
  }
  return 1000.0 * best_ms / kCalls;
}

// What one more kernel in a product costs a step beyond its GPU time: its launch on the host (a
// bare cuLaunchKernel takes 3.0-3.4 us on the H200, docs/bench/2026-12-04-1001-h200-train.log)
// and the gap before the next dependent kernel. Where splitting K pays, the product is small and
// the step's time is the host's.
constexpr double kKernelOverheadUs = 3.0;

// The algorithm for `plan`'s problem (its bias pointer set where it has an epilogue), or
// nullopt where cuBLASLt has none: the heuristics' first, unless it splits K and their first
// that does not is no slower than it by more than kKernelOverheadUs, measured once per problem.
// A split-K algorithm adds its parts up in a kernel of its own (or in the output, behind
// counters); one that does not is one kernel.
std::optional<cublasLtMatmulAlgo_t> choose_lt_algorithm(LtDevice& state, const LtKey& key,
                                                        const LtPlan& plan, const GemmOperand& a,
                                                        const GemmOperand& b, void* d) {
  const std::vector<cublasLtMatmulAlgo_t> any = lt_candidates(state, key, plan);
  if (any.empty()) return std::nullopt;
  const std::vector<cublasLtMatmulAlgo_t> unsplit = lt_candidates(state, key, plan, true);
  if (unsplit.empty() || std::memcmp(&unsplit.front(), &any.front(), sizeof(any.front())) == 0)
    return any.front();
  const double split_us = lt_call_microseconds(state, plan, any.front(), a, b, d);
  const double unsplit_us = lt_call_microseconds(state, plan, unsplit.front(), a, b, d);
  const bool take_unsplit = unsplit_us <= split_us + kKernelOverheadUs;
  if (env_config().debug > 0)
    std::fprintf(stderr,
                 "[lazyfuse] cuBLASLt %lldx%lldx%lld (type %d, epilogue %u): split K %.1f us, "
                 "unsplit %.1f us: %s\n",
                 static_cast<long long>(key.n), static_cast<long long>(key.k),
                 static_cast<long long>(key.m), key.type, key.epilogue, split_us, unsplit_us,
                 take_unsplit ? "unsplit" : "split K");
  return take_unsplit ? unsplit.front() : any.front();
}

// The plan of a bare product through cuBLASLt, its algorithm choose_lt_algorithm's, chosen on
// first use; the caller holds the lock.
const LtPlan& lt_bare_plan(LtDevice& state, DType dtype, const GemmOperand& a, const GemmOperand& b,
                           void* d, int64_t n, int64_t k, int64_t m) {
  const LtKey key = lt_key(dtype, a, b, d, nullptr, n, k, m, kLtEpilogueDefault, true);
  const bool fresh = state.plans.find(key) == state.plans.end();
  if (fresh) check_replayable("a cuBLASLt plan is chosen", false);
  try {
    LtPlan& plan = lt_plan(state, key, a, b);
    if (fresh) {
      const std::optional<cublasLtMatmulAlgo_t> algo =
          choose_lt_algorithm(state, key, plan, a, b, d);
      plan.ok = algo.has_value();
      if (algo) plan.algo = *algo;
    }
    return plan;
  } catch (...) {
    // Made again on the next call rather than left without an algorithm.
    if (fresh) state.plans.erase(key);
    throw;
  }
}

// A bare product through cuBLASLt on `state`'s (current) device, the caller holding the lock;
// false where cuBLASLt has no algorithm for it (then cublasGemmEx computes it).
bool lt_gemm_locked(LtDevice& state, DType dtype, const GemmOperand& a, const GemmOperand& b,
                    void* c, int64_t n, int64_t k, int64_t m) {
  const LtPlan& plan = lt_bare_plan(state, dtype, a, b, c, n, k, m);
  if (!plan.ok) return false;
  lt_matmul(state, plan, plan.algo, a, b, c);
  return true;
}

// Whether cuBLASLt computes bare products of `dtype` with these sizes: the preferred library,
// loaded, one matrix (batched products stay with cublasGemmStridedBatchedEx), no float64.
bool bare_product_through_lt(DType dtype, int64_t n, int64_t k, int64_t m, int64_t batches) {
  const int64_t limit = std::numeric_limits<int>::max();
  return preferred_blas_library() == BlasBackend::Cublaslt && cublas_lt().ok && batches == 1 &&
         dtype != DType::Float64 && n > 0 && k > 0 && m > 0 && n <= limit && k <= limit &&
         m <= limit;
}

// Device memory for one search or probe, given back however its scope ends.
class ScratchBuffer {
 public:
  ScratchBuffer(int device, int64_t bytes)
      : device_(device), bytes_(bytes), data_(allocate(device, bytes)) {}
  ~ScratchBuffer() { release(device_, data_, bytes_); }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  void* data() const { return data_; }

 private:
  int device_;
  int64_t bytes_;
  void* data_;
};

// The index of the first of `candidates` whose result is the bare product (as
// gemm_strided_batched computes it) followed by the bias add (and relu) in float32, bit for bit,
// on these operands (split-K or another summation order would show), or nullopt. Run once per
// problem: the product by both, its first and last rows copied to the host and compared.
std::optional<size_t> algorithm_with_bare_product_bits(
    int device, LtDevice& state, const LtPlan& plan, const std::function<void(void*)>& bare_product,
    std::span<const cublasLtMatmulAlgo_t> candidates, const GemmOperand& a, const GemmOperand& b,
    const void* bias, bool relu, int64_t n, int64_t k, int64_t m) {
  const int64_t bytes = n * m * static_cast<int64_t>(sizeof(float));
  // The first and the last rows are compared (edge tiles included), so that a big problem's
  // whole product need not cross to the host for each candidate.
  const int64_t head = std::min<int64_t>(n, 64), tail = std::min<int64_t>(n - head, 64);
  const int64_t compared = (head + tail) * m;
  const ScratchBuffer reference_buffer(device, bytes), trial_buffer(device, bytes);
  void* reference = reference_buffer.data();
  void* trial = trial_buffer.data();
  std::optional<size_t> chosen;
  const DriverApi& api = *driver();
  bare_product(reference);
  std::vector<float> want(static_cast<size_t>(compared)), got(want.size());
  std::vector<float> bias_values(static_cast<size_t>(m));
  // The head and the tail rows of a product on the device, into `rows`.
  auto copy_rows = [&](const void* product, std::vector<float>& rows) {
    const auto at = reinterpret_cast<CUdeviceptr>(product);
    const size_t row_bytes = static_cast<size_t>(m) * sizeof(float);
    check(api.cuMemcpyDtoH(rows.data(), at, static_cast<size_t>(head) * row_bytes), "cuMemcpyDtoH");
    if (tail > 0)
      check(api.cuMemcpyDtoH(rows.data() + head * m, at + static_cast<size_t>(n - tail) * row_bytes,
                             static_cast<size_t>(tail) * row_bytes),
            "cuMemcpyDtoH");
  };
  copy_rows(reference, want);
  check(api.cuMemcpyDtoH(bias_values.data(), reinterpret_cast<CUdeviceptr>(bias),
                         bias_values.size() * sizeof(float)),
        "cuMemcpyDtoH");
  // The epilogue as the elementwise kernel computes it: one float32 add, then relu as
  // lf_relu does (a < 0 ? 0 : a, which keeps a NaN and a negative zero).
  for (size_t i = 0; i < want.size(); ++i) {
    const float sum = want[i] + bias_values[i % static_cast<size_t>(m)];
    want[i] = relu && sum < 0 ? 0.0f : sum;
  }
  const CublasLt& lt = cublas_lt();
  check_lt(lt.desc_set(plan.desc, kLtDescBiasPointer, &bias, sizeof(bias)), "bias pointer");
  for (size_t index = 0; index < candidates.size() && !chosen; ++index) {
    if (lt_call(state, plan, candidates[index], a, b, trial) != 0) continue;
    copy_rows(trial, got);
    bool same = true;
    for (size_t i = 0; same && i < got.size(); ++i)
      same = got[i] == want[i] && std::signbit(got[i]) == std::signbit(want[i]);
    if (same) chosen = index;
  }
  return chosen;
}

// Whether `plan`'s relu epilogue keeps a NaN, as the elementwise relu does (PyTorch's relu
// propagates NaN; max(x, 0) would turn it into 0 and hide a diverging run): the product run once
// with a bias whose first element is NaN, the first result read back. Once per plan.
bool relu_keeps_nan(int device, LtDevice& state, const LtPlan& plan,
                    const cublasLtMatmulAlgo_t& algo, DType dtype, const GemmOperand& a,
                    const GemmOperand& b, const void* bias, int64_t n, int64_t m) {
  const size_t element = dtype == DType::Float32 ? 4 : 2;
  const DriverApi& api = *driver();
  std::vector<unsigned char> bias_bytes(static_cast<size_t>(m) * element);
  check(api.cuMemcpyDtoH(bias_bytes.data(), reinterpret_cast<CUdeviceptr>(bias), bias_bytes.size()),
        "cuMemcpyDtoH");
  const uint32_t nan = dtype == DType::Float32    ? 0x7fc00000u
                       : dtype == DType::BFloat16 ? 0x7fc0u
                                                  : 0x7e00u;
  std::memcpy(bias_bytes.data(), &nan, element);
  const int64_t bias_size = static_cast<int64_t>(bias_bytes.size());
  const int64_t out_size = n * m * static_cast<int64_t>(element);
  const ScratchBuffer probe_buffer(device, bias_size), out_buffer(device, out_size);
  void* probe_bias = probe_buffer.data();
  uint32_t first = 0;
  void* out = out_buffer.data();
  check(api.cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(probe_bias), bias_bytes.data(),
                         bias_bytes.size()),
        "cuMemcpyHtoD");
  check_lt(cublas_lt().desc_set(plan.desc, kLtDescBiasPointer, &probe_bias, sizeof(probe_bias)),
           "bias pointer");
  const bool ran = lt_call(state, plan, algo, a, b, out) == 0;
  check_lt(cublas_lt().desc_set(plan.desc, kLtDescBiasPointer, &bias, sizeof(bias)),
           "bias pointer");
  if (!ran) return false;
  check(api.cuMemcpyDtoH(&first, reinterpret_cast<CUdeviceptr>(out), element), "cuMemcpyDtoH");
  // NaN: every exponent bit set and a nonzero mantissa.
  if (dtype == DType::Float32) return (first & 0x7fffffffu) > 0x7f800000u;
  if (dtype == DType::BFloat16) return (first & 0x7fffu) > 0x7f80u;
  return (first & 0x7fffu) > 0x7c00u;
}

// Chooses `plan`'s algorithm (plan.ok false where none will do). Half types take
// choose_lt_algorithm's, or for a relu whose relu turns a NaN into 0, the heuristics' first
// candidate that keeps it. A float32 epilogue keeps the bare product's bits
// (gemm_strided_batched's, whichever library computes it), so that fused and unfused agree: its
// algorithm is the first candidate whose result equals the bare product followed by the bias add
// (and relu), else there is none; the bare product's own algorithm, where it takes the epilogue,
// goes first. A relu epilogue must also keep a NaN as the elementwise relu does (relu_keeps_nan).
void choose_epilogue_algorithm(int device, LtDevice& state, const LtKey& key, LtPlan& plan,
                               DType dtype, const GemmOperand& a, const GemmOperand& b,
                               const void* bias, bool relu, void* d, int64_t n, int64_t k,
                               int64_t m) {
  const bool through_lt = key.bare_through_lt;
  if (dtype != DType::Float32) {
    check_lt(cublas_lt().desc_set(plan.desc, kLtDescBiasPointer, &bias, sizeof(bias)),
             "bias pointer");
    const std::optional<cublasLtMatmulAlgo_t> algo = choose_lt_algorithm(state, key, plan, a, b, d);
    plan.ok = algo.has_value();
    if (algo) plan.algo = *algo;
    if (plan.ok && relu &&
        !relu_keeps_nan(device, state, plan, plan.algo, dtype, a, b, bias, n, m)) {
      // Some kernels' relu is max(x, 0), others' keeps a NaN: the heuristics' next candidates,
      // in order, for the first that keeps it.
      const std::vector<cublasLtMatmulAlgo_t> candidates = lt_candidates(state, key, plan);
      const auto keeps = std::find_if(candidates.begin(), candidates.end(), [&](const auto& c) {
        return relu_keeps_nan(device, state, plan, c, dtype, a, b, bias, n, m);
      });
      plan.ok = keeps != candidates.end();
      if (plan.ok) plan.algo = *keeps;
      if (env_config().debug > 0)
        std::fprintf(
            stderr,
            "[lazyfuse] cuBLASLt bias+relu epilogue, %s %lldx%lldx%lld: the chosen "
            "algorithm's relu turns NaN into 0; %s of %zu candidates keeps it\n",
            dtype_torch_name(dtype), static_cast<long long>(n), static_cast<long long>(k),
            static_cast<long long>(m),
            plan.ok ? absl::StrCat("number ", keeps - candidates.begin() + 1).c_str() : "none",
            candidates.size());
    }
    return;
  }
  // A float32 epilogue keeps the bare product's bits (gemm_strided_batched's, whichever
  // library computes it), so that fused and unfused agree: its algorithm is the first
  // candidate whose result equals the bare product followed by the bias add (and relu), else
  // there is none. The bare product's own algorithm, where it takes the epilogue, goes first.
  auto bare_product = [&](void* out) {
    if (!through_lt || !lt_gemm_locked(state, dtype, a, b, out, n, k, m))
      cublas_gemm(device, dtype, a, b, out, n, k, m, 1);
  };
  std::vector<cublasLtMatmulAlgo_t> candidates = lt_candidates(state, key, plan);
  if (through_lt) {
    const LtPlan& bare = lt_bare_plan(state, dtype, a, b, d, n, k, m);
    cublasLtMatmulHeuristicResult_t checked{};
    if (bare.ok &&
        cublas_lt().algo_check(state.handle, plan.desc, plan.a, plan.b, plan.d, plan.d, &bare.algo,
                               &checked) == 0 &&
        checked.workspaceSize <= kLtWorkspaceBytes)
      candidates.insert(candidates.begin(), bare.algo);
  }
  const std::optional<size_t> chosen = algorithm_with_bare_product_bits(
      device, state, plan, bare_product, candidates, a, b, bias, relu, n, k, m);
  plan.ok = chosen.has_value();
  if (chosen) plan.algo = candidates[*chosen];
  if (env_config().debug > 0)
    std::fprintf(stderr,
                 "[lazyfuse] cuBLASLt %s epilogue, float32 %lldx%lldx%lld: %s of %zu "
                 "candidates has the bare product's bits (%s)\n",
                 relu ? "bias+relu" : "bias", static_cast<long long>(n), static_cast<long long>(k),
                 static_cast<long long>(m),
                 chosen ? absl::StrCat("number ", *chosen + 1).c_str() : "none", candidates.size(),
                 through_lt ? "cuBLASLt" : "cublasGemmEx");
  if (plan.ok && relu && !relu_keeps_nan(device, state, plan, plan.algo, dtype, a, b, bias, n, m)) {
    plan.ok = false;
    if (env_config().debug > 0)
      std::fprintf(stderr,
                   "[lazyfuse] cuBLASLt bias+relu epilogue, %s %lldx%lldx%lld: its relu turns "
                   "NaN into 0 where relu keeps it; not used\n",
                   dtype_torch_name(dtype), static_cast<long long>(n), static_cast<long long>(k),
                   static_cast<long long>(m));
  }
}

}  // namespace

bool blas::lt_gemm(int device, DType dtype, const GemmOperand& a, const GemmOperand& b, void* c,
                   int64_t n, int64_t k, int64_t m, int64_t batches) {
  if (!bare_product_through_lt(dtype, n, k, m, batches)) return false;
  LtState& shared = lt_state();
  std::lock_guard lock(shared.mutex);
  activate(device);
  return lt_gemm_locked(lt_device(device), dtype, a, b, c, n, k, m);
}

bool gemm_bias_epilogue(int device, DType dtype, const GemmOperand& a, const GemmOperand& b,
                        const void* bias, bool relu, void* d, int64_t n, int64_t k, int64_t m) {
  const bool float32 = dtype == DType::Float32;
  if ((!float32 && dtype != DType::Float16 && dtype != DType::BFloat16) || !cublas_lt().ok ||
      n == 0 || m == 0 || k == 0 || reinterpret_cast<uintptr_t>(bias) % 16 != 0)
    return false;
  const int64_t limit = std::numeric_limits<int>::max();
  if (n > limit || m > limit || k > limit) return false;
  const bool through_lt = bare_product_through_lt(dtype, n, k, m, 1);
  const LtKey key = lt_key(dtype, a, b, d, bias, n, k, m,
                           relu ? kLtEpilogueReluBias : kLtEpilogueBias, through_lt);
  LtState& shared = lt_state();
  std::lock_guard lock(shared.mutex);
  activate(device);
  LtDevice& state = lt_device(device);
  const bool fresh = state.plans.find(key) == state.plans.end();
  if (fresh) check_replayable("a cuBLASLt plan is chosen", false);
  LtPlan* made = nullptr;
  try {
    made = &lt_plan(state, key, a, b);
    if (fresh)
      choose_epilogue_algorithm(device, state, key, *made, dtype, a, b, bias, relu, d, n, k, m);
  } catch (...) {
    // Made again on the next call rather than left without an algorithm.
    if (fresh) state.plans.erase(key);
    throw;
  }
  const LtPlan& plan = *made;
  if (!plan.ok) return false;
  check_lt(cublas_lt().desc_set(plan.desc, kLtDescBiasPointer, &bias, sizeof(bias)),
           "bias pointer");
  lt_matmul(state, plan, plan.algo, a, b, d, bias);
  return true;
}

}  // namespace lazyfuse::cuda
