// Fusion: the graph cut into steps.
//
// Note [The fusion algorithm]
// Nodes are visited in topological order. A fusable node (an elementwise op, cast, copy or
// generator) joins the groups of those operands that are fusable, of the same shape and on the
// same device, merging them into one group, when that creates no cycle: no operand outside the
// merged group, and no outside value that a candidate group reads, may depend on a group being
// merged (followed group to group through each group's outside operands, since a group that
// grows after another read it may gain dependences of its own). When the merge would
// cycle the node tries the first candidate alone, and otherwise starts a group of its own.
// Every member of a group has the group's shape; a value of another shape that a group reads
// with broadcasting is read from storage. Scalar constants are not values of their own: each
// group that uses one computes it in place, so they never cost a load or a store.
// Matmul, views and transfers are a step each. A reduction is a step of its own too, then
// absorbs, where the shapes allow, the group computing its operand (its prologue: when nothing
// else reads that group and the reduced dims are trailing) and, for a keepdim row reduction of
// rows up to kMaxEpilogueRow elements, the group reading its result over the operand's shape
// (its epilogue: softmax's normalisation). Last, a row reduction whose operand such a row step
// computes joins it when both reduce the same rows (softmax's sum joins its max's step: one
// kernel). ReductionParts (ir/schedule.h) tells the roles apart.
//
// Caps, each cutting an elementwise group when exceeded: `max_nodes` members (compile time and
// registers grow with the body), `max_inputs` operands read from storage (kernel parameter
// space and memory streams per thread). Stored values are not capped: each costs a pointer and
// a store that storing it from another kernel would cost as well. A reduction's absorbed groups
// were each within the caps; together they may exceed them.
//
// Before: a placed graph (run_placement), usually after cse and dce.
// After: a Schedule whose steps, in an order where each step's inputs are params or outputs of
// earlier steps, cover every non-param node once (a scalar constant once per user step, or as
// a step of its own when it is returned or read by a non-elementwise step). The graph itself is
// unchanged.
#include <algorithm>
#include <numeric>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "ir/errors.h"
#include "ir/infer.h"
#include "ir/passes/passes.h"
#include "ir/stable_hash.h"

namespace lazyfuse {
namespace {

bool is_scalar_const(const Node& node) { return node.op == Op::Const && numel(node.shape) == 1; }

StepKind step_kind(Op op) {
  switch (op_kind(op)) {
    case OpKind::Reduction:
      return StepKind::Reduction;
    case OpKind::Matmul:
      return StepKind::Matmul;
    case OpKind::View:
      return StepKind::View;
    case OpKind::Transfer:
      return StepKind::Transfer;
    default:
      return StepKind::Elementwise;
  }
}

// Whether reduction `id` reduces the trailing dims of its operand: each result element then
// reduces a contiguous range of the operand's elements.
bool reduces_trailing_dims(const Graph& graph, ValueId id) {
  const Node& node = graph.nodes[id];
  const int64_t rank = static_cast<int64_t>(graph.nodes[node.inputs[0]].shape.size());
  const std::vector<int64_t> dims = reduction_dims(node.attrs, rank);
  for (size_t k = 0; k < dims.size(); ++k)
    if (dims[k] != rank - static_cast<int64_t>(dims.size()) + static_cast<int64_t>(k)) return false;
  return true;
}

// A keepdim reduction over trailing dims whose rows have at most `max_row` elements: one block
// (one thread on the CPU) can walk each row several times while it is in cache.
bool is_row_reduction(const Graph& graph, ValueId id, int64_t max_row) {
  const Node& node = graph.nodes[id];
  if (!is_reduction(node.op) || !node.attrs.has("keepdim") || !node.attrs.get_bool("keepdim") ||
      !reduces_trailing_dims(graph, id))
    return false;
  const Shape& space = graph.nodes[node.inputs[0]].shape;
  const int64_t row = numel(node.shape) == 0 ? 0 : numel(space) / numel(node.shape);
  return row <= max_row;
}

class UnionFind {
 public:
  int make() {
    parent_.push_back(static_cast<int>(parent_.size()));
    return parent_.back();
  }
  int find(int x) {
    while (parent_[x] != x) x = parent_[x] = parent_[parent_[x]];
    return x;
  }
  void unite(int into, int from) { parent_[find(from)] = find(into); }

