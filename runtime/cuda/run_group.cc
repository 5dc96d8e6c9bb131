// Group steps on a GPU (Note [Horizontal fusion]): independent kernels launched as one.
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

namespace lazyfuse::cuda_steps {

namespace {

// The parameter space every GPU since Volta takes in one launch (4 KiB; newer drivers take more,
// which a launch need not rely on), in 8-byte words.
constexpr int kMaxParameterWords = 4096 / 8;

// One run of a Group step, part by part: its members' outputs and plans (kept in the step's
// GroupMemo while the operands' layouts stay), the launches they are cut into and their kernels,
// then the arguments of every launch, then the launches.
class GroupRun {
 public:
  GroupRun(const Graph& graph, const Step& step, ValueBuffers& values)
      : graph_(graph),
        step_(step),
        values_(values),
        count_(step.members.size()),
        device_(step.device.index()),
        fast_math_(env_config().fast_math),
        outputs_(count_),
        reductions_(count_),
        fused_(count_),
        over_columns_(count_, false) {}

  // Each member's outputs, and the plan of each plain reduction; whether every elementwise
  // member's outputs are aligned for vector stores.
  bool allocate_outputs_and_plan_reductions() {
    bool aligned = true;
    for (size_t m = 0; m < count_; ++m) {
      const Step& member = step_.members[m];
      outputs_[m] = allocate_outputs(graph_, member, values_);
      if (member.kind == StepKind::Elementwise) {
        for (size_t k = 0; k < member.outputs.size(); ++k)
          aligned &= outputs_[m][k] %
                         (kVectorAlignment * dtype_size(graph_.nodes[member.outputs[k]].dtype)) ==
                     0;
      } else if (member.nodes.size() == 1) {
        const Node& node = graph_.nodes[member.nodes[0]];
        reductions_[m] = plan_plain_reduction(node, *values_[node.inputs[0]],
                                              step_accumulator(graph_, member, node));
      }
    }
    return aligned;
  }

  // The members' plans in `kept`, made anew where the operands' layouts changed; whether any was.
  bool plan_members(GroupMemo& kept) {
    kept.members.resize(count_);
    bool replanned = !kept.valid;
    for (size_t m = 0; m < count_; ++m) {
      const Step& member = step_.members[m];
      GroupMemo::Member& plan = kept.members[m];
      if (reductions_[m]) {
        const BufferView& in = *values_[graph_.nodes[member.nodes[0]].inputs[0]];
        if (plan.valid && plan.shape == in.shape && plan.strides == in.strides &&
            plan.columns == reductions_[m]->columns &&
            plan.needs_copy == reductions_[m]->needs_copy)
          continue;
        plan.shape = in.shape;
        plan.strides = in.strides;
        plan.columns = reductions_[m]->columns;
        plan.needs_copy = reductions_[m]->needs_copy;
        plan.valid = true;
        replanned = true;
        continue;
      }
      if (memo_fits(plan.elementwise, member, values_, fast_math_)) continue;
      const Operands operands = operands_of(member, values_);
      std::vector<int64_t> output_sizes;
      for (ValueId v : member.outputs) output_sizes.push_back(dtype_size(graph_.nodes[v].dtype));
      // A reduction with fused work reads its space element by element: never the vector
      // variant.
      const bool fused = is_reduction_kind(member.kind);
      CudaElementwiseLaunch launch_plan =
          fused ? plan_cuda_elementwise(member, operands.layouts, {}, {})
                : plan_cuda_elementwise(member, operands.layouts, outputs_[m], output_sizes);
      if (fused) launch_plan.spec.vectorized = false;
      const std::string key = cuda_kernel_cache_key(member, launch_plan.spec, fast_math_);
      remember_launch(plan.elementwise, operands.layouts, std::move(launch_plan), nullptr, key,
                      fast_math_);
      replanned = true;
    }
    kept_ = &kept;
    return replanned;
  }

  // Each reduction with fused work: its rows (or tiles of kept columns, over leading dims), and
  // the chunks of each (from the sizes alone).
  void size_fused_reductions() {
    for (size_t m = 0; m < count_; ++m) {
      const Step& member = step_.members[m];
      if (!is_reduction_kind(member.kind) || reductions_[m]) continue;
      const int64_t rows = numel(graph_.nodes[member.first_with_role(Role::Reduction)].shape);
      const int64_t columns = rows == 0 ? 0 : kept_->members[m].elementwise.plan.numel / rows;
      if (member.kind == StepKind::Column) {
        over_columns_[m] = true;
        fused_[m] = fused_column_words(rows, columns);
        continue;
      }
      const int64_t chunk = row_chunk(rows, columns);
      ReductionWords& words = fused_[m].emplace();
      words.rows = rows;
      words.columns = columns;
      words.chunks = std::max<int64_t>(1, (columns + chunk - 1) / chunk);
      words.chunk = words.chunks == 1 ? std::max<int64_t>(columns, 1) : chunk;
      words.divisor = static_cast<double>(columns);
    }
  }

