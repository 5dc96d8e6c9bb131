// CUDA's words for what the GPU generators write (Note [GPU dialect] in codegen/gpu_dialect.h),
// and its prologue: codegen/cuda/cuda_prologue.cuh (half conversions through inline PTX) and
// codegen/philox.h, embedded at build time.
#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/codegen/gpu_dialect.h"

namespace lazyfuse {
namespace {

#include "codegen/cuda_prologue.inc"  // generated into the build tree

class CudaDialect final : public GpuDialect {
 public:
  const char* name() const override { return "cuda"; }
  int warp_size() const override { return 32; }
  const std::string& prologue() const override { return cuda_prologue(); }
  std::string kernel(const std::string& name, int threads) const override {
    return absl::StrCat("extern \"C\" __global__ void __launch_bounds__(", threads, ") ", name);
  }
  const char* device_function() const override { return "__device__ __forceinline__"; }
  std::string shuffle_down(const std::string& value, const std::string& delta) const override {
    return absl::StrCat("__shfl_down_sync(0xffffffffu, ", value, ", ", delta, ")");
  }
  std::string shuffle_xor(const std::string& value, const std::string& mask) const override {
    return absl::StrCat("__shfl_xor_sync(0xffffffffu, ", value, ", ", mask, ")");
  }
  std::string load_bypassing_l1(const std::string& pointer) const override {
    return absl::StrCat("__ldcg(", pointer, ")");
  }
};

}  // namespace

const std::string& cuda_prologue() {
  static const std::string prologue = std::string(kCudaPrologue) + kPhiloxSource;
  return prologue;
}

const GpuDialect& gpu_dialect() {
  static const CudaDialect dialect;
  return dialect;
}

}  // namespace lazyfuse
