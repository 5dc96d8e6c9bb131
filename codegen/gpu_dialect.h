// Note [GPU dialect]
// The GPU generators (codegen/cuda/) write kernels in the C++ dialect that CUDA's NVRTC and
// HIP's hiprtc both compile: threadIdx, __shared__, __syncthreads, atomics and launch bounds
// read the same in both. What differs between GPU vendors sits in one description instead of
// in the generators: the width of a warp (the lanes that exchange values through shuffles, and
// the tiles sized by them), the shuffle intrinsics, a load that bypasses the L1 cache, the
// qualifiers of a kernel and of a helper, and the prologue every kernel starts with (the half
// types' conversions, which CUDA writes as inline PTX, and the lf_* functions ops call). CUDA's
// description is codegen/cuda/cuda_dialect.cc; a second GPU backend brings its own and selects
// it at build time, as the generators read gpu_dialect() rather than a description passed in.
#pragma once

#include <string>

namespace lazyfuse {

class GpuDialect {
 public:
  virtual ~GpuDialect() = default;
  // "cuda".
  virtual const char* name() const = 0;
  // The lanes of a warp: what shuffles combine and row and column kernels tile by.
  virtual int warp_size() const = 0;
  // What every kernel's source starts with.
  virtual const std::string& prologue() const = 0;
  // The head of kernel `name` of at most `threads` threads a block, up to its parameter list.
  virtual std::string kernel(const std::string& name, int threads) const = 0;
  // The qualifiers of a helper function the kernels call, inlined.
  virtual const char* device_function() const = 0;
  // `value` from the lane `delta` above, across the whole warp.
  virtual std::string shuffle_down(const std::string& value, const std::string& delta) const = 0;
  // `value` from the lane whose index differs from this one's in the bits of `mask`.
  virtual std::string shuffle_xor(const std::string& value, const std::string& mask) const = 0;
  // The element at `pointer`, read past the L1 cache (written by another block of the launch).
  virtual std::string load_bypassing_l1(const std::string& pointer) const = 0;
};

// The dialect the GPU generators write (CUDA's).
const GpuDialect& gpu_dialect();

}  // namespace lazyfuse
