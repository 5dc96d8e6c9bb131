// cuBLAS and cuBLASLt through dlopen. cuBLAS is column-major: a row-major product C = A B is
// computed as the column-major C^T = B^T A^T, which reads the same memory without any transpose; an
// operand stored transposed is read in place with op T.
#include "runtime/cublas.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
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
#include "ir/errors.h"
#include "runtime/cuda_driver.h"
#include "runtime/cuda_memory.h"

namespace lazyfuse::cuda {
namespace {

using cublasHandle_t = struct cublasContext*;
using cublasStatus_t = int;
constexpr int kOpN = 0, kOpT = 1;
// cudaDataType and cublasComputeType_t values (library_types.h, cublas_api.h).
constexpr int kCudaR32F = 0, kCudaR64F = 1, kCudaR16F = 2, kCudaR16BF = 14;
constexpr int kComputeF32 = 68, kComputeF64 = 70;
constexpr int kGemmDefault = -1;

// `stem` ("libcublas") from the loader's path, CUDA 13's or 12's soname first, then the
// toolkit's own copy; null when none loads.
void* open_library(const std::string& stem) {
  for (const std::string& name :
       {stem + ".so.13", stem + ".so.12", stem + ".so", "/usr/local/cuda/lib64/" + stem + ".so.13"})
    if (void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
  return nullptr;
}

struct Cublas {
  bool ok = false;
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*gemm_ex)(cublasHandle_t, int, int, int, int, int, const void*, const void*, int,
                            int, long long, const void*, int, int, long long, const void*, void*,
                            int, int, long long, int, int, int);
};

const Cublas& cublas() {
  static const Cublas c = [] {
    Cublas c;
    void* lib = open_library("libcublas");
    if (lib == nullptr) return c;
    c.create = reinterpret_cast<decltype(c.create)>(dlsym(lib, "cublasCreate_v2"));
    c.gemm_ex = reinterpret_cast<decltype(c.gemm_ex)>(dlsym(lib, "cublasGemmStridedBatchedEx"));
    c.ok = c.create && c.gemm_ex;
    return c;
  }();
  return c;
}

cublasHandle_t handle(int device) {
  static std::mutex mutex;
  static std::map<int, cublasHandle_t> handles;
  std::lock_guard lock(mutex);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasHandle_t h = nullptr;
  if (cublasStatus_t s = cublas().create(&h); s != 0)
    throw CudaError(absl::StrCat("cublasCreate failed on cuda:", device, " (status ", s, ")"));
  return handles[device] = h;
}

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
constexpr uint32_t kLtEpilogueBias = 4, kLtEpilogueReluBias = 2 | 4;
constexpr int kLtPrefMaxWorkspaceBytes = 1;
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
  cublasStatus_t (*heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                              cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                              cublasLtMatmulHeuristicResult_t*, int*);
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
           load(c.heuristic, "cublasLtMatmulAlgoGetHeuristic") && load(c.matmul, "cublasLtMatmul");
    return c;
  }();
  return c;
}

void check_lt(cublasStatus_t status, const char* what) {
  if (status != 0)
    throw CudaError(absl::StrCat("cuBLASLt ", what, " failed (status ", status, ")"));
}

