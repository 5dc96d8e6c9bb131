// The steps that run on the host: fused elementwise programs on all cores (OpenMP),
// reductions, OpenBLAS matmul.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "codegen/cpu_program.h"
#include "ir/schedule.h"
#include "runtime/storage.h"

namespace lazyfuse {

// Runs one step whose device is the host, reading and writing buffers in `values` by value id.
// `program`, when given, keeps an elementwise step's compiled program between runs of the same
// schedule: it depends on the graph and the step alone, not on the operands' layouts.
void run_cpu_step(const Graph& graph, const Step& step, ValueBuffers& values,
                  std::shared_ptr<const CpuProgram>* program = nullptr);

// A matmul's operands as [batch..., rows, cols] views broadcast over the common batch (1-D
// operands promoted as numpy does): what both the CPU and the GPU stage for gemm.
struct MatmulShapes {
  int64_t n = 0, k = 0, m = 0, batches = 1;
  Shape a_full, b_full;  // batch + [n, k], batch + [k, m]
  Strides a_strides, b_strides;
};
MatmulShapes matmul_shapes(const BufferView& a, const BufferView& b);

// The library steps, also used on their own by tests.
BufferView cpu_reduce(const Node& node, const BufferView& input);
// A reduction step with a fused elementwise prologue, computed block by block.
BufferView cpu_fused_reduce(const Graph& graph, const Step& step, const ValueBuffers& values);
BufferView cpu_matmul(const Node& node, const BufferView& a, const BufferView& b);
// A contiguous copy of any view.
BufferView cpu_contiguous(const BufferView& input);

}  // namespace lazyfuse
