// How fused kernels round float16 and bfloat16 values: a switch of the public API
// (set_half_rounding) that fusion keys its kernels by.
#pragma once

namespace lazyfuse {

// Note [Half precision in fused kernels]
// How a fused kernel rounds float16 and bfloat16 values, which it computes in float32:
// - AtStores (the default, as Inductor and XLA do): a value is rounded to its dtype where it is
//   stored, and values inside the kernel keep float32's precision. A fused chain is then more
//   accurate than the same ops one kernel each, and its bits differ from theirs; in bfloat16 it
//   also runs at the memory roof where rounding after each op does not (docs/benchmarks.md).
//   A half value that an op reads into another dtype (a comparison, a promotion, a cast) is read
//   as its dtype holds it, so an argmax's comparison with the rounded maximum finds it. A
//   reduction step's unstored values stay float32 too: the GPU's row kernel reads its
//   reductions unrounded, and the CPU's parts hand each other float32
//   (runtime/cpu/cpu_backend.cc's carried_in_float32). The GPU adds half values' sums in float32
//   (cuda_reduction_accumulator, codegen/cuda/cuda_codegen.h), the CPU in float64. The two devices
//   agree within the half type's tolerance, not bit for bit (their sums add in different
//   orders and types). A GPU row kernel multiplies a half value by the reciprocal of a value
//   of its row where it divides by it (softmax's sum): within 1.5 float32 units in the last
//   place of the quotient before its rounding to the half type. The fuzzer checks half results
//   against float64 (tools/replay.cc).
// - EachOp (LAZYFUSE_HALF_ROUNDING=each_op, set_half_rounding): every op's result is rounded to
//   its dtype, as PyTorch eager does, so a fused chain gives the bits of one kernel per op, on
//   each device (sums of half values add in float64, so that kernels adding in different
//   orders still round to the same half value); the fuzzer checks fused against unfused bit
//   for bit under it.
// Casts to a half type, constants and generators round under both.
enum class HalfRounding { EachOp, AtStores };

}  // namespace lazyfuse
