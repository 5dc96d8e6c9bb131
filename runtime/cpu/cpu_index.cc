// The CPU's index steps (gather, scatter_add, cat) over strided operands, on all cores.
//
// Note [Deterministic scatter_add]
// scatter_add's additions are split by line: a line is the positions of the index that differ
// only along `dim`, and every position of one line adds into the same line of the result (the
// index's other coordinates are the result's). So lines never write the same element, and the
// threads divide the lines between them with no atomics and no locks; within a line, one thread
// adds src's elements in index order (j = 0, 1, ...), each addition in the dtype's compute type
// and rounded to the dtype as PyTorch's CPU kernel does. The sum behind every element is
// therefore the same sequence of roundings whatever the thread count, and the GPU runs the same
// lines in the same order with the same arithmetic (codegen/cuda/cuda_index.cc), so both devices
// give the same bits. What this costs: a line's additions are serial, so the parallelism is the
// number of lines (an embedding's gradient, index [tokens, dim] along 0, has `dim` lines of
// `tokens` additions each).
//
// Note [Index errors]
// An index is known only when the step runs. Each gather task and each scatter_add line stops
// at its first index outside [0, size) and keeps its position in the index's row-major order;
// the smallest of them is reported (index_error, an IndexError), so the error names the first
// bad index whatever the thread count. The step's result is then never stored: evaluate()
// changes values only after every step has run.
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cpu/cpu_program.h"
#include "lazyfuse/codegen/dtype_dispatch.h"
#include "lazyfuse/codegen/kernel_plan.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/cpu/cpu_backend.h"
#include "lazyfuse/runtime/cpu/openmp.h"

namespace lazyfuse {
namespace {

// Elements per parallel task.
constexpr int64_t kTask = 1 << 14;

// An operand as the index ops see it: a 0-d tensor as [1] (PyTorch's ensure_nonempty).
struct Operand {
  const std::byte* data;
  Shape shape;
  Strides strides;
};
Operand nonempty(const BufferView& view) {
  Operand operand{static_cast<const std::byte*>(view.data()), view.shape, view.strides};
  if (operand.shape.empty()) {
    operand.shape = {1};
    operand.strides = {1};
  }
  return operand;
}

// The first bad index found, by its position in the index's row-major order (Note [Index
// errors]). Threads offer what they find; the smallest position wins.
class FirstBadIndex {
 public:
  void offer(int64_t position, int64_t value) {
    std::lock_guard lock(mutex_);
    if (position < position_) {
      position_ = position;
      value_ = value;
    }
  }
  // Throws the IndexError for the smallest position offered, if any.
  void rethrow_if_any(const Node& node, int64_t dim, int64_t bound) const {
    if (position_ != INT64_MAX) throw index_error(node, value_, dim, bound);
  }

