// The pieces of the CUDA backend that its step runners share, one runner file per step kind
// (run_elementwise.cc, run_reduction.cc, run_group.cc, run_matmul.cc, run_index.cc), and the
// runners themselves, which cuda_backend.cc dispatches to. Internal to runtime/cuda/.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/codegen/cuda/cuda_kernel_args.h"
#include "lazyfuse/codegen/kernel_plan.h"
#include "lazyfuse/runtime/backend.h"
#include "lazyfuse/runtime/cuda/cuda_driver.h"
#include "lazyfuse/runtime/env.h"
#include "lazyfuse/runtime/kernel_cache.h"

namespace lazyfuse::cuda_steps {

// ---- Launches (step_launch.cc) ----

constexpr unsigned kThreadsPerBlock = 256;

// A group kernel runs elementwise and reduction members in blocks of one size.
static_assert(kThreadsPerBlock == kCudaReduceThreads);

// What a launch of a generated kernel can reuse while its operands keep their layout: the plan
// (variant, merged sizes and strides), the kernel and the grid. Kept per step of a cached
// schedule; used under the evaluation lock.
struct LaunchMemo : StepCache {
  bool valid = false;
  uint64_t kernel_generation = 0;  // cuda::kernel_cache_generation() when it was made
  bool fast_math = false;
  std::vector<Shape> shapes;
  std::vector<Strides> strides;
  std::vector<bool> aligned;  // each operand's address, to the plan's vector width
  CudaElementwiseLaunch plan;
  void* function = nullptr;  // the CUfunction
  std::string name;          // its cache key, for errors
};

uint64_t address(const BufferView& view);

// Counts a launch or library call the GPU will run: not in a dry run, whose work runs, if at
// all, as a graph that counts its own (Note [CUDA graph replay]).
void count_gpu_launch();

// Launches `function` with its one struct parameter `args`; under LAZYFUSE_SYNC=1 waits, so
// an error names the kernel.
void launch(int device, cuda::CUfunction function, int64_t blocks, unsigned threads,
            KernelArgs& args, const std::string& name);

// A step's operands as codegen sees them, with their addresses.
struct Operands {
  std::vector<OperandLayout> layouts;
  std::vector<uint64_t> addresses;
};

Operands operands_of(const Step& step, const ValueBuffers& values);

// Buffers for the step's results (fresh, or the one the evaluator bound); their addresses, in step
// order.
absl::InlinedVector<uint64_t, 4> allocate_outputs(const Graph& graph, const Step& step,
                                                  ValueBuffers& values);

// Outputs as aligned as the widest vector access (8 elements) suit any plan.
constexpr int64_t kVectorAlignment = 8;

// Whether `memo` was made for operands laid out as `values`' inputs of `step` are now: each
// keeps its shape, strides, and alignment to the plan's vector width (the plan depends on
// nothing else about the operands).
bool memo_fits(const LaunchMemo& memo, const Step& step, const ValueBuffers& values,
               bool fast_math);

// Keeps a launch's plan and kernel in `memo` for the next evaluation whose operands keep
// these layouts (memo_fits).
void remember_launch(LaunchMemo& memo, const std::vector<OperandLayout>& layouts,
                     CudaElementwiseLaunch plan, cuda::CUfunction function, const std::string& key,
                     bool fast_math);

// The step's operand addresses, in step order.
absl::InlinedVector<uint64_t, 8> input_addresses(const Step& step, const ValueBuffers& values);

// A step's plan and kernel for its operands as they are now: the memo's when it fits them
// (counted as a memory hit, as a lookup would be), else `make_plan` over their layouts and the
// kernel of `generate`, remembered in the memo (or in `scratch` without one). Every kind of
// generated kernel (elementwise, fused reduction, row) finds its kernel here and packs its own
// arguments (codegen/cuda/cuda_kernel_args.h).
template <typename MakePlan, typename Generate>
const LaunchMemo& planned_kernel(const Step& step, const ValueBuffers& values, LaunchMemo* memo,
                                 LaunchMemo& scratch, MakePlan make_plan, Generate generate) {
  const bool fast_math = env_config().fast_math;
  if (memo != nullptr && memo_fits(*memo, step, values, fast_math)) {
    cuda::count_memory_hit();
    return *memo;
  }
  const Operands operands = operands_of(step, values);
  CudaElementwiseLaunch plan = make_plan(operands.layouts);
  const std::string key = cuda_kernel_cache_key(step, plan.spec, fast_math);
  cuda::CUfunction function =
      cuda::get_kernel(step.device.index(), key, [&] { return generate(plan.spec, fast_math); });
  LaunchMemo& kept = memo != nullptr ? *memo : scratch;
  remember_launch(kept, operands.layouts, std::move(plan), function, key, fast_math);
  return kept;
}

// ---- Elementwise steps (run_elementwise.cc) ----

// An elementwise launch's grid: a thread per element (or per vector), which measured fastest;
// under LAZYFUSE_BLOCKS_PER_SM a capped grid whose threads loop over the rest.
int64_t elementwise_blocks(const CudaElementwiseLaunch& plan, int device);

void run_elementwise(const Graph& graph, const Step& step, ValueBuffers& values, LaunchMemo* memo);

// A contiguous copy of `source` (any strides, broadcast included) converted to `dtype`: one
// generated elementwise kernel (a copy or a cast).
BufferView cuda_convert(const BufferView& source, DType dtype);

BufferView cuda_contiguous(const BufferView& source);

// ---- Reductions, rows and columns (run_reduction.cc) ----

// Zeroed counters, one per row, for reductions whose rows span several chunks: a row's last
// block to finish combines its partials and sets the row's counter back to zero (codegen's
// reduction_tail). A device's kernels run in order on its one stream, so one buffer of
// counters serves every launch there; it only grows.
uint64_t reduction_counters(const Device& device, int64_t rows);

// The columns one block of a reduction over rows takes: LAZYFUSE_REDUCE_CHUNK's, or codegen's
// by size.
int64_t row_chunk(int64_t rows, int64_t columns);

// A reduction with a fused prologue: one kernel computes the prologue's elements and reduces
// them, its last block per row combining the chunks' partials.
BufferView run_fused_reduction(const Graph& graph, const Step& step, const Node& node,
                               const ValueBuffers& values, LaunchMemo* memo);

// A reduction over leading dims with fused work (codegen's generate_cuda_fused_reduction):
// its kept columns, reduced length and chunking, from the sizes alone.
ReductionWords fused_column_words(int64_t kept, int64_t reduced);

int64_t column_tiles(const ReductionWords& words);

// One kernel computes the work over the space column by column, stores what the step stores
// and reduces the columns, the last block of each tile combining the chunks' partials.
void run_fused_column_reduction(const Graph& graph, const Step& step, const Node& node,
                                ValueBuffers& values, LaunchMemo* memo);

// A row step (reductions of the same rows, an epilogue): one warp per row; a column step with
// work after its reduction (is_column_row_step) the same kernel over columns, a lane a column.
void run_row_kernel(const Graph& graph, const Step& step, const Node& node, ValueBuffers& values,
                    LaunchMemo* memo);

// A reduction of a stored operand as one kernel reads it: the operand as [kept..., reduced...]
// (`view`), read by rows where that view is dense, by columns where column_stride allows, and
// otherwise by rows of a dense copy, which the caller makes (needs_copy). The chunking comes
// from the sizes alone.
struct PlainReduction {
  BufferView view;
  int64_t kept = 1, reduced = 1;
  bool columns = false;
  bool needs_copy = false;
  int64_t stride = 1;  // columns: between one reduced element and the next
  int64_t chunk = 1, chunks = 1;
  DType acc = DType::Float64;  // cuda_reduction_accumulator's

