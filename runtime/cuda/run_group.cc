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

}  // namespace

// A Group step (Note [Horizontal fusion]): its members' kernels as few launches, each a group
// kernel whose blocks are split among its members (or a member's own kernel where it is alone
// in a launch), cut where the arguments would outgrow the parameter space. A reduction whose
// operand must first be copied dense runs on its own, before the rest.
void run_group(const Graph& graph, const Step& step, ValueBuffers& values, GroupMemo* memo) {
  const int device = step.device.index();
  cuda::activate(device);
  const size_t count = step.members.size();
  const bool fast_math = env_config().fast_math;
  std::vector<absl::InlinedVector<uint64_t, 4>> outputs(count);
  std::vector<std::optional<PlainReduction>> reductions(count);
  bool outputs_aligned = true;
  for (size_t m = 0; m < count; ++m) {
    const Step& member = step.members[m];
    outputs[m] = allocate_outputs(graph, member, values);
    if (member.kind == StepKind::Elementwise) {
      for (size_t k = 0; k < member.outputs.size(); ++k)
        outputs_aligned &=
            outputs[m][k] % (kVectorAlignment * dtype_size(graph.nodes[member.outputs[k]].dtype)) ==
            0;
    } else if (member.nodes.size() == 1) {
      const Node& node = graph.nodes[member.nodes[0]];
      reductions[m] = plan_plain_reduction(node, *values[node.inputs[0]],
                                           step_accumulator(graph, member, node));
    }
  }
  // A memo is kept only for aligned outputs, which any plan suits (as run_elementwise keeps it).
  GroupMemo scratch;
  GroupMemo& kept = outputs_aligned && memo != nullptr ? *memo : scratch;
  kept.members.resize(count);
  bool replanned = !kept.valid;
  for (size_t m = 0; m < count; ++m) {
    const Step& member = step.members[m];
    GroupMemo::Member& plan = kept.members[m];
    if (reductions[m]) {
      const BufferView& in = *values[graph.nodes[member.nodes[0]].inputs[0]];
      if (plan.valid && plan.shape == in.shape && plan.strides == in.strides &&
          plan.columns == reductions[m]->columns && plan.needs_copy == reductions[m]->needs_copy)
        continue;
      plan.shape = in.shape;
      plan.strides = in.strides;
      plan.columns = reductions[m]->columns;
      plan.needs_copy = reductions[m]->needs_copy;
      plan.valid = true;
      replanned = true;
      continue;
    }
    if (memo_fits(plan.elementwise, member, values, fast_math)) continue;
    const Operands operands = operands_of(member, values);
    std::vector<int64_t> output_sizes;
    for (ValueId v : member.outputs) output_sizes.push_back(dtype_size(graph.nodes[v].dtype));
    // A reduction with fused work reads its space element by element: never the vector variant.
    const bool fused = is_reduction_kind(member.kind);
    CudaElementwiseLaunch launch_plan =
        fused ? plan_cuda_elementwise(member, operands.layouts, {}, {})
              : plan_cuda_elementwise(member, operands.layouts, outputs[m], output_sizes);
    if (fused) launch_plan.spec.vectorized = false;
    const std::string key = cuda_kernel_cache_key(member, launch_plan.spec, fast_math);
    remember_launch(plan.elementwise, operands.layouts, std::move(launch_plan), nullptr, key,
                    fast_math);
    replanned = true;
  }
  // Each reduction with fused work: its rows (or tiles of kept columns, over leading dims), and
  // the chunks of each (from the sizes alone).
  std::vector<std::optional<ReductionWords>> fused(count);
  std::vector<bool> over_columns(count, false);
  for (size_t m = 0; m < count; ++m) {
    const Step& member = step.members[m];
    if (!is_reduction_kind(member.kind) || reductions[m]) continue;
    const int64_t rows = numel(graph.nodes[member.first_with_role(Role::Reduction)].shape);
    const int64_t columns = rows == 0 ? 0 : kept.members[m].elementwise.plan.numel / rows;
    if (member.kind == StepKind::Column) {
      over_columns[m] = true;
      fused[m] = fused_column_words(rows, columns);
      continue;
    }
    const int64_t chunk = row_chunk(rows, columns);
    ReductionWords& words = fused[m].emplace();
    words.rows = rows;
    words.columns = columns;
    words.chunks = std::max<int64_t>(1, (columns + chunk - 1) / chunk);
    words.chunk = words.chunks == 1 ? std::max<int64_t>(columns, 1) : chunk;
    words.divisor = static_cast<double>(columns);
  }
  auto member_blocks = [&](size_t m) -> int64_t {
    if (reductions[m]) return reductions[m]->kept == 0 ? 0 : reductions[m]->blocks();
    if (fused[m])
      return (over_columns[m] ? column_tiles(*fused[m]) : fused[m]->rows) * fused[m]->chunks;
    return kept.members[m].elementwise.plan.numel == 0
               ? 0
               : elementwise_blocks(kept.members[m].elementwise.plan, device);
  };
  if (replanned) {
    kept.launches.clear();
    int words = 0;
    for (size_t m = 0; m < count; ++m) {
      if (member_blocks(m) == 0 || (reductions[m] && reductions[m]->needs_copy)) continue;
      const Step& member = step.members[m];
      int member_words = 0;
      if (reductions[m]) {
        member_words =
            (reductions[m]->columns ? column_reduction_arg_layout() : plain_reduction_arg_layout())
                .words();
      } else if (fused[m]) {
        ArgLayout layout;
        add_space_fields(layout, kept.members[m].elementwise.plan.spec,
                         static_cast<int>(member.inputs.size()));
        if (over_columns[m])
          add_column_step_fields(layout, static_cast<int>(member.outputs.size()));
        else
          add_reduction_fields(layout);
        member_words = layout.words();
      } else {
        member_words = elementwise_arg_layout(kept.members[m].elementwise.plan.spec,
                                              static_cast<int>(member.inputs.size()),
                                              static_cast<int>(member.outputs.size()))
                           .words();
      }
      // Each launch's words: its members', and one start per member and one more.
      if (kept.launches.empty() ||
          words + member_words + static_cast<int>(kept.launches.back().members.size()) + 2 >
              kMaxParameterWords) {
        kept.launches.emplace_back();
        words = 0;
      }
      kept.launches.back().members.push_back(m);
      words += member_words;
    }
    for (GroupMemo::Launch& call : kept.launches) {
      std::vector<CudaGroupMember> members;
      for (size_t m : call.members) {
        CudaGroupMember member{&step.members[m], kept.members[m].elementwise.plan.spec, false};
        if (reductions[m]) member.columns = reductions[m]->columns;
        members.push_back(member);
      }
      if (members.size() == 1) {
        const CudaGroupMember& only = members[0];
        const Step& alone = *only.step;
        call.name = cuda_group_member_key(graph, only, fast_math);
        call.function = cuda::get_kernel(device, call.name, [&] {
          if (alone.kind == StepKind::Elementwise)
            return generate_cuda_elementwise(graph, alone, only.spec, fast_math);
          if (alone.nodes.size() > 1) return generate_cuda_step(graph, alone, only.spec, fast_math);
          const Node& node = graph.nodes[alone.nodes[0]];
          const DType in = graph.nodes[node.inputs[0]].dtype;
          const DType acc = step_accumulator(graph, alone, node);
          return only.columns ? generate_cuda_column_reduction(node.op, in, node.dtype, acc)
                              : generate_cuda_reduction(node.op, in, node.dtype, acc);
        });
        continue;
      }
      std::vector<std::string> keys;
      for (const CudaGroupMember& member : members)
        keys.push_back(cuda_group_member_key(graph, member, fast_math));
      call.name = cuda_group_kernel_name(keys);
      call.function = cuda::get_kernel(
          device, call.name, [&] { return generate_cuda_group(graph, members, fast_math); });
    }
    kept.valid = true;
  } else {
    cuda::count_memory_hit();
  }
  // Reductions that need a dense copy of their operand run on their own.
  for (size_t m = 0; m < count; ++m) {
    if (!reductions[m] || !reductions[m]->needs_copy) continue;
    const Node& node = graph.nodes[step.members[m].nodes[0]];
    values[step.members[m].nodes[0]] = run_reduction(
        node, *values[node.inputs[0]], step_accumulator(graph, step.members[m], node));
  }
  // One buffer of counters for the device: each reduction of several chunks takes its own part.
  int64_t counters_needed = 0;
  for (size_t m = 0; m < count; ++m) {
    if (reductions[m] && !reductions[m]->needs_copy) counters_needed += reductions[m]->counters();
    if (fused[m] && fused[m]->chunks > 1)
      counters_needed += over_columns[m] ? column_tiles(*fused[m]) : fused[m]->rows;
  }
  const uint64_t counters =
      counters_needed > 0 ? reduction_counters(step.device, counters_needed) : 0;
  int64_t counters_used = 0;
  std::vector<std::optional<BufferView>> partials(count);
  // Every launch's arguments (and buffers) first, then the launches: once a member's kernel is
  // queued nothing here can fail (Note [Writing an update into its own buffer] in
  // runtime/lazy.cc).
  std::vector<KernelArgs> call_args;
  std::vector<int64_t> call_blocks;
  call_args.reserve(kept.launches.size());
  for (const GroupMemo::Launch& call : kept.launches) {
    KernelArgs& args = call_args.emplace_back();
    absl::InlinedVector<int64_t, 16> starts = {0};
    for (size_t m : call.members) {
      const Step& member = step.members[m];
      KernelArgs words;
      if (reductions[m]) {
        const Node& node = graph.nodes[member.nodes[0]];
        words =
            plain_reduction_args(node, *reductions[m], outputs[m][0],
                                 counters + static_cast<uint64_t>(counters_used) * 4, partials[m]);
        counters_used += reductions[m]->counters();
      } else if (fused[m]) {
        const Node& node = graph.nodes[member.first_with_role(Role::Reduction)];
        ReductionWords reduction = *fused[m];
        if (reduction.chunks > 1) {
          partials[m] = allocate_buffer(node.device, step_accumulator(graph, member, node),
                                        {reduction.rows, reduction.chunks});
          reduction.partial = address(*partials[m]);
          reduction.counters = counters + static_cast<uint64_t>(counters_used) * 4;
          counters_used += over_columns[m] ? column_tiles(reduction) : reduction.rows;
        }
        append_space_args(kept.members[m].elementwise.plan, input_addresses(member, values), words);
        if (over_columns[m]) {
          append_column_step_args(outputs[m], reduction, words);
        } else {
          reduction.out = outputs[m][0];
          append_reduction_args(reduction, words);
        }
      } else {
        words = pack_elementwise_args(kept.members[m].elementwise.plan,
                                      input_addresses(member, values), outputs[m]);
      }
      args.insert(args.end(), words.begin(), words.end());
      starts.push_back(starts.back() + member_blocks(m));
    }
    if (call.members.size() > 1)
      for (int64_t start : starts) args.push_back(static_cast<uint64_t>(start));
    call_blocks.push_back(starts.back());
  }
  for (size_t c = 0; c < kept.launches.size(); ++c)
    launch(device, static_cast<cuda::CUfunction>(kept.launches[c].function), call_blocks[c],
           kThreadsPerBlock, call_args[c], kept.launches[c].name);
}

}  // namespace lazyfuse::cuda_steps