  // The members cut into launches where the arguments would outgrow the parameter space, and
  // each launch's kernel: a group kernel, or a member's own where it is alone.
  void plan_launches() {
    kept_->launches.clear();
    int words = 0;
    for (size_t m = 0; m < count_; ++m) {
      if (member_blocks(m) == 0 || (reductions_[m] && reductions_[m]->needs_copy)) continue;
      const int member_words = words_of(m);
      // Each launch's words: its members', and one start per member and one more.
      if (kept_->launches.empty() ||
          words + member_words + static_cast<int>(kept_->launches.back().members.size()) + 2 >
              kMaxParameterWords) {
        kept_->launches.emplace_back();
        words = 0;
      }
      kept_->launches.back().members.push_back(m);
      words += member_words;
    }
    for (GroupMemo::Launch& call : kept_->launches) find_kernel(call);
    kept_->valid = true;
  }

  // Reductions that need a dense copy of their operand run on their own, before the rest.
  void run_copied_reductions() {
    for (size_t m = 0; m < count_; ++m) {
      if (!reductions_[m] || !reductions_[m]->needs_copy) continue;
      const Node& node = graph_.nodes[step_.members[m].nodes[0]];
      values_[step_.members[m].nodes[0]] = run_reduction(
          node, *values_[node.inputs[0]], step_accumulator(graph_, step_.members[m], node));
    }
  }

  // Every launch's arguments (and buffers) first, then the launches: once a member's kernel is
  // queued nothing here can fail (Note [Writing an update into its own buffer] in
  // runtime/lazy.cc).
  void launch_all() {
    take_counters();
    std::vector<KernelArgs> call_args;
    std::vector<int64_t> call_blocks;
    call_args.reserve(kept_->launches.size());
    for (const GroupMemo::Launch& call : kept_->launches) {
      KernelArgs& args = call_args.emplace_back();
      absl::InlinedVector<int64_t, 16> starts = {0};
      for (size_t m : call.members) {
        const KernelArgs words = member_args(m);
        args.insert(args.end(), words.begin(), words.end());
        starts.push_back(starts.back() + member_blocks(m));
      }
      if (call.members.size() > 1)
        for (int64_t start : starts) args.push_back(static_cast<uint64_t>(start));
      call_blocks.push_back(starts.back());
    }
    for (size_t c = 0; c < kept_->launches.size(); ++c)
      launch(device_, static_cast<cuda::CUfunction>(kept_->launches[c].function), call_blocks[c],
             kThreadsPerBlock, call_args[c], kept_->launches[c].name);
  }

 private:
  int64_t member_blocks(size_t m) const {
    if (reductions_[m]) return reductions_[m]->kept == 0 ? 0 : reductions_[m]->blocks();
    if (fused_[m])
      return (over_columns_[m] ? column_tiles(*fused_[m]) : fused_[m]->rows) * fused_[m]->chunks;
    return kept_->members[m].elementwise.plan.numel == 0
               ? 0
               : elementwise_blocks(kept_->members[m].elementwise.plan, device_);
  }

  // The argument words member m takes in a group kernel.
  int words_of(size_t m) const {
    const Step& member = step_.members[m];
    if (reductions_[m])
      return (reductions_[m]->columns ? column_reduction_arg_layout()
                                      : plain_reduction_arg_layout())
          .words();
    const CudaElementwiseSpec& spec = kept_->members[m].elementwise.plan.spec;
    if (!fused_[m])
      return elementwise_arg_layout(spec, static_cast<int>(member.inputs.size()),
                                    static_cast<int>(member.outputs.size()))
          .words();
    ArgLayout layout;
    add_space_fields(layout, spec, static_cast<int>(member.inputs.size()));
    if (over_columns_[m])
      add_column_step_fields(layout, static_cast<int>(member.outputs.size()));
    else
      add_reduction_fields(layout);
    return layout.words();
  }

