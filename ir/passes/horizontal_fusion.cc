// Horizontal fusion: independent kernels share kernels and launches.
//
// Note [Horizontal fusion]
// After fusion a schedule often holds many small elementwise kernels that do not depend on each
// other: an optimizer's update of each parameter, a kernel of its parameter's shape each; the
// bias corrections of each parameter's Adam state; several results of one evaluation over the
// same tensors. Each costs a launch, and for small tensors the launch costs more than the work.
//
// Every compute step gets a level, as late as the steps reading its values allow: one less than
// the lowest level among them (a view or transfer passes its reader's level on), and the last
// level for a step no other step reads from (a parameter's update, a returned value). Any path
// from one compute step to another climbs at least one level, so two steps of one level never
// depend on each other, and steps of one level may run together in any grouping. As late as
// possible gathers what many chains need last: every parameter's update, and the bias
// corrections and gradients it reads. Per level and device:
//  1. Sibling fusion: elementwise steps of the same iteration space that read a common input
//     become one kernel, which reads that input once (XLA's multi-output sibling fusion), as
//     long as fusion's caps hold for the union.
//  2. Horizontal fusion: two or more steps left, elementwise or single reductions (of a stored
//     value, or of elementwise work fused before them), become one Group step: one launch whose
//     blocks are split among its members, each running its own body over its own space
//     (PyTorch's multi-tensor `foreach` kernels, for any elementwise body; a bias's gradient
//     beside the updates' corrections; a norm of every gradient). The CPU runs the members one
//     after another.
// Before that, a level whose group-able steps could all run at some earlier level that has
// group-able steps of its own on the device (each after every step it reads: the bias
// corrections, which read only the step count; the bias gradient of the loss) moves them to the
// latest such level, where they join that launch instead of making one.
// Row steps, matmuls, index steps, views and transfers are left as they are. A step moved later
// keeps its operands alive until then (an optimizer's update reads parameters, gradients and
// state, which live on anyway) and holds its own results for less time.
//
// Before: a schedule from run_fusion (with fusion enabled). After: the same values computed by
// as many or fewer steps, in an order where every step comes after those computing its inputs.
#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "lazyfuse/ir/infer.h"
#include "lazyfuse/ir/passes/passes.h"

namespace lazyfuse {
namespace {

// A collective is the process group's, not a kernel: never grouped.
bool is_compute(const Step& step) {
  return step.kind != StepKind::View && step.kind != StepKind::Transfer &&
         step.kind != StepKind::Collective;
}

// Each compute step's level (Note [Horizontal fusion]), for steps in producer-first order: as
// late as its readers allow, the last level for a step nothing reads. A view or transfer takes
// its reader's slot, so what it reads from sits below that reader.
std::vector<int> step_levels(const Graph& graph, const std::vector<Step>& steps) {
  std::vector<int> producer(graph.nodes.size(), -1);
  for (size_t s = 0; s < steps.size(); ++s)
    for (ValueId v : steps[s].outputs) producer[v] = static_cast<int>(s);
  // The last level: the longest chain of compute steps, less one.
  std::vector<int> earliest(steps.size(), 0);
  int last = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    int after = -1;
    for (ValueId in : steps[s].inputs)
      if (producer[in] >= 0) after = std::max(after, earliest[producer[in]]);
    earliest[s] = is_compute(steps[s]) ? after + 1 : std::max(after, 0);
    last = std::max(last, earliest[s]);
  }
  std::vector<int> level(steps.size(), last);
  for (size_t s = steps.size(); s-- > 0;) {
    const int slot = is_compute(steps[s]) ? level[s] - 1 : level[s];
    for (ValueId in : steps[s].inputs)
      if (producer[in] >= 0) level[producer[in]] = std::min(level[producer[in]], slot);
  }
  return level;
}

// For each step, the highest level among the compute steps it reads from (through views and
// transfers), or -1: a step may run at any level above it.
std::vector<int> producer_levels(const Graph& graph, const std::vector<Step>& steps,
                                 const std::vector<int>& level) {
  std::vector<int> producer(graph.nodes.size(), -1);
  for (size_t s = 0; s < steps.size(); ++s)
    for (ValueId v : steps[s].outputs) producer[v] = static_cast<int>(s);
  std::vector<int> floor(steps.size(), -1);
  for (size_t s = 0; s < steps.size(); ++s)
    for (ValueId in : steps[s].inputs) {
      const int p = producer[in];
      if (p >= 0) floor[s] = std::max(floor[s], is_compute(steps[p]) ? level[p] : floor[p]);
    }
  return floor;
}

// The inputs of `step` (whose nodes are set, in topological order): what its members read and
// do not compute, in order of first use.
std::vector<ValueId> inputs_of(const Graph& graph, const std::vector<ValueId>& nodes) {
  const absl::flat_hash_set<ValueId> members(nodes.begin(), nodes.end());
  std::vector<ValueId> inputs;
  absl::flat_hash_set<ValueId> seen;
  for (ValueId m : nodes)
    for (ValueId in : graph.nodes[m].inputs)
      if (!members.contains(in) && seen.insert(in).second) inputs.push_back(in);
  return inputs;
}

// `a` and `b`, elementwise steps of one space, as one kernel computing both; nullopt when the
// union would exceed the caps.
std::optional<Step> merge_siblings(const Graph& graph, const Step& a, const Step& b,
                                   const FusionOptions& options) {
  std::vector<ValueId> nodes = a.nodes;
  nodes.insert(nodes.end(), b.nodes.begin(), b.nodes.end());
  std::sort(nodes.begin(), nodes.end());  // value ids are in topological order
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  std::vector<ValueId> inputs = inputs_of(graph, nodes);
  if (static_cast<int>(nodes.size()) > options.max_nodes ||
      static_cast<int>(inputs.size()) > options.max_inputs)
    return std::nullopt;
  Step merged = a;
  merged.roles.assign(nodes.size(), Role::Work);
  merged.nodes = std::move(nodes);
  merged.inputs = std::move(inputs);
  merged.outputs.insert(merged.outputs.end(), b.outputs.begin(), b.outputs.end());
  std::sort(merged.outputs.begin(), merged.outputs.end());
  return merged;
}

bool share_an_input(const Step& a, const Step& b) {
  for (ValueId v : a.inputs)
    if (std::find(b.inputs.begin(), b.inputs.end(), v) != b.inputs.end()) return true;
  return false;
}

// Step 1 of the note over the elementwise steps of one level and device, in schedule order.
std::vector<Step> fuse_siblings(const Graph& graph, std::vector<Step> steps,
                                const FusionOptions& options) {
  std::vector<Step> fused;
  for (Step& step : steps) {
    bool merged = false;
    for (Step& into : fused) {
      if (into.shape != step.shape || !share_an_input(into, step)) continue;
      if (std::optional<Step> both = merge_siblings(graph, into, step, options)) {
        into = std::move(*both);
        merged = true;
        break;
      }
    }
    if (!merged) fused.push_back(std::move(step));
  }
  return fused;
}

// Steps a group may take, whose kernels the code generators can give a range of blocks:
// elementwise kernels, and reductions of one reduction node, of a stored value or of the
// elementwise work fused before it (a row step stays alone), whose reduction is its last member.
bool is_group_member(const Step& step) {
  if (step.kind == StepKind::Elementwise) return true;
  if (step.kind != StepKind::Reduction && step.kind != StepKind::Column) return false;
  // One reduction, last: a column's row step (softmax over dim 0) has more, or work after it.
  return step.roles.back() == Role::Reduction &&
         std::count(step.roles.begin(), step.roles.end(), Role::Reduction) == 1;
}

Step make_group(std::vector<Step> members) {
  Step group;
  group.kind = StepKind::Group;
  group.round_each_op = members.front().round_each_op;
  group.shape = members.front().shape;
  group.device = members.front().device;
  absl::flat_hash_set<ValueId> inputs;
  for (const Step& m : members) {
    group.nodes.insert(group.nodes.end(), m.nodes.begin(), m.nodes.end());
    group.roles.insert(group.roles.end(), m.roles.begin(), m.roles.end());
    for (ValueId v : m.inputs)
      if (inputs.insert(v).second) group.inputs.push_back(v);
    group.outputs.insert(group.outputs.end(), m.outputs.begin(), m.outputs.end());
  }
  group.members = std::move(members);
  return group;
}

}  // namespace

