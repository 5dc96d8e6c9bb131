// What every backend's library steps share, whatever the device: how a matmul's operands are
// staged for gemm, and the error of an index out of range.
#pragma once

#include <cstdint>
#include <optional>

#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/graph.h"
#include "lazyfuse/ir/schedule.h"
#include "lazyfuse/runtime/storage.h"

namespace lazyfuse {

// A matmul's operands as [batch..., rows, cols] views broadcast over the common batch (1-D
// operands promoted as numpy does): what both the CPU and the GPU stage for gemm.
struct MatmulShapes {
  int64_t n = 0, k = 0, m = 0, batches = 1;
  Shape a_full, b_full;  // batch + [n, k], batch + [k, m]
  Strides a_strides, b_strides;
};
MatmulShapes matmul_shapes(const BufferView& a, const BufferView& b);
// How a gemm reads the [rows, cols] matrix with these strides where it lies: row-major with
// leading dimension `ld`, or, `transposed`, column-major (stored as its transpose, row-major with
// leading dimension `ld`: a transposed view, as a Linear layer's weight.t() is read). Empty where
// it is neither. A dim of one element has no stride to speak of; ld is at least 1.
struct MatrixLayout {
  bool transposed = false;
  int64_t ld = 1;
};
std::optional<MatrixLayout> matrix_layout(int64_t rows, int64_t cols, int64_t row_stride,
                                          int64_t col_stride);

// The error an index step raises on any device for `index`, outside [0, bound) along `dim`.
IndexError index_error(const Node& node, int64_t index, int64_t dim, int64_t bound);

// A fresh buffer on the step's device for the members of `step` that are `op` nodes, set as each
// one's value (several alike share it, where no CSE ran); empty where there is none. How an
// attention step's runners (CPU and CUDA) allocate what they write.
std::optional<BufferView> allocate_members(const Graph& graph, const Step& step, Op op,
                                           ValueBuffers& values);

}  // namespace lazyfuse
