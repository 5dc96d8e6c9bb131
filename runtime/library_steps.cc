// What every backend's library steps share (library_steps.h).
#include "lazyfuse/runtime/library_steps.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/infer.h"

namespace lazyfuse {

MatmulShapes matmul_shapes(const BufferView& a, const BufferView& b) {
  Shape a_shape = a.shape, b_shape = b.shape;
  Strides a_strides = a.strides, b_strides = b.strides;
  if (a_shape.size() == 1) {
    a_shape.insert(a_shape.begin(), 1);
    a_strides.insert(a_strides.begin(), 0);
  }
  if (b_shape.size() == 1) {
    b_shape.push_back(1);
    b_strides.push_back(0);
  }
  MatmulShapes shapes;
  shapes.n = a_shape[a_shape.size() - 2];
  shapes.k = a_shape.back();
  shapes.m = b_shape.back();
  Shape a_batch(a_shape.begin(), a_shape.end() - 2), b_batch(b_shape.begin(), b_shape.end() - 2);
  Shape batch;
  broadcast_shapes(a_batch, b_batch, &batch);
  shapes.batches = numel(batch);
  shapes.a_full = batch;
  shapes.a_full.push_back(shapes.n);
  shapes.a_full.push_back(shapes.k);
  shapes.b_full = batch;
  shapes.b_full.push_back(shapes.k);
  shapes.b_full.push_back(shapes.m);
  shapes.a_strides = broadcast_strides(a_shape, a_strides, shapes.a_full);
  shapes.b_strides = broadcast_strides(b_shape, b_strides, shapes.b_full);
  return shapes;
}

std::optional<MatrixLayout> matrix_layout(int64_t rows, int64_t cols, int64_t row_stride,
                                          int64_t col_stride) {
  MatrixLayout layout;
  if ((cols == 1 || col_stride == 1) && (rows == 1 || row_stride >= cols)) {
    layout.ld = rows == 1 ? cols : row_stride;
  } else if ((rows == 1 || row_stride == 1) && (cols == 1 || col_stride >= rows)) {
    layout.transposed = true;
    layout.ld = cols == 1 ? rows : col_stride;
  } else {
    return std::nullopt;
  }
  layout.ld = std::max<int64_t>(layout.ld, 1);  // BLAS asks for at least 1, even when empty
  return layout;
}

IndexError index_error(const Node& node, int64_t index, int64_t dim, int64_t bound) {
  return IndexError(absl::StrCat(op_name(node.op), "(): index ", index,
                                 " is out of bounds for dimension ", dim, " with size ", bound,
                                 " (", op_name(node.op), " at ", node.where.str(), ")"));
}

std::optional<BufferView> allocate_members(const Graph& graph, const Step& step, Op op,
                                           ValueBuffers& values) {
  std::optional<BufferView> buffer;
  for (ValueId m : step.nodes)
    if (graph.nodes[m].op == op) {
      if (!buffer)
        buffer = allocate_buffer(step.device, graph.nodes[m].dtype, graph.nodes[m].shape);
      values[m] = buffer;
    }
  return buffer;
}

}  // namespace lazyfuse