 private:
  std::vector<int> parent_;
};

struct Group {
  std::vector<ValueId> members;
  absl::flat_hash_set<ValueId> ext_inputs;
};

uint64_t kernel_key(const Graph& graph, const Step& step) {
  // Local numbering: inputs first, then members, so the key does not depend on value ids.
  absl::flat_hash_map<ValueId, int> local;
  for (ValueId v : step.inputs) local.emplace(v, static_cast<int>(local.size()));
  for (ValueId v : step.nodes) local.emplace(v, static_cast<int>(local.size()));
  StableHash h;
  h.add(step.kind).add(step.shape.size()).add(step.device);
  for (ValueId v : step.inputs) {
    const Node& n = graph.nodes[v];
    // Which dims broadcast is part of the kernel; the sizes are not.
    std::vector<bool> broadcast;
    size_t offset = step.shape.size() - std::min(step.shape.size(), n.shape.size());
    for (size_t d = 0; d < n.shape.size(); ++d)
      broadcast.push_back(n.shape[d] == 1 && offset + d < step.shape.size() &&
                          step.shape[offset + d] != 1);
    h.add(n.dtype).add(n.shape.size()).add(broadcast);
  }
  for (ValueId v : step.nodes) {
    const Node& n = graph.nodes[v];
    std::vector<int> operands;
    for (ValueId in : n.inputs) operands.push_back(local.at(in));
    h.add(n.op).add(n.dtype).add(n.shape.size()).add(operands).add(hash_attrs(n.attrs));
  }
  for (ValueId v : step.outputs) h.add(local.at(v));
  return h.value();
}

}  // namespace

// Rows a row step (a reduction with an epilogue, or several reductions) may have.
constexpr int64_t kMaxEpilogueRow = 32768;

Schedule run_fusion(Graph graph, const FusionOptions& options) {
  const size_t n = graph.nodes.size();
  std::vector<std::vector<ValueId>> users = users_of(graph);
  std::vector<bool> is_output(n, false);
  for (ValueId v : graph.outputs) is_output[v] = true;

  UnionFind groups_uf;
  std::vector<Group> groups;
  std::vector<int> group_of(n, -1);

  // Whether any of the groups in `stack`, or any group they read from, transitively, is in
  // `set`. Walked on the groups as they are now: a per-node record of ancestors goes stale
  // when a group it names later gains outside operands.
  auto depends_on = [&](std::vector<int> stack, const absl::flat_hash_set<int>& set) {
    absl::flat_hash_set<int> seen;
    while (!stack.empty()) {
      int g = groups_uf.find(stack.back());
      stack.pop_back();
      if (!seen.insert(g).second) continue;
      if (set.contains(g)) return true;
      for (ValueId in : groups[g].ext_inputs)
        if (group_of[in] >= 0) stack.push_back(group_of[in]);
    }
    return false;
  };

  // Group `from` becomes part of group `target`: its members, and its outside operands, which
  // depends_on follows (an operand that is now inside is harmless: its group is the target).
  auto merge = [&](int target, int from) {
    Group& into = groups[target];
    into.members.insert(into.members.end(), groups[from].members.begin(),
                        groups[from].members.end());
    into.ext_inputs.insert(groups[from].ext_inputs.begin(), groups[from].ext_inputs.end());
    groups_uf.unite(target, from);
    groups[from] = Group();
  };

  for (size_t i = 0; i < n; ++i) {
    const Node& node = graph.nodes[i];
    ValueId id = static_cast<ValueId>(i);
    if (node.op == Op::Param || is_scalar_const(node)) continue;

    absl::flat_hash_set<int> candidates;
    bool fusable = options.enabled && is_fusable_elementwise(node.op);
    if (fusable) {
      for (ValueId in : node.inputs) {
        const Node& operand = graph.nodes[in];
        if (group_of[in] >= 0 && is_fusable_elementwise(operand.op) &&
            operand.shape == node.shape && operand.device == node.device)
          candidates.insert(groups_uf.find(group_of[in]));
      }
    }
    auto can_join = [&](const absl::flat_hash_set<int>& merged) {
      size_t members = 1;
      absl::flat_hash_set<ValueId> inputs;
      std::vector<int> read_groups;  // the groups the merged group would read from
      for (int g : merged) {
        members += groups[g].members.size();
        inputs.insert(groups[g].ext_inputs.begin(), groups[g].ext_inputs.end());
        for (ValueId in : groups[g].ext_inputs)
          if (group_of[in] >= 0) read_groups.push_back(group_of[in]);
      }
      for (ValueId in : node.inputs) {
        if (group_of[in] >= 0 && merged.contains(groups_uf.find(group_of[in]))) continue;
        if (group_of[in] >= 0) read_groups.push_back(group_of[in]);
        if (!is_scalar_const(graph.nodes[in])) inputs.insert(in);
      }
      if (depends_on(std::move(read_groups), merged)) return false;
      // Operands that become members stop being inputs.
      for (auto it = inputs.begin(); it != inputs.end();) {
        auto next = std::next(it);
        if (group_of[*it] >= 0 && merged.contains(groups_uf.find(group_of[*it]))) inputs.erase(it);
        it = next;
      }
      return static_cast<int>(members) <= options.max_nodes &&
             static_cast<int>(inputs.size()) <= options.max_inputs;
    };

    int target = -1;
    if (!candidates.empty() && can_join(candidates)) {
      target = *candidates.begin();
      for (int g : candidates) {
        if (g == target) continue;
        merge(target, g);
      }
      target = groups_uf.find(target);
    } else {
      for (ValueId in : node.inputs) {
        if (group_of[in] < 0) continue;
        int g = groups_uf.find(group_of[in]);
        if (candidates.contains(g) && can_join({g})) {
          target = g;
          break;
        }
      }
    }
    if (target < 0) {
      target = groups_uf.make();
      groups.emplace_back();
    }
    Group& group = groups[target];
    group.members.push_back(id);
    group_of[i] = target;
    for (ValueId in : node.inputs) {
      if (group_of[in] >= 0 && groups_uf.find(group_of[in]) == target) continue;
      if (is_scalar_const(graph.nodes[in])) continue;
      group.ext_inputs.insert(in);
    }
    // Members that joined may have been external inputs of the group before.
    for (auto it = group.ext_inputs.begin(); it != group.ext_inputs.end();) {
      auto next = std::next(it);
      if (group_of[*it] >= 0 && groups_uf.find(group_of[*it]) == target) group.ext_inputs.erase(it);
      it = next;
    }
  }

  // A scalar constant needs a step of its own only when it is returned or a non-elementwise
  // node reads it.
  for (size_t i = 0; i < n; ++i) {
    if (!is_scalar_const(graph.nodes[i])) continue;
    bool stored = is_output[i];
    for (ValueId user : users[i]) stored |= !is_fusable_elementwise(graph.nodes[user].op);
    if (!stored) continue;
    group_of[i] = groups_uf.make();
    groups.emplace_back();
    groups.back().members.push_back(static_cast<ValueId>(i));
  }

  // A reduction absorbs the elementwise group that computes its operand (its prologue) when
  // nothing else reads that group's values and the reduced dims are the trailing ones: then
  // each output element reduces a contiguous range of the prologue's iteration space.
  if (options.enabled) {
    for (size_t i = 0; i < n; ++i) {
      const Node& node = graph.nodes[i];
      if (!is_reduction(node.op)) continue;
      const ValueId operand = node.inputs[0];
      const Node& producer = graph.nodes[operand];
      if (group_of[operand] < 0 || !is_fusable_elementwise(producer.op) ||
          producer.device != node.device)
        continue;
      const int prologue = groups_uf.find(group_of[operand]);
      bool private_values = reduces_trailing_dims(graph, static_cast<ValueId>(i));
      for (ValueId m : groups[prologue].members) {
        private_values &= !is_output[m];
        for (ValueId user : users[m])
          private_values &=
              user == static_cast<ValueId>(i) || groups_uf.find(group_of[user]) == prologue;
      }
      if (!private_values) continue;
      merge(groups_uf.find(group_of[i]), prologue);
    }
  }

  // A row reduction with keepdim absorbs the elementwise group that reads its result over the
  // operand's shape (softmax's normalisation): one kernel reduces each row, then walks the row
  // again to compute that group. Only for rows up to kMaxEpilogueRow elements, which one block
  // (one thread on the CPU) walks twice while they are still in cache. The group may read the
  // prologue's values (recomputed in the second pass) but nothing that depends on the step.
  if (options.enabled) {
    for (size_t i = 0; i < n; ++i) {
      const Node& node = graph.nodes[i];
      if (!is_row_reduction(graph, static_cast<ValueId>(i), kMaxEpilogueRow)) continue;
      const Shape& space = graph.nodes[node.inputs[0]].shape;
      const int step_group = groups_uf.find(group_of[i]);
      // The consumer group: elementwise users of the reduction over the operand's shape.
      int epilogue = -1;
      for (ValueId user : users[i]) {
        const Node& u = graph.nodes[user];
        if (is_fusable_elementwise(u.op) && u.shape == space && u.device == node.device &&
            group_of[user] >= 0)
          epilogue = groups_uf.find(group_of[user]);
      }
      if (epilogue < 0 || epilogue == step_group) continue;
      // Only a purely elementwise group: one that is itself a reduction's step stays one.
      bool elementwise = true;
      for (ValueId m : groups[epilogue].members)
        elementwise &= is_fusable_elementwise(graph.nodes[m].op);
      if (!elementwise) continue;
      absl::flat_hash_set<int> step_set = {step_group};
      bool ok = true;
      // Nothing outside may read the prologue, except the epilogue itself.
      for (ValueId m : groups[step_group].members) {
        if (m == static_cast<ValueId>(i)) continue;
        ok &= !is_output[m];
        for (ValueId user : users[m]) {
          int g = groups_uf.find(group_of[user]);
          ok &= g == step_group || g == epilogue;
        }
      }
      // The epilogue's other operands must not depend on the step (that would be a cycle).
      for (ValueId m : groups[epilogue].members) {
        for (ValueId in : graph.nodes[m].inputs) {
          if (group_of[in] >= 0 && (groups_uf.find(group_of[in]) == step_group ||
                                    groups_uf.find(group_of[in]) == epilogue))
            continue;
          if (group_of[in] >= 0) ok &= !depends_on({group_of[in]}, step_set);
        }
      }
      if (!ok) continue;
      merge(step_group, epilogue);
    }
  }

  // A row reduction whose operand a row step computes joins that step when both reduce the
  // same rows (softmax's sum joins the step of its max, whose epilogue computes exp(x - max)):
  // one kernel then makes a pass over each row per reduction, rereading the row from cache,
  // instead of storing the operand and reading it back.
  if (options.enabled) {
    auto row_space = [&](ValueId r) -> std::pair<Shape, Shape> {
      const Node& node = graph.nodes[r];
      return {graph.nodes[node.inputs[0]].shape, node.shape};
    };
    for (size_t i = 0; i < n; ++i) {
      const Node& node = graph.nodes[i];
      if (!is_row_reduction(graph, static_cast<ValueId>(i), kMaxEpilogueRow)) continue;
      const ValueId operand = node.inputs[0];
      if (group_of[operand] < 0 || !is_fusable_elementwise(graph.nodes[operand].op)) continue;
      const int step_group = groups_uf.find(group_of[i]);
      const int producer = groups_uf.find(group_of[operand]);
      if (producer == step_group) continue;
      // The producer must be a row step over the same rows.
      bool same_rows = false;
      for (ValueId m : groups[producer].members)
        same_rows |= is_row_reduction(graph, m, kMaxEpilogueRow) &&
                     row_space(m) == row_space(static_cast<ValueId>(i));
      if (!same_rows) continue;
      // Nothing else the step reads may depend on the producer (that would be a cycle).
      std::vector<int> others;
      for (ValueId in : groups[step_group].ext_inputs) {
        const int g = group_of[in] >= 0 ? groups_uf.find(group_of[in]) : -1;
        if (g >= 0 && g != producer && g != step_group) others.push_back(g);
      }
      if (depends_on(std::move(others), {producer})) continue;
      merge(producer, step_group);
    }
  }

  // Build the steps.
  std::vector<int> step_of_group(groups.size(), -1);
  Schedule schedule;
  std::vector<Step>& steps = schedule.steps;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups_uf.find(static_cast<int>(g)) != static_cast<int>(g) || groups[g].members.empty())
      continue;
    std::vector<ValueId> members = groups[g].members;
    std::sort(members.begin(), members.end());
    Step step;
    // A group with a reduction is a reduction step (with a prologue and an epilogue); any other
    // group is of its one kind.
    const Node* last = &graph.nodes[members.back()];
    for (ValueId m : members)
      if (is_reduction(graph.nodes[m].op)) last = &graph.nodes[m];
    step.kind = step_kind(last->op);
    // A reduction iterates over its operand's elements.
    step.shape =
        step.kind == StepKind::Reduction ? graph.nodes[last->inputs[0]].shape : last->shape;
    step.device = last->device;
    absl::flat_hash_set<ValueId> member_set(members.begin(), members.end());
    // Scalar constants used by the members are computed in place.
    std::vector<ValueId> with_consts;
    for (ValueId m : members) {
      for (ValueId in : graph.nodes[m].inputs) {
        const bool computes_in_place = step.kind == StepKind::Elementwise || members.size() > 1;
        if (computes_in_place && is_scalar_const(graph.nodes[in]) && !member_set.contains(in)) {
          member_set.insert(in);
          with_consts.push_back(in);
        }
      }
      with_consts.push_back(m);
    }
    std::sort(with_consts.begin(), with_consts.end());
    step.nodes = with_consts;
    absl::flat_hash_set<ValueId> inputs_seen;
    for (ValueId m : step.nodes) {
      for (ValueId in : graph.nodes[m].inputs) {
        if (!member_set.contains(in) && inputs_seen.insert(in).second) step.inputs.push_back(in);
      }
      // An inlined constant is recomputed wherever it is used, never stored.
      if (is_scalar_const(graph.nodes[m]) && group_of[m] != static_cast<int>(g)) continue;
      bool needed = is_output[m];
      for (ValueId user : users[m]) needed |= !member_set.contains(user);
      if (needed) step.outputs.push_back(m);
    }
    step_of_group[g] = static_cast<int>(steps.size());
    steps.push_back(std::move(step));
  }

  // Order the steps so that producers come first (Kahn's algorithm, smallest first member
  // first so that the order follows the user's program).
  std::vector<int> producer_step(n, -1);
  for (size_t s = 0; s < steps.size(); ++s)
    for (ValueId v : steps[s].outputs) producer_step[v] = static_cast<int>(s);
  std::vector<std::vector<int>> consumers(steps.size());
  std::vector<int> indegree(steps.size(), 0);
  for (size_t s = 0; s < steps.size(); ++s) {
    absl::flat_hash_set<int> producers;
    for (ValueId in : steps[s].inputs) {
      if (producer_step[in] >= 0) producers.insert(producer_step[in]);
    }
    for (int p : producers) {
      consumers[p].push_back(static_cast<int>(s));
      ++indegree[s];
    }
  }
  using Entry = std::pair<ValueId, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> ready;
  for (size_t s = 0; s < steps.size(); ++s)
    if (indegree[s] == 0) ready.push({steps[s].nodes.back(), static_cast<int>(s)});
  std::vector<Step> ordered;
  while (!ready.empty()) {
    int s = ready.top().second;
    ready.pop();
    for (int c : consumers[s])
      if (--indegree[c] == 0) ready.push({steps[c].nodes.back(), c});
    ordered.push_back(std::move(steps[s]));
  }
  // A cycle between steps would leave some out of the order, and their values uncomputed.
  if (ordered.size() != steps.size())
    throw VerifierError("fusion: the steps depend on each other in a cycle");
  steps = std::move(ordered);
  for (Step& step : steps) step.kernel_key = kernel_key(graph, step);
  schedule.graph = std::move(graph);
  return schedule;
}

}  // namespace lazyfuse
