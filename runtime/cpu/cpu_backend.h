// The CPU backend (runtime/backend.h): fused elementwise programs on all cores (OpenMP),
// reductions, OpenBLAS matmul, index steps, host memory. Its library steps are declared here for
// the CUDA backend's staging and for tests.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/schedule.h"
#include "lazyfuse/runtime/storage.h"

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

// A 64-byte aligned buffer that only grows, zeroed when it does (so no lane of a program's
// registers ever reads uninitialised memory): scratch kept by a thread between uses.
class AlignedBytes {
 public:
  AlignedBytes() = default;
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  ~AlignedBytes() { std::free(data_); }
  std::byte* at_least(size_t bytes) {
    if (bytes > size_) {
      const size_t size = std::max<size_t>((bytes + 63) / 64 * 64, 64);
      void* fresh = std::aligned_alloc(64, size);
      if (fresh == nullptr)
        throw OutOfMemoryError(absl::StrCat("out of host memory for ", size, " bytes of scratch"));
      std::memset(fresh, 0, size);
      std::free(data_);
      data_ = static_cast<std::byte*>(fresh);
      size_ = size;
    }
    return data_;
  }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// Rows of a reduction over trailing dims: [begin, end) on the calling thread, or, with end < 0,
// every row across the threads.
struct RowRange {
  int64_t begin = 0, end = -1;
};
// The library steps, also used on their own by tests. A reduction writes `into` where given
// (a buffer of the node's shape), else into a new buffer; either is returned.
BufferView cpu_reduce(const Node& node, const BufferView& input, const RowRange& rows = {},
                      const std::optional<BufferView>& into = std::nullopt);
// A reduction step of one reduction (its one output) with a fused elementwise prologue (its
// other nodes), as split_reduction_step makes them, computed block by block.
// `prologue`, when given, keeps the compiled prologue for the next run of the step (compiled
// here when it is null).
BufferView cpu_fused_reduce(const Graph& graph, const Step& step, const ValueBuffers& values,
                            std::shared_ptr<const CpuProgram>* prologue = nullptr,
                            const RowRange& rows = {},
                            const std::optional<BufferView>& into = std::nullopt);
// The prologue of a reduction step of one reduction, compiled: what cpu_fused_reduce runs.
std::shared_ptr<const CpuProgram> compile_reduction_prologue(const Graph& graph, const Step& step);
BufferView cpu_matmul(const Node& node, const BufferView& a, const BufferView& b);
// A contiguous copy of any view.
BufferView cpu_contiguous(const BufferView& input);
// An index step (gather, scatter_add, cat) over its operands' buffers, in the node's operand
// order (cpu_index.cc). Throws the IndexError of index_error for an index outside its dim.
BufferView cpu_index(const Node& node, std::span<const BufferView* const> inputs);
// The error an index step raises on any device for `index`, outside [0, bound) along `dim`.
IndexError index_error(const Node& node, int64_t index, int64_t dim, int64_t bound);

}  // namespace lazyfuse
