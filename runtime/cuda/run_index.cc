// Index steps on a GPU: gather, scatter_add and cat as generated kernels.
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

// The device's error slot for index kernels (Note [Index errors on the GPU] in
// codegen/cuda/cuda_index.cc): one word, all ones when clear. A device's kernels run in order on
// its one stream and a set slot is cleared before the error is raised, so one slot serves every
// launch there.
constexpr uint64_t kNoIndexError = ~uint64_t{0};

uint64_t index_error_slot(const Device& device) {
  static std::mutex mutex;
  // Never destroyed: the buffers go with the process, after the allocator they came from.
  static auto& slots = *new std::vector<std::optional<BufferView>>();
  std::lock_guard lock(mutex);
  const size_t index = static_cast<size_t>(device.index());
  if (slots.size() <= index) slots.resize(index + 1);
  std::optional<BufferView>& slot = slots[index];
  if (!slot) {
    cuda::check_replayable("the index error slot is made", false);
    BufferView fresh = allocate_buffer(device, DType::Int64, {1});
    cuda::check(cuda::driver()->cuMemcpyHtoD(address(fresh), &kNoIndexError, 8), "cuMemcpyHtoD");
    slot = std::move(fresh);
  }
  return address(*slot);
}

// Sizes and strides as the index kernels take them: a 0-d operand as [1].
Shape nonempty_shape(const Shape& shape) { return shape.empty() ? Shape{1} : shape; }

Strides nonempty_strides(const BufferView& view) {
  return view.shape.empty() ? Strides{1} : view.strides;
}

// Blocks for `n` threads' work; the index kernels loop over what the grid does not cover.
int64_t index_blocks(int64_t n) {
  return std::min<int64_t>((n + kCudaIndexThreads - 1) / kCudaIndexThreads, int64_t{1} << 16);
}

// After an index kernel: when it found a bad index, reads that index from `index` (on the
// device) at the row-major position the slot holds, clears the slot and raises the IndexError
// the CPU raises. Reading the slot waits for the kernel.
void check_index_error(const Node& node, uint64_t slot, const BufferView& index, int64_t dim,
                       int64_t bound) {
  cuda::check_replayable("an index op reads its error slot on the host", true);
  const cuda::DriverApi* api = cuda::driver();
  uint64_t position = kNoIndexError;
  cuda::check(api->cuMemcpyDtoH(&position, slot, 8),
              absl::StrCat(op_name(node.op), " kernel").c_str());
  if (position == kNoIndexError) return;
  cuda::check(api->cuMemcpyHtoD(slot, &kNoIndexError, 8), "cuMemcpyHtoD");
  const Shape shape = nonempty_shape(index.shape);
  const Strides strides = nonempty_strides(index);
  int64_t offset = 0, rest = static_cast<int64_t>(position);
  for (size_t d = shape.size(); d-- > 0;) {
    offset += rest % shape[d] * strides[d];
    rest /= shape[d];
  }
  int64_t value = 0;
  cuda::check(api->cuMemcpyDtoH(&value, address(index) + offset * 8, 8), "cuMemcpyDtoH");
  throw index_error(node, value, dim, bound);
}

BufferView run_gather(const Node& node, const BufferView& x, const BufferView& index) {
  const int device = node.device.index();
  cuda::activate(device);
  BufferView out = allocate_buffer(node.device, node.dtype, node.shape);
  GatherWords words;
  words.n = numel(index.shape);
  if (words.n == 0) return out;
  words.dim = normalize_dim(node.attrs.get_int("dim"), x.shape.size(), "gather");
  words.bound = nonempty_shape(x.shape)[words.dim];
  words.x = address(x);
  words.index = address(index);
  words.out = address(out);
  words.error = index_error_slot(node.device);
  words.sizes = nonempty_shape(index.shape);
  words.x_strides = nonempty_strides(x);
  words.index_strides = nonempty_strides(index);
  const int rank = static_cast<int>(words.sizes.size());
  const int bytes = static_cast<int>(dtype_size(node.dtype));
  const std::string name = cuda_gather_kernel_name(bytes, rank);
  cuda::CUfunction function =
      cuda::get_kernel(device, name, [&] { return generate_cuda_gather(bytes, rank); });
  KernelArgs args = pack_gather_args(words);
  launch(device, function, index_blocks(words.n), kCudaIndexThreads, args, name);
  check_index_error(node, words.error, index, words.dim, words.bound);
  return out;
}