void run_horizontal_fusion(Schedule& schedule, const FusionOptions& options) {
  if (!options.enabled) return;
  const Graph& graph = schedule.graph;
  std::vector<int> level = step_levels(graph, schedule.steps);
  const std::vector<int> floor = producer_levels(graph, schedule.steps, level);
  // The levels holding group-able steps, per device; then, from the last level down, a level
  // whose steps all fit at an earlier one of them moves there.
  using Where = std::tuple<int, DeviceType, int>;
  std::map<Where, std::vector<size_t>> at;
  for (size_t s = 0; s < schedule.steps.size(); ++s) {
    const Step& step = schedule.steps[s];
    if (is_group_member(step)) at[{level[s], step.device.type(), step.device.index()}].push_back(s);
  }
  for (auto it = at.rbegin(); it != at.rend(); ++it) {
    auto& [where, members] = *it;
    const auto& [here, type, index] = where;
    std::vector<int> target(members.size(), -1);
    bool all_move = !members.empty();
    for (size_t k = 0; k < members.size() && all_move; ++k) {
      for (auto earlier = at.lower_bound({here, type, index}); earlier != at.begin();) {
        --earlier;
        const auto& [other, other_type, other_index] = earlier->first;
        if (other <= floor[members[k]]) break;
        if (other_type == type && other_index == index && !earlier->second.empty()) {
          target[k] = other;
          break;
        }
      }
      all_move = target[k] >= 0;
    }
    if (!all_move) continue;
    for (size_t k = 0; k < members.size(); ++k) {
      level[members[k]] = target[k];
      at[{target[k], type, index}].push_back(members[k]);
    }
    members.clear();
  }
  // The group-able steps by level and device, in schedule order; the rest stay as they are.
  std::map<Where, std::vector<Step>> together;
  std::vector<Step> steps;
  for (size_t s = 0; s < schedule.steps.size(); ++s) {
    Step& step = schedule.steps[s];
    if (is_group_member(step))
      together[{level[s], step.device.type(), step.device.index()}].push_back(std::move(step));
    else
      steps.push_back(std::move(step));
  }
  for (auto& [where, members] : together) {
    // Elementwise siblings first, then the reductions.
    std::vector<Step> elementwise, reductions;
    for (Step& member : members)
      (member.kind == StepKind::Elementwise ? elementwise : reductions)
          .push_back(std::move(member));
    std::vector<Step> fused = fuse_siblings(graph, std::move(elementwise), options);
    for (Step& reduction : reductions) fused.push_back(std::move(reduction));
    for (Step& step : fused) step.kernel_key = step_kernel_key(graph, step);
    if (fused.size() == 1) {
      steps.push_back(std::move(fused.front()));
      continue;
    }
    Step group = make_group(std::move(fused));
    group.kernel_key = step_kernel_key(graph, group);
    steps.push_back(std::move(group));
  }
  schedule.steps = order_steps(graph, std::move(steps));
}

}  // namespace lazyfuse
