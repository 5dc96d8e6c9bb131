// Attention steps on a GPU: a forward with its logsumexp, or the gradients of q, k and v, by the
// kernels of codegen/cuda/cuda_attention.cc (Note [Attention on the GPU]).
#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/dtype_dispatch.h"
#include "lazyfuse/ir/attention.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/runtime/cuda/cuda_steps.h"
#include "lazyfuse/runtime/kernel_cache.h"
#include "lazyfuse/runtime/library_steps.h"

namespace lazyfuse::cuda_steps {
namespace {

// A view whose last dim is not contiguous is read through a contiguous copy: the kernels read
// whole rows.
BufferView rows_contiguous(const BufferView& view) {
  return view.strides.back() == 1 || view.shape.back() <= 1 ? view : cuda_contiguous(view);
}

// The strides of the dims before the rows; a rank-2 operand's one dim of size 1.
Strides lead_strides(const BufferView& view) {
  if (view.shape.size() == 2) return {0};
  return Strides(view.strides.begin(), view.strides.end() - 2);
}

// Whether the step runs on tensor cores (Note [Attention on tensor cores]): its dtype and head
// dims fit, the GPU has sm_80's mma, and the operands are read 16 bytes at a time.
bool takes_tensor_cores(const CudaAttentionSpec& spec, int device,
                        std::initializer_list<BufferView> operands) {
  if (!cuda_attention_fits_tensor_cores(spec.dtype, spec.head_dim, spec.value_dim) ||
      cuda::device_properties(device).major < 8)
    return false;
  for (const BufferView& view : operands) {
    // Every head's rows start on 16 bytes: the address, and each stride over the rows and the
    // dims before them, of a dim longer than one.
    const int64_t per_vector = 16 / dtype_size(view.dtype);
    if (address(view) % 16 != 0) return false;
    for (size_t d = 0; d + 1 < view.shape.size(); ++d)
      if (view.shape[d] > 1 && view.strides[d] % per_vector != 0) return false;
  }
  return true;
}

}  // namespace

bool cuda_runs_attention(DType dtype, int64_t head_dim, int64_t value_dim) {
  return is_floating(dtype) && head_dim > 0 && value_dim > 0 &&
         head_dim <= kCudaAttentionMaxHeadDim && value_dim <= kCudaAttentionMaxHeadDim;
}

void run_attention(const Graph& graph, const Step& step, ValueBuffers& values) {
  const Node& first = graph.nodes[step.nodes.front()];
  const AttentionOperands at = attention_operands(first.op, first.attrs);
  auto operand = [&](int slot) { return rows_contiguous(*values[first.inputs[slot]]); };
  const BufferView q = operand(at.q), k = operand(at.k), v = operand(at.v);
  const AttentionSizes sizes = attention_sizes(q.shape, k.shape, v.shape);
  if (!cuda_runs_attention(q.dtype, sizes.head_dim, sizes.value_dim))
    throw UnsupportedError(absl::StrCat("attention: no CUDA kernel for head dims ", sizes.head_dim,
                                        " and ", sizes.value_dim, " (at most ",
                                        kCudaAttentionMaxHeadDim, ")"));
  const ScoreModifiers modifiers = score_modifiers(first.attrs);
  CudaAttentionSpec spec = cuda_attention_spec(graph, step);
  const int device = step.device.index();
  // A gradient's kernels also stage the result's gradient and read the result.
  const bool gradient = is_attention_gradient(first.op);
  const BufferView out = gradient ? operand(at.out) : q, grad = gradient ? operand(at.grad) : q;
  // (The result is read an element at a time: any alignment does.)
  spec.tensor_cores = takes_tensor_cores(spec, device, {q, k, v, grad});

  AttentionWords w;
  w.heads = sizes.heads;
  w.key_heads = sizes.key_heads;
  w.queries = sizes.queries;
  w.keys = sizes.keys;
  w.scale = modifiers.scale;
  w.softcap = modifiers.softcap;
  w.keep_threshold = held_as(q.dtype, modifiers.dropout);
  w.keep_scale = 1 / (1 - modifiers.dropout);
  w.seed = modifiers.seed;
  w.offset = modifiers.offset;
  w.lead = q.shape.size() == 2 ? Shape{1} : Shape(q.shape.begin(), q.shape.end() - 2);
  auto bind = [&](const BufferView& view, uint64_t& pointer, int64_t& row, Strides& lead) {
    pointer = address(view);
    row = view.strides[view.shape.size() - 2];
    lead = lead_strides(view);
  };
  bind(q, w.q, w.q_row, w.q_lead);
  bind(k, w.k, w.k_row, w.k_lead);
  bind(v, w.v, w.v_row, w.v_lead);
  // A mask or bias is read an element at a time: any strides do.
  for (auto [slot, pointer, row, column, lead] :
       {std::tuple{at.mask, &w.mask, &w.mask_row, &w.mask_column, &w.mask_lead},
        std::tuple{at.bias, &w.bias, &w.bias_row, &w.bias_column, &w.bias_lead}}) {
    if (slot < 0) {
      *lead = Strides(w.lead.size(), 0);
      continue;
    }
    const BufferView& view = *values[first.inputs[slot]];
    bind(view, *pointer, *row, *lead);
    *column = view.strides.back();
  }
  w.out_lead = w.grad_lead = Strides(w.lead.size(), 0);

  cuda::activate(device);
  auto output = [&](Op op) -> uint64_t {
    const std::optional<BufferView> buffer = allocate_members(graph, step, op, values);
    return buffer ? address(*buffer) : 0;
  };
  const int64_t heads = sizes.batch * sizes.heads;
  auto row_blocks = [&](CudaAttentionKernel kernel) {
    const int64_t rows = cuda_attention_rows_per_block(spec, kernel);
    return (sizes.queries + rows - 1) / rows;
  };
  auto run = [&](CudaAttentionKernel kernel, int64_t blocks) {
    const auto threads = static_cast<unsigned>(cuda_attention_threads(spec, kernel));
    const std::string name = cuda_attention_kernel_name(spec, kernel);
    cuda::CUfunction function =
        cuda::get_kernel(device, name, [&] { return generate_cuda_attention(spec, kernel); });
    KernelArgs args = pack_attention_args(w);
    launch(device, function, blocks, threads, args, name);
  };
  if (!is_attention_gradient(first.op)) {
    w.lse = output(Op::AttentionLse);
    w.result = output(Op::Attention);
    // A logsumexp recomputed alone still has the kernel write a result: a scratch one.
    std::optional<BufferView> scratch;
    if (w.result == 0) {
      Shape shape = q.shape;
      shape.back() = sizes.value_dim;
      scratch = allocate_buffer(step.device, q.dtype, shape);
      w.result = address(*scratch);
    }
    run(CudaAttentionKernel::Forward, heads * row_blocks(CudaAttentionKernel::Forward));
    return;
  }
  bind(out, w.out, w.out_row, w.out_lead);
  bind(grad, w.grad, w.grad_row, w.grad_lead);
  w.lse = address(*values[first.inputs[at.lse]]);  // the forward's, contiguous
  // The kernels on tensor cores read each query row's D_i from the delta kernel.
  std::optional<BufferView> delta;
  if (spec.tensor_cores) {
    delta = allocate_buffer(step.device, DType::Float32, Shape{heads * sizes.queries});
    w.delta = address(*delta);
    run(CudaAttentionKernel::Delta, heads * row_blocks(CudaAttentionKernel::Delta));
  }
  for (CudaAttentionKernel kernel : cuda_attention_kernels(graph, step)) {
    if (kernel == CudaAttentionKernel::QueryGradient) {
      w.result = output(Op::AttentionGradQ);
      w.result2 = 0;
      run(kernel, heads * row_blocks(kernel));
    } else {
      w.result = output(Op::AttentionGradK);
      w.result2 = output(Op::AttentionGradV);
      const int64_t tile = cuda_attention_key_tile(spec, kernel);
      run(kernel, sizes.batch * sizes.key_heads * ((sizes.keys + tile - 1) / tile));
    }
  }
}

}  // namespace lazyfuse::cuda_steps
