// cuBLAS through dlopen. cuBLAS is column-major: a row-major product C = A B is computed as the
// column-major C^T = B^T A^T, which reads the same memory without any transpose; an operand
// stored transposed is read in place with op T. cuBLASLt, its bias epilogues and its choice of
// algorithm are cublaslt.cc's.
#include "lazyfuse/runtime/cuda/cublas.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/cuda/cublas_shared.h"
#include "lazyfuse/runtime/cuda/cuda_driver.h"
#include "lazyfuse/runtime/cuda/cuda_graphs.h"
#include "lazyfuse/runtime/cuda/cuda_memory.h"
#include "lazyfuse/runtime/env.h"

namespace lazyfuse::cuda {
namespace {

using namespace blas;  // NOLINT: the constants and types both halves share

using cublasHandle_t = struct cublasContext*;
constexpr int kGemmDefault = -1;

struct Cublas {
  bool ok = false;
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*set_stream)(cublasHandle_t, CUstream);
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
    c.set_stream = reinterpret_cast<decltype(c.set_stream)>(dlsym(lib, "cublasSetStream_v2"));
    c.gemm_ex = reinterpret_cast<decltype(c.gemm_ex)>(dlsym(lib, "cublasGemmStridedBatchedEx"));
    c.ok = c.create && c.set_stream && c.gemm_ex;
    return c;
  }();
  return c;
}

cublasHandle_t handle(int device) {
  // Each device's handle, and the stream it was last told to run on.
  struct Bound {
    cublasHandle_t handle = nullptr;
    CUstream stream = nullptr;
  };
  static std::mutex mutex;
  static std::map<int, Bound> handles;
  std::lock_guard lock(mutex);
  Bound& bound = handles[device];
  if (bound.handle == nullptr) {
    check_replayable("the cuBLAS handle is made", false);
    if (cublasStatus_t s = cublas().create(&bound.handle); s != 0) {
      bound.handle = nullptr;
      throw CudaError(absl::StrCat("cublasCreate failed on cuda:", device, " (status ", s, ")"));
    }
  }
  // Its work goes on the device's stream, in order with the kernels (and into their graphs): a
  // user's stream under a CUDAStreamGuard, lazyfuse's own otherwise.
  const CUstream stream = device_stream(device);
  if (bound.stream != stream) {
    if (cublasStatus_t s = cublas().set_stream(bound.handle, stream); s != 0)
      throw CudaError(absl::StrCat("cublasSetStream failed on cuda:", device, " (status ", s, ")"));
    bound.stream = stream;
  }
  return bound.handle;
}

std::atomic<BlasBackend>& blas_backend() {
  static std::atomic<BlasBackend> backend =
      env_config().blas_cublaslt ? BlasBackend::Cublaslt : BlasBackend::Cublas;
  return backend;
}

}  // namespace

namespace blas {

// `stem` ("libcublas") from the loader's path, CUDA 13's or 12's soname first, then the
// toolkit's own copy; null when none loads.
void* open_library(const std::string& stem) {
  for (const std::string& name :
       {stem + ".so.13", stem + ".so.12", stem + ".so", "/usr/local/cuda/lib64/" + stem + ".so.13"})
    if (void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
  return nullptr;
}

int cuda_data_type(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return kCudaR32F;
    case DType::Float64:
      return kCudaR64F;
    case DType::Float16:
      return kCudaR16F;
    case DType::BFloat16:
      return kCudaR16BF;
    default:
      throw UnsupportedError(absl::StrCat("cuBLAS gemm of ", dtype_torch_name(dtype)));
  }
}

// The product by cublasGemmStridedBatchedEx.
void cublas_gemm(int device, DType dtype, const GemmOperand& a, const GemmOperand& b, void* c,
                 int64_t n, int64_t k, int64_t m, int64_t batches) {
  if (!cublas().ok)
    throw UnsupportedError("matmul on a GPU needs cuBLAS (libcublas.so.13), which was not found");
  const int type = cuda_data_type(dtype);
  activate(device);
  cublasHandle_t h = handle(device);
  if (recording() != Recording::Off) {
    const uint64_t words[] = {
        reinterpret_cast<uint64_t>(h),      static_cast<uint64_t>(type),
        reinterpret_cast<uint64_t>(a.data), a.transposed,
        static_cast<uint64_t>(a.ld),        static_cast<uint64_t>(a.batch_stride),
        reinterpret_cast<uint64_t>(b.data), b.transposed,
        static_cast<uint64_t>(b.ld),        static_cast<uint64_t>(b.batch_stride),
        reinterpret_cast<uint64_t>(c),      static_cast<uint64_t>(n),
        static_cast<uint64_t>(k),           static_cast<uint64_t>(m),
        static_cast<uint64_t>(batches)};
    record_words(words);
    if (recording() == Recording::Dry) return;
  }
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

}  // namespace blas

BlasBackend preferred_blas_library() { return blas_backend().load(); }
void set_preferred_blas_library(BlasBackend backend) { blas_backend().store(backend); }

namespace {
std::atomic<bool>& skinny_matmul_setting() {
  static std::atomic<bool> enabled = env_config().skinny_matmul;
  return enabled;
}
std::atomic<int64_t> skinny_matmuls{0};
}  // namespace
bool skinny_matmul_enabled() { return skinny_matmul_setting().load(); }
int64_t skinny_matmul_count() { return skinny_matmuls.load(); }
void count_skinny_matmul() { skinny_matmuls.fetch_add(1, std::memory_order_relaxed); }
void set_skinny_matmul_enabled(bool enabled) { skinny_matmul_setting().store(enabled); }

void gemm_strided_batched(int device, DType dtype, const GemmOperand& a, const GemmOperand& b,
                          void* c, int64_t n, int64_t k, int64_t m, int64_t batches) {
  if (blas::lt_gemm(device, dtype, a, b, c, n, k, m, batches)) return;
  blas::cublas_gemm(device, dtype, a, b, c, n, k, m, batches);
}

}  // namespace lazyfuse::cuda
