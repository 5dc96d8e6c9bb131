// The backend-neutral part of turning a fused step into a kernel, written once for every
// backend: the iteration space with the dims that memory walks in order merged, how each
// operand is read over it, a cursor that walks strided memory of any rank, and a reduction
// step's members by role (and, for backends without a row program, in parts). A backend's
// emitter adds only what is its own (vector widths, index widths, its calling convention).
// A reduction's meaning (identity, combine, accumulator) is the op table's: ir/op.h.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "absl/container/inlined_vector.h"
#include "lazyfuse/ir/schedule.h"
#include "lazyfuse/ir/shape.h"

namespace lazyfuse {

// How a kernel reads an operand over the merged iteration space.
enum class OperandAccess : uint8_t {
  Contiguous,  // element i
  Broadcast,   // element 0
  // Element i % period: broadcast over leading dims, dense over the rest (a bias over rows).
  Repeated,
  Strided,  // by coordinates and strides
};

// Each operand's strides over an iteration space (0 where it broadcasts), inline for the usual
// few operands: a CPU step makes these on every evaluation.
using OperandStrides = absl::InlinedVector<Strides, 4>;

// An iteration space of any rank after merging: size-1 dims dropped, and a dim merged into
// the one before it wherever every operand walks the two as one. At least one dim (a scalar
// space is [1]); a space with no elements keeps its zero-size dim.
struct IterationSpace {
  int64_t numel = 0;
  Shape sizes;
  OperandStrides strides;  // per operand, over `sizes`
};

// `space` read by operands with strides `full` over it (broadcast_strides of each operand to
// `space`). With one operand, its own walk merged as far as its memory allows.
IterationSpace merge_dims(const Shape& space, const OperandStrides& full);

// How an operand with `strides` over the merged `sizes` is read. For Repeated, `period` is set
// to the elements after which it repeats.
OperandAccess classify_access(const Shape& sizes, const Strides& strides, int64_t* period);

// Where a walk over strided memory is: the coordinates of a linear index in `sizes` and the
// element offset they make with `strides`. It advances along the innermost dim in runs and
// carries into outer dims, so a walk costs a few operations per run, not per element. Any rank.
// Sizes must be non-empty and have no zero (callers return first when there is nothing to
// walk); the spans must outlive the cursor.
class StridedCursor {
 public:
  StridedCursor(std::span<const int64_t> sizes, std::span<const int64_t> strides, int64_t start)
      : sizes_(sizes), strides_(strides), index_(sizes.size(), 0) {
    for (size_t d = sizes.size(); d-- > 0;) {
      index_[d] = start % sizes[d];
      start /= sizes[d];
      offset_ += index_[d] * strides[d];
    }
  }
  int64_t offset() const { return offset_; }
  int64_t inner_stride() const { return strides_.back(); }
  // Elements from here to the end of the innermost dim.
  int64_t run_left() const { return sizes_.back() - index_.back(); }
  // Moves `run` elements on; at most run_left().
  void advance(int64_t run) {
    const size_t last = sizes_.size() - 1;
    offset_ += run * strides_[last];
    index_[last] += run;
    for (size_t d = last; d > 0 && index_[d] == sizes_[d]; --d) {
      offset_ += strides_[d - 1] - sizes_[d] * strides_[d];
      index_[d] = 0;
      ++index_[d - 1];
    }
  }

 private:
  std::span<const int64_t> sizes_, strides_;
  absl::InlinedVector<int64_t, 8> index_;
  int64_t offset_ = 0;
};

// A reduction kind's members grouped by the roles fusion recorded (Role, ir/schedule.h): a
// Reduction or Column step holds one reduction; a Row step reductions over the same rows, each
// reading values computed from the step's inputs and the results of those before it (softmax's
// max, then its sum). Row values have one value per row (a LayerNorm's rsqrt(var + eps)),
// computed from the reductions before them and from constants alone. The prologue is what the
// reductions read over the step's space; the epilogue the members over that space that no
// reduction needs (softmax's normalisation), computed in a last pass over each row. Lists in
// topological order.
struct ReductionParts {
  ValueId reduction = -1;           // the last of `reductions`
  std::vector<ValueId> reductions;  // in order
  std::vector<ValueId> row_values;
  std::vector<ValueId> prologue;
  std::vector<ValueId> epilogue;
};
ReductionParts reduction_parts(const Step& step);
// A Column step with more than one reduction and the work it walks the columns with: several
// reductions, values per column or work after them (a softmax over dim 0). Its kernel is a row
// kernel over columns; a column step of one reduction is the column reduction's.
bool is_column_row_step(const Step& step);

// A reduction step as steps of one reduction each, in order, every one with the members it
// needs (what earlier parts computed becomes an input); members that a later part reads or
// the step stores are stored by an elementwise step before their reduction instead of computed
// twice; last, an elementwise step for what the step stores and no part did (absent when
// nothing is left). Row values are computed as steps over their own shape as soon as the
// reductions they read are (a row value is never computed in a part over the step's space, so
// one that is stored is stored once per row). Backends without a row program run these.
std::vector<Step> split_reduction_step(const Graph& graph, const Step& step);

// A matmul step with an epilogue (ir/passes/fusion.cc, phase 0), by its members' roles: the
// product, the bias added to each of its rows, and whether a relu follows; `elementwise` is the
// epilogue as a step of its own over the product and the bias (its kernel_key set), for
// backends that run the two apart.
struct MatmulEpilogue {
  ValueId matmul = -1;
  ValueId bias = -1;
  bool relu = false;
  Step elementwise;
};
// nullopt for a step of one matmul.
std::optional<MatmulEpilogue> matmul_epilogue(const Graph& graph, const Step& step);

}  // namespace lazyfuse
