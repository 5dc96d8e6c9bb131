// Matmul steps on a GPU: cuBLAS (cuBLASLt with its bias and relu epilogues) and lazyfuse's kernel
// for products of few rows.
#include "lazyfuse/runtime/cuda/cuda_steps.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"
#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/runtime/cuda/cublas.h"
#include "lazyfuse/runtime/cuda/cuda_graphs.h"
#include "lazyfuse/runtime/cuda/cuda_memory.h"
#include "lazyfuse/runtime/host_profile.h"
#include "lazyfuse/runtime/library_steps.h"

namespace lazyfuse::cuda_steps {

namespace {

// A [batch..., rows, cols] view as cuBLAS can read it in place, when its layout allows: each
// matrix row-major or stored transposed (one inner stride 1, the other at least the inner
// size; a size-1 dim's stride does not matter), and the batch one stride apart or broadcast.
std::optional<cuda::GemmOperand> gemm_operand(const BufferView& view) {
  const Shape& shape = view.shape;
  const Strides& strides = view.strides;
  const size_t rank = shape.size();
  const std::optional<MatrixLayout> layout =
      matrix_layout(shape[rank - 2], shape[rank - 1], strides[rank - 2], strides[rank - 1]);
  if (!layout || layout->ld > std::numeric_limits<int>::max()) return std::nullopt;
  cuda::GemmOperand operand;
  operand.data = view.data();
  operand.transposed = layout->transposed;
  operand.ld = layout->ld;
  bool first = true;
  int64_t expected = 0;
  for (size_t d = rank - 2; d-- > 0;) {  // the innermost batch dim first
    if (shape[d] == 1) continue;
    if (first) {
      operand.batch_stride = strides[d];
      first = false;
    } else if (strides[d] != expected) {
      return std::nullopt;
    }
    expected = strides[d] * shape[d];
  }
  return operand;
}

}  // namespace

BufferView run_matmul(const Node& node, const BufferView& a, const BufferView& b) {
  const int device = node.device.index();
  const MatmulShapes shapes = matmul_shapes(a, b);
  // Floating operands are read where they lie (transposed views included) and multiplied in
  // their own dtype; integers in float64, exact below 2^53, as on the CPU.
  const DType work = is_integral(node.dtype) ? DType::Float64 : node.dtype;
  // An operand cuBLAS cannot read in place is staged dense in the work dtype; the copy lives
  // until the gemm is enqueued behind it on the device's one stream.
  auto operand = [&](const BufferView& x, const Shape& full, const Strides& strides,
                     std::optional<BufferView>& staged) {
    BufferView view = x;
    view.shape = full;
    view.strides = strides;
    if (x.dtype == work)
      if (std::optional<cuda::GemmOperand> in_place = gemm_operand(view)) return *in_place;
    staged = cuda_convert(view, work);
    std::optional<cuda::GemmOperand> dense = gemm_operand(*staged);
    if (!dense)
      throw UnsupportedError(absl::StrCat("matmul: a row of ", full.back(),
                                          " elements is more than cuBLAS can address"));
    return *dense;
  };
  std::optional<BufferView> a_staged, b_staged;
  const cuda::GemmOperand a_operand = operand(a, shapes.a_full, shapes.a_strides, a_staged);
  const cuda::GemmOperand b_operand = operand(b, shapes.b_full, shapes.b_strides, b_staged);
  BufferView c = allocate_buffer(node.device, work, node.shape);
  count_gpu_launch();
  {
    ScopedHostPhase phase(HostPhase::Library);
    cuda::gemm_strided_batched(device, work, a_operand, b_operand, c.data(), shapes.n, shapes.k,
                               shapes.m, shapes.batches);
  }
  return work == node.dtype ? c : cuda_convert(c, node.dtype);
}

// A product of few rows by lazyfuse's own kernel (Note [Products of few rows] in
// codegen/cuda/cuda_matmul.cc), with its step's bias and relu where it has them: sets the step's
// output and returns true; false where the kernel does not take the operands (the library
// computes it then).
bool run_skinny_matmul(const Graph& graph, ValueId matmul_id, const MatmulEpilogue* epilogue,
                       ValueBuffers& values) {
  if (!cuda::skinny_matmul_enabled()) return false;
  const Node& matmul = graph.nodes[matmul_id];
  const BufferView& a = *values[matmul.inputs[0]];
  const BufferView& b = *values[matmul.inputs[1]];
  if (a.dtype != matmul.dtype || b.dtype != matmul.dtype || a.shape.size() != 2 ||
      b.shape.size() != 2)
    return false;
  const int64_t rows = a.shape[0], inner = a.shape[1], cols = b.shape[1];
  SkinnyEpilogue kind = SkinnyEpilogue::None;
  const BufferView* bias = nullptr;
  if (epilogue != nullptr) {
    bias = &*values[epilogue->bias];
    if (bias->dtype != matmul.dtype || numel(bias->shape) != cols || bias->strides.back() != 1)
      return false;
    kind = epilogue->relu ? SkinnyEpilogue::BiasRelu : SkinnyEpilogue::Bias;
  }
  const std::optional<SkinnyMatmulPlan> plan =
      plan_skinny_matmul(matmul.dtype, rows, inner, cols, kind);
  if (!plan) return false;
  // Rows of a and b's columns (b read transposed, an nn::Linear's weight) in 16-byte loads.
  const int64_t vector = plan->vector;
  if (a.strides[1] != 1 || a.strides[0] % vector != 0 || address(a) % 16 != 0 ||
      b.strides[0] != 1 || b.strides[1] % vector != 0 || address(b) % 16 != 0)
    return false;
  const int device = matmul.device.index();
  cuda::activate(device);
  BufferView c = allocate_buffer(matmul.device, matmul.dtype, matmul.shape);
  SkinnyMatmulWords words;
  words.a = address(a);
  words.b = address(b);
  words.bias = bias != nullptr ? address(*bias) : 0;
  words.c = address(c);
  words.lda = a.strides[0];
  words.ldb = b.strides[1];
  words.inner = inner;
  words.cols = cols;
  const std::string name = cuda_skinny_matmul_kernel_name(*plan);
  cuda::CUfunction function =
      cuda::get_kernel(device, name, [&] { return generate_cuda_skinny_matmul(*plan); });
  KernelArgs args = pack_skinny_matmul_args(words);
  launch(device, function, plan->blocks(cols), static_cast<unsigned>(32 * plan->warps), args, name);
  cuda::count_skinny_matmul();
  values[epilogue != nullptr ? epilogue->elementwise.outputs.at(0) : matmul_id] = std::move(c);
  return true;
}

// A matmul with its bias (and relu) as one cuBLASLt call with an epilogue, where cuBLASLt takes
// the operands' dtype and layout: sets the step's output and returns true; false otherwise.
bool run_matmul_with_epilogue(const Graph& graph, const MatmulEpilogue& epilogue,
                              ValueBuffers& values) {
  const Node& matmul = graph.nodes[epilogue.matmul];
  const BufferView& a = *values[matmul.inputs[0]];
  const BufferView& b = *values[matmul.inputs[1]];
  const BufferView& bias = *values[epilogue.bias];
  if (a.dtype != matmul.dtype || b.dtype != matmul.dtype || bias.dtype != matmul.dtype ||
      a.shape.size() != 2 || b.shape.size() != 2 || bias.strides.back() != 1)
    return false;
  const std::optional<cuda::GemmOperand> a_operand = gemm_operand(a);
  const std::optional<cuda::GemmOperand> b_operand = gemm_operand(b);
  if (!a_operand || !b_operand) return false;
  const ValueId result = epilogue.elementwise.outputs.at(0);
  BufferView d = allocate_buffer(matmul.device, matmul.dtype, matmul.shape);
  ScopedHostPhase phase(HostPhase::Library);
  if (!cuda::gemm_bias_epilogue(matmul.device.index(), matmul.dtype, *a_operand, *b_operand,
                                bias.data(), epilogue.relu, d.data(), a.shape[0], a.shape[1],
                                b.shape[1]))
    return false;
  count_gpu_launch();
  values[result] = std::move(d);
  return true;
}

}  // namespace lazyfuse::cuda_steps
