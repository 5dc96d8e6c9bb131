// The CPU JIT as lazyfuse sees it: loaded at run time (liblazyfuse_cpu_jit.so, which links LLVM;
// codegen/cpu/cpu_jit.cc), used by CpuProgram::run for the programs it can compile, and absent
// without harm: CPU programs then run in the interpreter, which computes the same bits.
#pragma once

#include <cstdint>
#include <string>

#include "lazyfuse/codegen/cpu/cpu_jit_abi.h"
#include "lazyfuse/ir/op.h"

namespace lazyfuse {

// When CPU programs are compiled (LAZYFUSE_CPU_JIT): Off, never; Hot (the default), a program
// of at least kCpuJitMinElements elements once it has computed both one evaluation's elements
// and kCpuJitWorkElements in all, so that a graph evaluated once never waits for LLVM and a
// small one repeated is compiled once the interpreter has spent about what a compile costs;
// Always, every program it can compile, on its first run (tests).
enum class CpuJitMode { Off, Hot, Always };
inline constexpr int64_t kCpuJitMinElements = int64_t{1} << 10;
inline constexpr int64_t kCpuJitWorkElements = int64_t{1} << 22;
CpuJitMode cpu_jit_mode();
void set_cpu_jit_mode(CpuJitMode mode);

// Whether the JIT library loaded (and LLVM with it); if not, why.
bool cpu_jit_available();
std::string cpu_jit_unavailable_reason();

// The vector lanes of float32 (or float64) programs under the interpreter's instruction set
// (cpu_kernel_table().isa); 0 where the JIT has no code for it or is not available.
int32_t cpu_jit_lanes(bool double_precision);
// The instruction set the JIT compiles for: the interpreter's kernels'.
const char* cpu_jit_isa();

// The op function that computes `op` on one vector (codegen/cpu/cpu_jit_ops.cc).
const char* cpu_jit_function(Op op, bool double_precision);

// A compiled kernel and what holds its code (null kernel: the JIT failed, counted in
// cpu_jit_stats().failures with the message in last_failure).
struct CpuJitKernel {
  LfJitKernel kernel = nullptr;
  void* code = nullptr;
};
CpuJitKernel cpu_jit_compile(const LfJitProgram& program);
// Frees a kernel's code once nothing will call it again (its program is gone).
void cpu_jit_release(const CpuJitKernel& kernel);

struct CpuJitStats {
  int64_t compiled = 0;      // programs compiled
  int64_t row_programs = 0;  // of them, row steps' (codegen/cpu/cpu_row_program.h)
  int64_t released = 0;      // compiled programs whose code was freed
  int64_t failures = 0;      // compiles that failed
  int64_t runs = 0;          // ranges of elements computed by compiled code
  std::string last_failure;
};
CpuJitStats cpu_jit_stats();
void reset_cpu_jit_stats();
void count_cpu_jit_run();

}  // namespace lazyfuse