  // The kernel of launch `call`, compiled or found.
  void find_kernel(GroupMemo::Launch& call) const {
    std::vector<CudaGroupMember> members;
    for (size_t m : call.members) {
      CudaGroupMember member{&step_.members[m], kept_->members[m].elementwise.plan.spec, false};
      if (reductions_[m]) member.columns = reductions_[m]->columns;
      members.push_back(member);
    }
    if (members.size() > 1) {
      std::vector<std::string> keys;
      for (const CudaGroupMember& member : members)
        keys.push_back(cuda_group_member_key(graph_, member, fast_math_));
      call.name = cuda_group_kernel_name(keys);
      call.function = cuda::get_kernel(
          device_, call.name, [&] { return generate_cuda_group(graph_, members, fast_math_); });
      return;
    }
    const CudaGroupMember& only = members[0];
    const Step& alone = *only.step;
    call.name = cuda_group_member_key(graph_, only, fast_math_);
    call.function = cuda::get_kernel(device_, call.name, [&] {
      if (alone.kind == StepKind::Elementwise)
        return generate_cuda_elementwise(graph_, alone, only.spec, fast_math_);
      if (alone.nodes.size() > 1) return generate_cuda_step(graph_, alone, only.spec, fast_math_);
      const Node& node = graph_.nodes[alone.nodes[0]];
      const DType in = graph_.nodes[node.inputs[0]].dtype;
      const DType acc = step_accumulator(graph_, alone, node);
      return only.columns ? generate_cuda_column_reduction(node.op, in, node.dtype, acc)
                          : generate_cuda_reduction(node.op, in, node.dtype, acc);
    });
  }

  // One buffer of counters for the device: each reduction of several chunks takes its own part.
  void take_counters() {
    int64_t needed = 0;
    for (size_t m = 0; m < count_; ++m) {
      if (reductions_[m] && !reductions_[m]->needs_copy) needed += reductions_[m]->counters();
      if (fused_[m] && fused_[m]->chunks > 1)
        needed += over_columns_[m] ? column_tiles(*fused_[m]) : fused_[m]->rows;
    }
    counters_ = needed > 0 ? reduction_counters(step_.device, needed) : 0;
    partials_.assign(count_, std::nullopt);
  }

  // The next `n` of the counters taken.
  uint64_t next_counters(int64_t n) {
    const uint64_t at = counters_ + static_cast<uint64_t>(counters_used_) * 4;
    counters_used_ += n;
    return at;
  }

  // Member m's argument words in its launch.
  KernelArgs member_args(size_t m) {
    const Step& member = step_.members[m];
    if (reductions_[m]) {
      const Node& node = graph_.nodes[member.nodes[0]];
      return plain_reduction_args(node, *reductions_[m], outputs_[m][0],
                                  next_counters(reductions_[m]->counters()), partials_[m]);
    }
    const LaunchMemo& plan = kept_->members[m].elementwise;
    if (!fused_[m])
      return pack_elementwise_args(plan.plan, input_addresses(member, values_), outputs_[m]);
    KernelArgs words;
    const Node& node = graph_.nodes[member.first_with_role(Role::Reduction)];
    ReductionWords reduction = *fused_[m];
    if (reduction.chunks > 1) {
      partials_[m] = allocate_buffer(node.device, step_accumulator(graph_, member, node),
                                     {reduction.rows, reduction.chunks});
      reduction.partial = address(*partials_[m]);
      reduction.counters =
          next_counters(over_columns_[m] ? column_tiles(reduction) : reduction.rows);
    }
    append_space_args(plan.plan, input_addresses(member, values_), words);
    if (over_columns_[m]) {
      append_column_step_args(outputs_[m], reduction, words);
    } else {
      reduction.out = outputs_[m][0];
      append_reduction_args(reduction, words);
    }
    return words;
  }

  const Graph& graph_;
  const Step& step_;
  ValueBuffers& values_;
  const size_t count_;
  const int device_;
  const bool fast_math_;
  std::vector<absl::InlinedVector<uint64_t, 4>> outputs_;
  std::vector<std::optional<PlainReduction>> reductions_;
  std::vector<std::optional<ReductionWords>> fused_;
  std::vector<bool> over_columns_;
  GroupMemo* kept_ = nullptr;
  uint64_t counters_ = 0;
  int64_t counters_used_ = 0;
  std::vector<std::optional<BufferView>> partials_;
};

}  // namespace

void run_group(const Graph& graph, const Step& step, ValueBuffers& values, GroupMemo* memo) {
  cuda::activate(step.device.index());
  GroupRun run(graph, step, values);
  const bool outputs_aligned = run.allocate_outputs_and_plan_reductions();
  // A memo is kept only for aligned outputs, which any plan suits (as run_elementwise keeps it).
  GroupMemo scratch;
  GroupMemo& kept = outputs_aligned && memo != nullptr ? *memo : scratch;
  const bool replanned = run.plan_members(kept);
  run.size_fused_reductions();
  if (replanned) {
    run.plan_launches();
  } else {
    cuda::count_memory_hit();
  }
  run.run_copied_reductions();
  run.launch_all();
}

}  // namespace lazyfuse::cuda_steps
