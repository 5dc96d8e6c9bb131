// The CPU's elementwise kernels: one function per (op, compute dtype), generated from the
// expressions in ir/ops.def, and the reductions' inner loops. Built three times, for AVX-512
// and AVX2 (SLEEF vector math) and for the x86-64 baseline; the table for the CPU at hand is
// chosen once at run time (LAZYFUSE_CPU_ISA=avx2 or baseline asks for less).
#pragma once

#include <cstdint>
#include <vector>

#include "lazyfuse/codegen/dtype_dispatch.h"
#include "lazyfuse/ir/op.h"

namespace lazyfuse {

// Operand registers in, result register out, n elements. Registers hold at least n rounded up
// to kCpuVectorPad elements, so vector loops run whole vectors into the padding; scalar loops
// stop at n (padding holds stale bytes, not valid values of every type).
using CpuApplyFn = void (*)(const void* const* in, void* out, int64_t n);
using CpuConvertFn = void (*)(const void* in, void* out, int64_t n);
inline constexpr int kCpuVectorPad = 16;

// Reduces n contiguous values of a storage type into a part's running state (CpuReduceState of
// the reduction's accumulator type, CpuAccumulator in codegen/cpu/cpu_reduction.h), the first of
// them at `position` in the part: the value at position p goes into lane p % kCpuReduceLanes.
// The lanes are independent, so additions do not wait on each other, and their number is
// fixed, not the vector width: every instruction set, and a scalar loop over a strided run,
// gives the same bits; and a value's lane depends only on its position, so any split of the
// values into runs gives the same bits too.
using CpuReduceRunFn = void (*)(const void* values, int64_t n, void* state, int64_t position);
inline constexpr int kCpuReduceLanes = 16;
// A sum of float32 values (ir/ops.def, Sum and Mean) adds each lane's values in
// float32 over stretches of kCpuReduceStretch of them (positions [256k, 256k + 256) of a part),
// in order from zero, and adds each stretch's sum into the lane's float64 accumulator when the
// stretch ends (or the part does: CpuReduceState::flush).
inline constexpr int kCpuReduceStretch = 16;
inline constexpr int kCpuReduceStretchSpan = kCpuReduceLanes * kCpuReduceStretch;

// The state of one part's reduction between runs: the lanes' accumulators and, for a sum in
// stretches, each lane's float32 sum of its stretch so far (zero otherwise).
template <typename Acc>
struct CpuReduceState {
  Acc lanes[kCpuReduceLanes];
  float stretch[kCpuReduceLanes];

  // The stretches' sums added into the lanes, and the stretches begun anew. Adding a stretch
  // that holds no value yet adds +0, which changes no lane: a lane starts at +0 and a sum that
  // is -0 only ever comes from -0 + -0.
  void flush() {
    for (int l = 0; l < kCpuReduceLanes; ++l) {
      lanes[l] = static_cast<Acc>(lanes[l] + static_cast<Acc>(stretch[l]));
      stretch[l] = 0.0f;
    }
  }
};

// Elements of a row reduced into one set of lanes, whose results are then combined in order. The
// split depends only on sizes, never on the number of threads, so a reduction gives the same bits
// however many cores run it.
inline constexpr int64_t kCpuReduceBlock = int64_t{1} << 15;

struct CpuKernelTable {
  const char* isa;
  CpuApplyFn apply[kNumOps][kNumComputeSlots];  // null where the op does not take the dtype
  // The same, writing `out` with non-temporal stores (past the caches, without reading each
  // line in first), for a result larger than the caches: `out` 64-byte aligned and n a whole
  // number of vectors. Null where the kernel has no vector loop.
  CpuApplyFn apply_stream[kNumOps][kNumComputeSlots];
  CpuConvertFn convert[kNumComputeSlots][kNumComputeSlots];
  CpuReduceRunFn reduce_run[kNumOps][kNumStorageSlots];  // null for ops that do not reduce
};

const CpuKernelTable& cpu_kernel_table();

// The vector kernel tables this CPU can run, narrowest first: none without AVX2 and FMA.
std::vector<const CpuKernelTable*> cpu_vector_kernel_tables();

namespace cpu_avx512 {
const CpuKernelTable& kernel_table();
}
namespace cpu_avx2 {
const CpuKernelTable& kernel_table();
}
namespace cpu_baseline {
const CpuKernelTable& kernel_table();
}

}  // namespace lazyfuse
