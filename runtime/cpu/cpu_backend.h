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
#include "lazyfuse/runtime/library_steps.h"
#include "lazyfuse/runtime/storage.h"

namespace lazyfuse {

class CpuProgram;

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
// An attention step (a forward with its logsumexp, or the gradients of q, k and v): sets each of
// its members' values (cpu_attention.cc).
void cpu_attention(const Graph& graph, const Step& step, ValueBuffers& values);

}  // namespace lazyfuse