 private:
  std::mutex mutex_;
  int64_t position_ = INT64_MAX;
  int64_t value_ = 0;
};

// Coordinates in `shape` and back, for the position of a bad index.
int64_t ravel(const absl::InlinedVector<int64_t, 8>& coords, const Shape& shape) {
  int64_t position = 0;
  for (size_t d = 0; d < shape.size(); ++d) position = position * shape[d] + coords[d];
  return position;
}
absl::InlinedVector<int64_t, 8> unravel(int64_t position, const Shape& shape) {
  absl::InlinedVector<int64_t, 8> coords(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    coords[d] = position % shape[d];
    position /= shape[d];
  }
  return coords;
}

// An unsigned type of `bytes` bytes: gather moves elements of one dtype as bits.
template <typename F>
void dispatch_width(int64_t bytes, F&& f) {
  switch (bytes) {
    case 1:
      return f.template operator()<uint8_t>();
    case 2:
      return f.template operator()<uint16_t>();
    case 4:
      return f.template operator()<uint32_t>();
    default:
      return f.template operator()<uint64_t>();
  }
}

// out[p] = x[p with p[dim] = index[p]], in tasks of kTask positions of the index.
BufferView gather(const Node& node, const BufferView& x_view, const BufferView& index_view) {
  BufferView out = allocate_buffer(node.device, node.dtype, node.shape);
  const Operand x = nonempty(x_view), index = nonempty(index_view);
  const int64_t n = numel(index.shape);
  if (n == 0) return out;
  const int64_t dim = normalize_dim(node.attrs.get_int("dim"), x_view.shape.size(), "gather");
  const int64_t bound = x.shape[dim];
  // x walked over the index's shape, not moving along `dim`: the index's value moves it there.
  Strides x_walk = x.strides;
  x_walk[dim] = 0;
  const int64_t x_step = x.strides[dim];
  const int64_t tasks = (n + kTask - 1) / kTask;
  FirstBadIndex bad;
  dispatch_width(dtype_size(node.dtype), [&]<typename T>() {
    const T* x_data = reinterpret_cast<const T*>(x.data);
    const int64_t* index_data = reinterpret_cast<const int64_t*>(index.data);
    T* out_data = static_cast<T*>(out.data());
#pragma omp parallel for schedule(static) if (tasks > 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t begin = t * kTask, end = std::min(n, begin + kTask);
      StridedCursor at_index(index.shape, index.strides, begin);
      StridedCursor at_x(index.shape, x_walk, begin);
      for (int64_t p = begin; p < end;) {
        const int64_t run = std::min(end - p, at_index.run_left());
        const int64_t* ix = index_data + at_index.offset();
        const T* xs = x_data + at_x.offset();
        const int64_t ix_stride = at_index.inner_stride(), x_stride = at_x.inner_stride();
        for (int64_t j = 0; j < run; ++j) {
          const int64_t i = ix[j * ix_stride];
          if (i < 0 || i >= bound) {
            bad.offer(p + j, i);
            p = end;  // the task's first bad index is the only one that can be the first
            break;
          }
          out_data[p + j] = xs[j * x_stride + i * x_step];
        }
        if (p == end) break;
        p += run;
        at_index.advance(run);
        at_x.advance(run);
      }
    }
  });
  bad.rethrow_if_any(node, dim, bound);
  return out;
}

// a + b as a dtype adds: in the compute type, rounded to the dtype; integers wrap (PyTorch's),
// bools or.
template <typename S>
S add_values(S a, S b) {
  if constexpr (std::is_same_v<S, bool>) {
    return a || b;
  } else if constexpr (std::is_integral_v<S>) {
    using U = std::make_unsigned_t<S>;
    return static_cast<S>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    using C = ComputeOf<S>;
    return convert_value<S>(convert_value<C>(a) + convert_value<C>(b));
  }
}

// A dense copy of `source` in `dtype` into `out` (contiguous, source's shape), in parallel.
void copy_dense(const BufferView& source, DType dtype, void* out) {
  const int64_t n = numel(source.shape);
  if (n == 0) return;
  const CpuOperand operand =
      make_cpu_operand(source.data(), source.dtype, source.shape, source.strides, source.shape);
  const int64_t tasks = (n + kTask - 1) / kTask;
  std::byte* bytes = static_cast<std::byte*>(out);
  const int64_t size = dtype_size(dtype);
#pragma omp parallel for schedule(static) if (tasks > 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t begin = t * kTask, count = std::min(n, begin + kTask) - begin;
    cpu_gather(operand, dtype, begin, count, bytes + begin * size);
  }
}

// self with src[p] added at p with p[dim] = index[p], line by line (Note [Deterministic
// scatter_add]).
BufferView scatter_add(const Node& node, const BufferView& self_view, const BufferView& index_view,
                       const BufferView& src_view) {
  BufferView out = allocate_buffer(node.device, node.dtype, node.shape);
  copy_dense(self_view, node.dtype, out.data());
  const Operand index = nonempty(index_view), src = nonempty(src_view);
  const Shape self_shape = self_view.shape.empty() ? Shape{1} : self_view.shape;
  const int64_t dim =
      normalize_dim(node.attrs.get_int("dim"), self_view.shape.size(), "scatter_add");
  const int64_t length = index.shape[dim];
  if (numel(index.shape) == 0) return out;
  const int64_t bound = self_shape[dim];
  // The lines: the index's shape with `dim` made 1.
  Shape lines_shape = index.shape;
  lines_shape[dim] = 1;
  const int64_t lines = numel(lines_shape);
  const Strides out_strides = contiguous_strides(self_shape);
  const int64_t index_step = index.strides[dim], src_step = src.strides[dim],
                out_step = out_strides[dim];
  const int64_t tasks = (lines * length + kTask - 1) / kTask;
  const int64_t lines_per_task = (lines + tasks - 1) / tasks;
  FirstBadIndex bad;
  dispatch_storage(node.dtype, [&]<typename S>() {
    const int64_t* index_data = reinterpret_cast<const int64_t*>(index.data);
    const S* src_data = reinterpret_cast<const S*>(src.data);
    S* out_data = static_cast<S*>(out.data());
#pragma omp parallel for schedule(static) if (tasks > 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t first = t * lines_per_task, last = std::min(lines, first + lines_per_task);
      if (first >= last) continue;
      StridedCursor at_index(lines_shape, index.strides, first);
      StridedCursor at_src(lines_shape, src.strides, first);
      StridedCursor at_out(lines_shape, out_strides, first);
      for (int64_t line = first; line < last; ++line) {
        const int64_t* ix = index_data + at_index.offset();
        const S* sx = src_data + at_src.offset();
        S* ox = out_data + at_out.offset();
        for (int64_t j = 0; j < length; ++j) {
          const int64_t i = ix[j * index_step];
          if (i < 0 || i >= bound) {
            absl::InlinedVector<int64_t, 8> coords = unravel(line, lines_shape);
            coords[dim] = j;
            bad.offer(ravel(coords, index.shape), i);
            break;
          }
          S& target = ox[i * out_step];
          target = add_values(target, sx[j * src_step]);
        }
        if (line + 1 < last) {
          at_index.advance(1);
          at_src.advance(1);
          at_out.advance(1);
        }
      }
    }
  });
  bad.rethrow_if_any(node, dim, bound);
  return out;
}