// A problem's descriptors and the algorithm the heuristics chose, kept for its next call: a
// training step repeats the same few shapes, and the heuristics cost more than the call.
struct LtPlan {
  bool ok = false;  // an algorithm was found
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct LtDevice {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<std::tuple<int, int, int, int64_t, int64_t, int64_t, int64_t, int64_t, bool>, LtPlan>
      plans;
};

// Heuristic results asked for when the choice must match cublasGemmEx's bits (float32).
constexpr int kLtCandidates = 32;

// The first of `candidates` whose result is that of cublasGemmEx followed by the bias add (and
// relu) in float32, bit for bit, on these operands (split-K or another summation order would
// show), or nullopt. Run once per problem: the product by both, its first rows copied to the
// host and compared.
std::optional<cublasLtMatmulAlgo_t> algorithm_with_gemm_ex_bits(
    int device, LtDevice& state, const LtPlan& plan,
    std::span<const cublasLtMatmulHeuristicResult_t> candidates, const GemmOperand& a,
    const GemmOperand& b, const void* bias, bool relu, int64_t n, int64_t k, int64_t m) {
  const int64_t bytes = n * m * static_cast<int64_t>(sizeof(float));
  // The first and the last rows are compared (edge tiles included), so that a big problem's
  // whole product need not cross to the host for each candidate.
  const int64_t head = std::min<int64_t>(n, 64), tail = std::min<int64_t>(n - head, 64);
  const int64_t compared = (head + tail) * m;
  void* reference = allocate(device, bytes);
  void* trial = allocate(device, bytes);
  std::optional<cublasLtMatmulAlgo_t> chosen;
  try {
    const DriverApi& api = *driver();
    gemm_strided_batched(device, DType::Float32, a, b, reference, n, k, m, 1);
    std::vector<float> want(static_cast<size_t>(compared)), got(want.size());
    std::vector<float> bias_values(static_cast<size_t>(m));
    // The head and the tail rows of a product on the device, into `rows`.
    auto copy_rows = [&](const void* product, std::vector<float>& rows) {
      const auto at = reinterpret_cast<CUdeviceptr>(product);
      const size_t row_bytes = static_cast<size_t>(m) * sizeof(float);
      check(api.cuMemcpyDtoH(rows.data(), at, static_cast<size_t>(head) * row_bytes),
            "cuMemcpyDtoH");
      if (tail > 0)
        check(
            api.cuMemcpyDtoH(rows.data() + head * m, at + static_cast<size_t>(n - tail) * row_bytes,
                             static_cast<size_t>(tail) * row_bytes),
            "cuMemcpyDtoH");
    };
    copy_rows(reference, want);
    check(api.cuMemcpyDtoH(bias_values.data(), reinterpret_cast<CUdeviceptr>(bias),
                           bias_values.size() * sizeof(float)),
          "cuMemcpyDtoH");
    // The epilogue as the elementwise kernel computes it: one float32 add, then max(0, .).
    for (size_t i = 0; i < want.size(); ++i) {
      const float sum = want[i] + bias_values[i % static_cast<size_t>(m)];
      want[i] = relu ? (sum > 0 ? sum : 0.0f) : sum;
    }
    const CublasLt& lt = cublas_lt();
    check_lt(lt.desc_set(plan.desc, kLtDescBiasPointer, &bias, sizeof(bias)), "bias pointer");
    const float one = 1, zero = 0;
    for (const cublasLtMatmulHeuristicResult_t& candidate : candidates) {
      if (candidate.state != 0) continue;
      if (lt.matmul(state.handle, plan.desc, &one, b.data, plan.a, a.data, plan.b, &zero, trial,
                    plan.d, trial, plan.d, &candidate.algo, state.workspace, kLtWorkspaceBytes,
                    nullptr) != 0)
        continue;
      copy_rows(trial, got);
      bool same = true;
      for (size_t i = 0; same && i < got.size(); ++i)
        same = got[i] == want[i] && std::signbit(got[i]) == std::signbit(want[i]);
      if (same) {
        chosen = candidate.algo;
        break;
      }
    }
  } catch (...) {
    release(device, reference, bytes);
    release(device, trial, bytes);
    throw;
  }
  release(device, reference, bytes);
  release(device, trial, bytes);
  return chosen;
}

}  // namespace