  int64_t groups() const {  // rows, or tiles of columns
    return columns ? (kept + kCudaColumnTile - 1) / kCudaColumnTile : kept;
  }
  int64_t blocks() const { return groups() * chunks; }
  // Counters a launch needs (a zero each): one per row or tile of several chunks.
  int64_t counters() const { return chunks > 1 ? groups() : 0; }
};

PlainReduction plan_plain_reduction(const Node& node, const BufferView& input, DType acc);

// The plan's words (plain_reduction_arg_layout or column_reduction_arg_layout), with a buffer
// of partials in `partial` when there are several chunks, and `counters` the address of its
// counters() zeros.
KernelArgs plain_reduction_args(const Node& node, const PlainReduction& plan, uint64_t out,
                                uint64_t counters, std::optional<BufferView>& partial);

BufferView run_reduction(const Node& node, const BufferView& input, DType acc);

// ---- Groups (run_group.cc) ----

// What a Group step keeps between runs: each member's plan, and the launches made of them,
// valid while every member's plan fits its operands.
struct GroupMemo : StepCache {
  struct Member {
    LaunchMemo elementwise;  // an elementwise member's plan (its function stays null)
    // A reduction member's operand layout and how the plan reads it.
    Shape shape;
    Strides strides;
    bool columns = false, needs_copy = false, valid = false;
  };
  std::vector<Member> members;
  struct Launch {
    std::vector<size_t> members;  // member indices, in order
    void* function = nullptr;     // the CUfunction: a group kernel, or a member's own kernel
    std::string name;
  };
  std::vector<Launch> launches;
  bool valid = false;
};

// A Group step (Note [Horizontal fusion]): its members' kernels as few launches, each a group
// kernel whose blocks are split among its members (or a member's own kernel where it is alone
// in a launch), cut where the arguments would outgrow the parameter space. A reduction whose
// operand must first be copied dense runs on its own, before the rest.
void run_group(const Graph& graph, const Step& step, ValueBuffers& values, GroupMemo* memo);

// ---- Attention (run_attention.cc) ----

// Whether the attention kernels take these head dims (codegen/cuda/cuda_attention.cc).
bool cuda_runs_attention(DType dtype, int64_t head_dim, int64_t value_dim);
// Runs an attention step: sets each member's value.
void run_attention(const Graph& graph, const Step& step, ValueBuffers& values);

// ---- Matmuls (run_matmul.cc) ----

BufferView run_matmul(const Node& node, const BufferView& a, const BufferView& b);

// A product of few rows by lazyfuse's own kernel (Note [Products of few rows] in
// codegen/cuda/cuda_matmul.cc), with its step's bias and relu where it has them: sets the step's
// output and returns true; false where the kernel does not take the operands (the library
// computes it then).
bool run_skinny_matmul(const Graph& graph, ValueId matmul_id, const MatmulEpilogue* epilogue,
                       ValueBuffers& values);

// A matmul with its bias (and relu) as one cuBLASLt call with an epilogue, where cuBLASLt takes
// the operands' dtype and layout: sets the step's output and returns true; false otherwise.
bool run_matmul_with_epilogue(const Graph& graph, const MatmulEpilogue& epilogue,
                              ValueBuffers& values);

// ---- Index steps (run_index.cc) ----

BufferView run_index(const Node& node, const ValueBuffers& values);

}  // namespace lazyfuse::cuda_steps