// The operands one after another along dim, converted to the result's dtype: each operand's
// elements in row-major order are runs of `inner` (its sizes from dim on) that land, one per
// outer position, at their place in the result's rows.
BufferView cat(const Node& node, std::span<const BufferView* const> inputs) {
  BufferView out = allocate_buffer(node.device, node.dtype, node.shape);
  const int64_t rank = static_cast<int64_t>(node.shape.size());
  const int64_t dim = normalize_dim(node.attrs.get_int("dim"), rank, "cat");
  int64_t outer = 1, after = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= node.shape[d];
  for (int64_t d = dim + 1; d < rank; ++d) after *= node.shape[d];
  const int64_t row = node.shape[dim] * after;  // one outer position of the result
  const int64_t size = dtype_size(node.dtype);
  // Pieces of about kTask elements: whole rows of an operand, or part of one long row.
  struct Piece {
    const CpuOperand* operand;
    int64_t inner;         // the operand's elements per outer position
    int64_t at;            // where they start within a row of the result
    int64_t first, last;   // outer positions
    int64_t start, count;  // elements [start, start + count) of each of those rows
  };
  std::vector<CpuOperand> operands;
  operands.reserve(inputs.size());
  std::vector<Piece> pieces;
  int64_t at = 0;
  for (const BufferView* in : inputs) {
    const int64_t inner = in->shape[dim] * after;
    operands.push_back(make_cpu_operand(in->data(), in->dtype, in->shape, in->strides, in->shape));
    if (inner > 0 && outer > 0) {
      const int64_t rows = std::max<int64_t>(1, kTask / inner);
      for (int64_t o = 0; o < outer; o += rows)
        for (int64_t start = 0; start < inner; start += kTask)
          pieces.push_back({&operands.back(), inner, at, o, std::min(outer, o + rows), start,
                            std::min(kTask, inner - start)});
    }
    at += inner;
  }
  std::byte* bytes = static_cast<std::byte*>(out.data());
  const int64_t count = static_cast<int64_t>(pieces.size());
#pragma omp parallel for schedule(dynamic, 1) if (count > 1)
  for (int64_t k = 0; k < count; ++k) {
    const Piece& piece = pieces[k];
    for (int64_t o = piece.first; o < piece.last; ++o)
      cpu_gather(*piece.operand, node.dtype, o * piece.inner + piece.start, piece.count,
                 bytes + (o * row + piece.at + piece.start) * size);
  }
  return out;
}

}  // namespace

BufferView cpu_index(const Node& node, std::span<const BufferView* const> inputs) {
  switch (node.op) {
    case Op::Gather:
      return gather(node, *inputs[0], *inputs[1]);
    case Op::ScatterAdd:
      return scatter_add(node, *inputs[0], *inputs[1], *inputs[2]);
    case Op::Cat:
      return cat(node, inputs);
    default:
      break;
  }
  throw VerifierError(absl::StrCat(op_name(node.op), " is not an index op"));
}

}  // namespace lazyfuse
