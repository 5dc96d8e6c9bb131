// Chooses the kernel table for the CPU at hand, once.
#include "codegen/cpu_kernels.h"

namespace lazyfuse {

const CpuKernelTable& cpu_kernel_table() {
  static const CpuKernelTable& table = [&]() -> const CpuKernelTable& {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      return cpu_avx2::kernel_table();
#endif
    return cpu_baseline::kernel_table();
  }();
  return table;
}

}  // namespace lazyfuse
