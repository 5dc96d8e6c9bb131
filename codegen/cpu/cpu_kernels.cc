// Chooses the kernel table for the CPU at hand, once: the widest instruction set it supports,
// or less where LAZYFUSE_CPU_ISA asks (for measuring one against another).
#include "lazyfuse/codegen/cpu/cpu_kernels.h"

#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {

const CpuKernelTable& cpu_kernel_table() {
  static const CpuKernelTable& table = [&]() -> const CpuKernelTable& {
    const char* asked = std::getenv("LAZYFUSE_CPU_ISA");
    const std::string_view limit = asked != nullptr ? asked : "";
    if (!limit.empty() && limit != "avx512" && limit != "avx2" && limit != "baseline")
      throw UnsupportedError(absl::StrCat("LAZYFUSE_CPU_ISA=", std::string(limit),
                                          ": expected avx512, avx2 or baseline"));
    if (limit != "baseline") {
      const std::vector<const CpuKernelTable*> tables = cpu_vector_kernel_tables();
      for (auto table = tables.rbegin(); table != tables.rend(); ++table)
        if (limit != "avx2" || std::string_view((*table)->isa) == "avx2") return **table;
    }
    return cpu_baseline::kernel_table();
  }();
  return table;
}

std::vector<const CpuKernelTable*> cpu_vector_kernel_tables() {
  std::vector<const CpuKernelTable*> tables;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    tables.push_back(&cpu_avx2::kernel_table());
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"))
      tables.push_back(&cpu_avx512::kernel_table());
  }
#endif
  return tables;
}

}  // namespace lazyfuse
