// The CPU's elementwise kernels: one function per (op, compute dtype), generated from the
// expressions in ir/ops.def, and the reductions' inner loops. Built three times, for AVX-512
// and AVX2 (SLEEF vector math) and for the x86-64 baseline; the table for the CPU at hand is
// chosen once at run time (LAZYFUSE_CPU_ISA=avx2 or baseline asks for less).
#pragma once

#include <cstdint>

#include "lazyfuse/codegen/dtype_dispatch.h"
#include "lazyfuse/ir/op.h"

namespace lazyfuse {

// Operand registers in, result register out, n elements. Registers hold at least n rounded up
// to kCpuVectorPad elements, so vector loops run whole vectors into the padding; scalar loops
// stop at n (padding holds stale bytes, not valid values of every type).
using CpuApplyFn = void (*)(const void* const* in, void* out, int64_t n);
using CpuConvertFn = void (*)(const void* in, void* out, int64_t n);
inline constexpr int kCpuVectorPad = 16;

// Reduces n contiguous values of a storage type into kCpuReduceLanes accumulators of the
// reduction's accumulator type (CpuAccumulator in codegen/cpu_reduction.h), combining value j
// into lane (first_lane + j) % kCpuReduceLanes. The lanes are independent, so additions do not
// wait on each other, and their number is fixed, not the vector width: every instruction set,
// and a scalar loop over a strided run, gives the same bits; and a value's lane depends only on
// its position, so any split of the values into runs gives the same bits too.
using CpuReduceRunFn = void (*)(const void* values, int64_t n, void* lanes, int first_lane);
inline constexpr int kCpuReduceLanes = 16;
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