bool gemm_bias_epilogue(int device, DType dtype, const GemmOperand& a, const GemmOperand& b,
                        const void* bias, bool relu, void* d, int64_t n, int64_t k, int64_t m) {
  // A float32 product keeps cublasGemmEx's bits, PyTorch's eager matmul's: cuBLASLt's first
  // choice may sum in another (as exact) order, which Adam amplifies (65 steps of docs/bench's
  // MLP drifted 2.4e-3 from PyTorch's losses, where cublasGemmEx's bits stay within 1e-7 over
  // 100). So float32 takes the first candidate with cublasGemmEx's bits, or no epilogue.
  const bool float32 = dtype == DType::Float32;
  const int type = dtype == DType::Float16    ? kCudaR16F
                   : dtype == DType::BFloat16 ? kCudaR16BF
                   : float32                  ? kCudaR32F
                                              : -1;
  if (type < 0 || !cublas_lt().ok || n == 0 || m == 0 || k == 0 ||
      reinterpret_cast<uintptr_t>(bias) % 16 != 0)
    return false;
  const int limit = std::numeric_limits<int>::max();
  if (n > limit || m > limit || k > limit) return false;
  static std::mutex mutex;
  static std::map<int, LtDevice> devices;  // never destroyed: they go with the process
  std::lock_guard lock(mutex);
  activate(device);
  LtDevice& state = devices[device];
  if (state.handle == nullptr) {
    check_lt(cublas_lt().create(&state.handle), "create");
    state.workspace = allocate(device, kLtWorkspaceBytes);
  }
  // Column-major D^T (m x n) = B^T (m x k) A^T (k x n), as gemm_strided_batched computes it; the
  // bias runs down D^T's rows, one value per row, which is what cuBLASLt's bias epilogue adds.
  const int op_b = b.transposed ? kOpT : kOpN, op_a = a.transposed ? kOpT : kOpN;
  const auto key = std::make_tuple(type, op_b, op_a, n, k, m, b.ld, a.ld, relu);
  LtPlan& plan = state.plans[key];
  if (plan.desc == nullptr) {
    const CublasLt& lt = cublas_lt();
    check_lt(lt.desc_create(&plan.desc, kComputeF32, kCudaR32F), "matmul descriptor");
    check_lt(lt.desc_set(plan.desc, kLtDescTransA, &op_b, sizeof(op_b)), "transa");
    check_lt(lt.desc_set(plan.desc, kLtDescTransB, &op_a, sizeof(op_a)), "transb");
    const uint32_t epilogue = relu ? kLtEpilogueReluBias : kLtEpilogueBias;
    check_lt(lt.desc_set(plan.desc, kLtDescEpilogue, &epilogue, sizeof(epilogue)), "epilogue");
    check_lt(lt.desc_set(plan.desc, kLtDescBiasDataType, &type, sizeof(type)), "bias type");
    // Stored as cuBLASLt reads them: B^T is m x k (k x m when stored transposed), A^T k x n.
    check_lt(lt.layout_create(&plan.a, type, b.transposed ? k : m, b.transposed ? m : k, b.ld),
             "layout");
    check_lt(lt.layout_create(&plan.b, type, a.transposed ? n : k, a.transposed ? k : n, a.ld),
             "layout");
    check_lt(lt.layout_create(&plan.d, type, m, n, m), "layout");
    cublasLtMatmulPreference_t preference = nullptr;
    check_lt(lt.preference_create(&preference), "preference");
    const uint64_t workspace = kLtWorkspaceBytes;
    check_lt(lt.preference_set(preference, kLtPrefMaxWorkspaceBytes, &workspace, sizeof(workspace)),
             "workspace preference");
    cublasLtMatmulHeuristicResult_t results[kLtCandidates] = {};
    int found = 0;
    const cublasStatus_t status =
        lt.heuristic(state.handle, plan.desc, plan.a, plan.b, plan.d, plan.d, preference,
                     float32 ? kLtCandidates : 1, results, &found);
    if (status == 0 && found > 0) {
      if (float32) {
        const std::optional<cublasLtMatmulAlgo_t> algo = algorithm_with_gemm_ex_bits(
            device, state, plan, std::span(results, static_cast<size_t>(found)), a, b, bias, relu,
            n, k, m);
        plan.ok = algo.has_value();
        if (algo) plan.algo = *algo;
      } else {
        plan.ok = results[0].state == 0;
        plan.algo = results[0].algo;
      }
    }
  }
  if (!plan.ok) return false;
  const CublasLt& lt = cublas_lt();
  check_lt(lt.desc_set(plan.desc, kLtDescBiasPointer, &bias, sizeof(bias)), "bias pointer");
  const float one = 1, zero = 0;
  check_lt(lt.matmul(state.handle, plan.desc, &one, b.data, plan.a, a.data, plan.b, &zero, d,
                     plan.d, d, plan.d, &plan.algo, state.workspace, kLtWorkspaceBytes, nullptr),
           "matmul");
  return true;
}

void gemm_strided_batched(int device, DType dtype, const GemmOperand& a, const GemmOperand& b,
                          void* c, int64_t n, int64_t k, int64_t m, int64_t batches) {
  if (!cublas().ok)
    throw UnsupportedError("matmul on a GPU needs cuBLAS (libcublas.so.13), which was not found");
  int type = kCudaR32F;
  switch (dtype) {
    case DType::Float32:
      break;
    case DType::Float64:
      type = kCudaR64F;
      break;
    case DType::Float16:
      type = kCudaR16F;
      break;
    case DType::BFloat16:
      type = kCudaR16BF;
      break;
    default:
      throw UnsupportedError(absl::StrCat("cuBLAS gemm of ", dtype_torch_name(dtype)));
  }
  activate(device);
  cublasHandle_t h = handle(device);
  // Column-major C^T (m x n) = B^T (m x k) A^T (k x n): a row-major operand is its column-major
  // transpose as it lies, and one stored transposed is read with op T.
  const double one_d = 1, zero_d = 0;
  const float one_f = 1, zero_f = 0;
  const bool wide = dtype == DType::Float64;
  const cublasStatus_t status = cublas().gemm_ex(
      h, b.transposed ? kOpT : kOpN, a.transposed ? kOpT : kOpN, static_cast<int>(m),
      static_cast<int>(n), static_cast<int>(k), wide ? static_cast<const void*>(&one_d) : &one_f,
      b.data, type, static_cast<int>(b.ld), b.batch_stride, a.data, type, static_cast<int>(a.ld),
      a.batch_stride, wide ? static_cast<const void*>(&zero_d) : &zero_f, c, type,
      static_cast<int>(std::max<int64_t>(m, 1)), n * m, static_cast<int>(batches),
      wide ? kComputeF64 : kComputeF32, kGemmDefault);
  if (status != 0)
    throw CudaError(absl::StrCat("cuBLAS gemm failed on cuda:", device, " (status ", status,
                                 ", n=", n, " k=", k, " m=", m, " batches=", batches, ")"));
}

}  // namespace lazyfuse::cuda
