// The CPU backend (runtime/backend.h): fused elementwise programs on all cores (OpenMP),
// reductions, OpenBLAS matmul, index steps, host memory. Its library steps are declared here for
// the CUDA backend's staging and for tests.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "ir/errors.h"
#include "ir/schedule.h"
#include "runtime/storage.h"

namespace lazyfuse {

class CpuProgram;

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
// `prologue`, when given, keeps the compiled prologue for the next run of the step (compiled
// here when it is null).
BufferView cpu_fused_reduce(const Graph& graph, const Step& step, const ValueBuffers& values,
                            std::shared_ptr<const CpuProgram>* prologue = nullptr);
BufferView cpu_matmul(const Node& node, const BufferView& a, const BufferView& b);
// A contiguous copy of any view.
BufferView cpu_contiguous(const BufferView& input);
// An index step (gather, scatter_add, cat) over its operands' buffers, in the node's operand
// order (cpu_index.cc). Throws the IndexError of index_error for an index outside its dim.
BufferView cpu_index(const Node& node, std::span<const BufferView* const> inputs);
// The error an index step raises on any device for `index`, outside [0, bound) along `dim`.
IndexError index_error(const Node& node, int64_t index, int64_t dim, int64_t bound);

}  // namespace lazyfuse