// Self copied, then src's lines added in index order (Note [scatter_add on the GPU]).
BufferView run_scatter_add(const Node& node, const BufferView& self, const BufferView& index,
                           const BufferView& src) {
  const int device = node.device.index();
  cuda::activate(device);
  BufferView out = cuda_convert(self, node.dtype);  // always a fresh dense buffer
  const int64_t n = numel(index.shape);
  if (n == 0) return out;
  ScatterAddWords words;
  words.dim = normalize_dim(node.attrs.get_int("dim"), self.shape.size(), "scatter_add");
  words.sizes = nonempty_shape(index.shape);
  words.length = words.sizes[words.dim];
  words.lines = n / words.length;
  const Shape self_shape = nonempty_shape(self.shape);
  words.bound = self_shape[words.dim];
  words.index = address(index);
  words.src = address(src);
  words.out = address(out);
  words.error = index_error_slot(node.device);
  words.index_strides = nonempty_strides(index);
  words.src_strides = nonempty_strides(src);
  words.out_strides = contiguous_strides(self_shape);
  const int rank = static_cast<int>(words.sizes.size());
  const std::string name = cuda_scatter_add_kernel_name(node.dtype, rank);
  cuda::CUfunction function =
      cuda::get_kernel(device, name, [&] { return generate_cuda_scatter_add(node.dtype, rank); });
  KernelArgs args = pack_scatter_add_args(words);
  launch(device, function, index_blocks(words.lines), kCudaIndexThreads, args, name);
  check_index_error(node, words.error, index, words.dim, words.bound);
  return out;
}

// Each operand copied, converted, into its place along dim.
BufferView run_cat(const Node& node, std::span<const BufferView* const> inputs) {
  const int device = node.device.index();
  cuda::activate(device);
  BufferView out = allocate_buffer(node.device, node.dtype, node.shape);
  const int64_t dim =
      normalize_dim(node.attrs.get_int("dim"), static_cast<int64_t>(node.shape.size()), "cat");
  const Strides out_strides = contiguous_strides(node.shape);
  int64_t at = 0;
  for (const BufferView* in : inputs) {
    const int64_t start = at;
    at += in->shape[dim];
    StridedCopyWords words;
    words.n = numel(in->shape);
    if (words.n == 0) continue;
    // Dims that both walk in order are one: most pieces copy runs of rank 1 or 2.
    IterationSpace space = merge_dims(in->shape, {in->strides, out_strides});
    words.sizes = space.sizes;
    words.in_strides = space.strides[0];
    words.out_strides = space.strides[1];
    words.in = address(*in);
    words.out =
        address(out) + static_cast<uint64_t>(start * out_strides[dim] * dtype_size(node.dtype));
    const int rank = static_cast<int>(words.sizes.size());
    const std::string name = cuda_strided_copy_kernel_name(in->dtype, node.dtype, rank);
    cuda::CUfunction function = cuda::get_kernel(
        device, name, [&] { return generate_cuda_strided_copy(in->dtype, node.dtype, rank); });
    KernelArgs args = pack_strided_copy_args(words);
    launch(device, function, index_blocks(words.n), kCudaIndexThreads, args, name);
  }
  return out;
}

}  // namespace

BufferView run_index(const Node& node, const ValueBuffers& values) {
  absl::InlinedVector<const BufferView*, 4> inputs;
  for (ValueId v : node.inputs) inputs.push_back(&*values[v]);
  switch (node.op) {
    case Op::Gather:
      return run_gather(node, *inputs[0], *inputs[1]);
    case Op::ScatterAdd:
      return run_scatter_add(node, *inputs[0], *inputs[1], *inputs[2]);
    case Op::Cat:
      return run_cat(node, inputs);
    default:
      break;
  }
  throw VerifierError(absl::StrCat(op_name(node.op), " is not an index op"));
}

}  // namespace lazyfuse::cuda_steps
