// A row step's parts compiled into one loop over its rows (Note [Row programs] in
// cpu_row_program.cc): every part of a row runs before the next row, its values in registers.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "lazyfuse/codegen/cpu/cpu_jit.h"
#include "lazyfuse/codegen/cpu/cpu_program.h"
#include "lazyfuse/ir/op.h"

namespace lazyfuse {

// How far ahead of the row it computes a row program asks for the lines of what it reads
// densely: 8 KiB, two rows of 1024 float32 on, asked for by the part applying the most ops (the
// JIT's emit_row_kernel). At 2^24, 8 KiB measured best against none, 4 and 16 KiB; asked for
// by the busiest part rather than the first, the softmaxes ran faster and the norms no slower
// (docs/benchmarks.md, "The CPU JIT").
inline constexpr int64_t kRowPrefetchBytes = 8 * 1024;

class CpuRowProgram {
 public:
  // A part of the step, in the order the step runs them.
  struct Part {
    // An elementwise part's program, or a fused reduction's prologue (the program computing its
    // operand); null for the reduction of a stored value.
    std::shared_ptr<const CpuProgram> program;
    bool reduction = false;
    Op op = Op::Sum;          // the reduction's
    bool once_a_row = false;  // an elementwise part over one value a row
  };
  // Whether a step of these parts, rows `length` long, in float64 or float32 throughout, is one
  // the JIT can compile as a row program, as far as it can tell before seeing the operands.
  static bool fits(std::span<const Part> parts, int64_t length, bool double_precision);
  CpuRowProgram(std::vector<Part> parts, int64_t length, int64_t numel, bool double_precision);
  // The row program of these parts: one made earlier for parts of the same code, rows and
  // elements while it lives (every layer's LayerNorm shares one, its work towards compiling
  // and its compiled loops), else a new one.
  static std::shared_ptr<CpuRowProgram> shared(std::vector<Part> parts, int64_t length,
                                               int64_t numel, bool double_precision);
  CpuRowProgram(const CpuRowProgram&) = delete;
  CpuRowProgram& operator=(const CpuRowProgram&) = delete;
  ~CpuRowProgram();

  // What a part reads and writes. A value `kept` a row at a time (a softmax's exponentials,
  // handed from one part to a later one and not stored by the step) lies in a row-long buffer,
  // row r's element j at index j, whatever r.
  struct PartData {
    std::span<const CpuOperand> operands;        // a plain reduction's: its one operand
    std::span<const CpuResult> results;          // an elementwise part's
    std::vector<int> operand_kept, result_kept;  // -1, or which kept value (the caller's number)
    void* row_values = nullptr;                  // a reduction's result, one value a row
    // A fused reduction's kept row, where its operand's values may wait to be reduced (the
    // caller's number for it, as for a kept value; -1: none).
    int scratch_kept = -1;
  };
  // The compiled loop and the pointers it takes, each part's operands and then its results in
  // part order; the kept values' entries are for each thread to point at its own row buffers.
  struct Bound {
    LfJitKernel kernel = nullptr;  // null: the parts run one at a time
    std::vector<const void*> operands;
    std::vector<void*> results;
    // The entries of kept values: an index into the arrays above, and which kept value.
    std::vector<std::pair<size_t, int>> kept_operands, kept_results;
    bool streams = false;
  };
  // Whether the loop is to run for an evaluation of `elements` elements, which count towards
  // CpuJitMode::Hot's threshold as the parts' programs' own do.
  bool ready(int64_t elements);
  // Binds the program to the parts' data; compiles the loop for their layouts if it is new.
  // A null kernel where the JIT cannot compile them.
  Bound bind(std::span<const PartData> data);

 private:
  std::vector<Part> parts_;
  int64_t length_ = 0, numel_ = 0;
  bool double_precision_ = false;
  std::atomic<int64_t> processed_{0};
  std::mutex mutex_;
  struct Compiled {
    CpuJitKernel compiled;
    bool streams = false;  // some store is non-temporal
  };
  Compiled compile(std::span<const PartData> data,
                   const std::vector<CpuProgram::JitLayouts>& layouts, int64_t lanes) const;
  struct Entry {
    std::vector<int64_t> key;
    CpuJitKernel compiled;
    bool streams = false;
  };
  std::vector<Entry> kernels_;
};

}  // namespace lazyfuse
