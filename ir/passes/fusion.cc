// Fusion: the graph cut into steps.
//
// Note [The fusion algorithm]
// run_fusion cuts the graph into groups in phases (the methods of Grouping), then makes a step of
// each group and orders the steps.
//  0. mark_matmul_epilogues: a 2-D floating matmul read only by an add of a bias vector (one value
//     per output column), and that add's only reader when it is a relu, are the matmul's
//     epilogue: they join the matmul's step, which a library runs as one call where it can
//     (cuBLASLt's bias and ReLU epilogues) and as the product and one elementwise pass where it
//     cannot. Nothing else joins that step: a value computed from the relu (the mask its
//     gradient reads) starts a group of its own, and fuses with the backward kernel reading it.
//  1. group_elementwise: nodes are visited in topological order. A fusable node (an elementwise
//     op, cast, copy or generator) joins the groups of those operands that are fusable, of the
//     same shape and on the same device, merging them into one group, when that creates no
//     cycle: no operand outside the merged group, and no outside value that a candidate group
//     reads, may depend on a group being merged (followed group to group through each group's
//     outside operands, since a group that grows after another read it may gain dependences of
//     its own). When the merge would cycle the node tries the first candidate alone, and
//     otherwise starts a group of its own. Every member of a group has the group's shape; a
//     value of another shape that a group reads with broadcasting is read from storage. Scalar
//     constants are not values of their own: each group that uses one computes it in place, so
//     they never cost a load or a store. Matmul, views, transfers, reductions and index ops
//     (gather, scatter_add, cat) are a group each.
//  2. group_stored_scalars: a scalar constant that is returned or read by a non-elementwise node
//     gets a group of its own.
//  3. absorb_prologues: a reduction absorbs the group computing its operand when nothing else
//     reads that group and the reduced dims are trailing.
//  4. absorb_epilogues: a keepdim row reduction of rows up to `max_row` elements absorbs the
//     group reading its result over the operand's shape (softmax's normalisation).
//  5. join_row_steps: a row reduction whose operand such a row step computes joins it when both
//     reduce the same rows (softmax's sum joins its max's step).
//  6. grow_row_steps: a row step takes, until nothing more joins, every neighbouring group (one
//     it reads or one that reads it) that is a row step of the same rows (with or without
//     keepdim), elementwise over the rows' space, or row values: elementwise over one value
//     per row, computed from the step's values and constants alone (a norm's rsqrt(var + eps),
//     log-softmax's log of the sum). Each join must make no cycle and keep the caps. Row values
//     are computed once per row between the passes; a full-size member may read them, and
//     stored ones are stored once per row. So LayerNorm, RMSNorm, log-softmax and
//     cross-entropy with its gradient are one kernel each.
//     Phases 4-6 take column reductions alike (reductions over leading dims, of columns up to
//     `max_column` elements and at least 32 columns): softmax over dim 0 and a batch norm's
//     statistics with its normalization are one column step, a row kernel turned on its side.
//     Where values round after each op, a float64 sum or mean on a GPU joins no row step
//     (keeps_unfused_order): the GPU's row kernels add in another order than its reductions.
//  7. absorb_column_prologues: a reduction over leading dims (a bias gradient's sum over the
//     batch, a batch norm's column statistics) of at least 32 kept elements takes the
//     elementwise group computing its operand, whatever else reads that group's values (they
//     are stored by the same kernel): one kernel walks columns of the space, computes and
//     stores the work, and reduces it (the ReLU mask of a gradient and its bias's gradient).
//  8. join_attention: attention nodes over the same operands and attributes are one step (a
//     forward and the logsumexp its backward reads; the gradients of q, k and v), when that
//     makes no cycle: one kernel computes them all (Note [Attention] in ir/attention.cc).
//  9. build_steps, 10. order_steps: a step per group, producers first. Each step records its kind
//     and its members' roles (record_kind_and_roles), which the backends read.
//
// Softmax over rows of 1024, x[8, 1024]:
//
//   after 1-2:  [max x]  [sub x,max -> exp]  [sum e]  [div e,sum]    four groups
//   after 3:    (no change: exp's values are read by sum and by div, so not private to sum)
//   after 4:    [max x | sub -> exp]  [sum e | div]                   two row steps
//   after 5:    [max x | sub -> exp | sum | div]                      one kernel
//
// So softmax is two kernels after the epilogues are absorbed and one once the row steps join:
// per row, a pass for the max, a pass for the sum of exp(x - max) (recomputed from x), and a
// last pass storing the quotients. Rows longer than max_row stay four kernels.
//
// Caps (FusionOptions, ir/schedule.h), each cutting an elementwise group when exceeded:
// `max_nodes` members (compile time and registers grow with the body), `max_inputs` operands
// read from storage (kernel parameter space and memory streams per thread). Stored values are
// not capped: each costs a pointer and a store that storing it from another kernel would cost
// as well. A reduction's absorbed groups were each within the caps; together they may exceed
// them.
//
// Before: a placed graph (run_placement), usually after cse and dce.
// After: a Schedule whose steps, in an order where each step's inputs are params or outputs of
// earlier steps, cover every non-param node once (a scalar constant once per user step, or as
// a step of its own when it is returned or read by a non-elementwise step). The graph itself is
// unchanged.
#include <algorithm>
#include <numeric>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "lazyfuse/ir/attention.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"
#include "lazyfuse/ir/passes/passes.h"

namespace lazyfuse {
namespace {

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
    case OpKind::Index:
      return StepKind::Index;
    case OpKind::Collective:
      return StepKind::Collective;
    case OpKind::Attention:
      return StepKind::Attention;
    default:
      return StepKind::Elementwise;
  }
}

// Whether reduction `id` reduces the trailing dims of its operand: each result element then
// reduces a contiguous range of the operand's elements.
bool reduces_trailing_dims(const Graph& graph, ValueId id) {
  const Node& node = graph.nodes[id];
  const int64_t rank = static_cast<int64_t>(graph.nodes[node.inputs[0]].shape.size());
  return lazyfuse::reduces_trailing_dims(reduction_dims(node.attrs, rank), rank);
}

// The members of `step` that `value` depends on, `value` included; a reduction other than
// `value` is a boundary: its result is read, not recomputed.
std::vector<bool> members_needed_by(const Graph& graph, const Step& step, ValueId value) {
  std::vector<bool> needed(graph.nodes.size(), false);
  needed[value] = true;
  for (auto it = step.nodes.rbegin(); it != step.nodes.rend(); ++it) {
    const ValueId v = *it;
    if (!needed[v] || (v != value && is_reduction(graph.nodes[v].op))) continue;
    for (ValueId in : graph.nodes[v].inputs) needed[in] = true;
  }
  return needed;
}

// Whether a member of `step` reads `value`.
bool member_reads(const Graph& graph, const Step& step, ValueId value) {
  for (ValueId m : step.nodes)
    for (ValueId in : graph.nodes[m].inputs)
      if (in == value) return true;
  return false;
}

// A step with its members set, of a group holding reductions: the kind (Reduction, Row or
// Column) and each member's role. A member is a row value when it has one value per row (not
// the space's shape; a scalar constant is computed where it is used); a prologue member when a
// reduction reads it; else an epilogue member. Reductions over leading dims make a column step
// (one reduction with its prologue, or a column's row step: softmax over dim 0); otherwise
// several reductions, row values, an epilogue or stored work over the space make a row step.
void record_reduction_roles(const Graph& graph, Step& step) {
  std::vector<ValueId> reductions;
  for (ValueId v : step.nodes)
    if (is_reduction(graph.nodes[v].op)) reductions.push_back(v);
  const Node& first = graph.nodes[reductions.front()];
  const int64_t rank = static_cast<int64_t>(graph.nodes[first.inputs[0]].shape.size());
  const bool columns = reduces_leading_dims(reduction_dims(first.attrs, rank), rank);
  step.roles.assign(step.nodes.size(), Role::Prologue);
  if (columns && reductions.size() == 1 && !member_reads(graph, step, reductions.front())) {
    // One reduction and the work it walks the columns with (phase 7), whatever it stores.
    for (size_t i = 0; i < step.nodes.size(); ++i)
      if (step.nodes[i] == reductions.front()) step.roles[i] = Role::Reduction;
    step.kind = StepKind::Column;
    return;
  }
  std::vector<bool> in_prologue(graph.nodes.size(), false);
  for (ValueId r : reductions) {
    const std::vector<bool> needed = members_needed_by(graph, step, r);
    for (ValueId m : step.nodes) in_prologue[m] = in_prologue[m] || (needed[m] && m != r);
  }
  bool row = reductions.size() > 1;
  for (size_t i = 0; i < step.nodes.size(); ++i) {
    const Node& node = graph.nodes[step.nodes[i]];
    if (is_reduction(node.op))
      step.roles[i] = Role::Reduction;
    else if (!is_scalar_constant(node) && node.shape != step.shape)
      step.roles[i] = Role::RowValue;
    else if (!in_prologue[step.nodes[i]])
      step.roles[i] = Role::Epilogue;
    row |= step.roles[i] == Role::RowValue || step.roles[i] == Role::Epilogue;
  }
  for (size_t i = 0; i < step.nodes.size(); ++i) {
    const bool stored =
        std::find(step.outputs.begin(), step.outputs.end(), step.nodes[i]) != step.outputs.end();
    row |= stored && step.roles[i] == Role::Prologue;
  }
  step.kind = columns ? StepKind::Column : row ? StepKind::Row : StepKind::Reduction;
}

// A step with its members, inputs and outputs set: its kind, refined for reductions, and its
// members' roles.
void record_kind_and_roles(const Graph& graph, Step& step) {
  switch (step.kind) {
    case StepKind::Reduction:
      record_reduction_roles(graph, step);
      return;
    case StepKind::Matmul:
      // The product, then the epilogue that mark_matmul_epilogues gave it.
      step.roles.clear();
      for (ValueId v : step.nodes) {
        const Op op = graph.nodes[v].op;
        step.roles.push_back(op == Op::Matmul ? Role::Product
                             : op == Op::Add  ? Role::Bias
                                              : Role::Activation);
      }
      return;
    default:
      step.roles.assign(step.nodes.size(), Role::Work);
      return;
  }
}

// The fewest kept elements a column step takes: fewer than a warp's lanes would leave most of
// each column walk idle.
constexpr int64_t kMinColumns = 32;

// Whether `kept` columns of `length` elements each make a column step's space.
bool columns_fit(int64_t kept, int64_t length, const FusionOptions& options) {
  return kept >= kMinColumns && length <= options.max_column;
}

// The rows a reduction over trailing dims walks, or the columns one over leading dims walks (a
// softmax over dim 0), with or without keepdim, when each has at most `max_row` elements (a
// column `max_column`): its operand's shape, how many dims it reduces, and which end they are.
struct RowSpace {
  Shape space;
  size_t reduced = 0;
  bool columns = false;  // the leading dims are reduced: a column step's
  Device device;
  bool operator==(const RowSpace&) const = default;
  // One value per row (or column), as keepdim leaves it: the space with the reduced dims of
  // size 1.
  Shape row_shape() const {
    Shape shape = space;
    const auto reduced_dims = static_cast<std::ptrdiff_t>(reduced);
    if (columns)
      std::fill(shape.begin(), shape.begin() + reduced_dims, 1);
    else
      std::fill(shape.end() - reduced_dims, shape.end(), 1);
    return shape;
  }
};
// Whether a reduction stays out of row steps so that, where values round after each op, it adds
// as the unfused graph does: a float64 sum or mean on a GPU, whose row kernels give a row's
// elements to their lanes by the row's length while the plain reduction gives them to 256
// threads, orders that differ in the last bit (the GPU fuzz's fused-against-unfused check).
// The CPU's row kernels and plain reductions share kCpuReduceLanes' order; wider accumulators
// round the difference away; max and min have none.
bool keeps_unfused_order(const Graph& graph, ValueId id, const FusionOptions& options) {
  const Node& node = graph.nodes[id];
  const DType operand = graph.nodes[node.inputs[0]].dtype;
  return options.half_rounding == HalfRounding::EachOp && node.device.is_cuda() &&
         reduction_order_shows(node.op, operand, reduction_accumulator(node.op, operand));
}

std::optional<RowSpace> row_space_of(const Graph& graph, ValueId id, const FusionOptions& options) {
  const Node& node = graph.nodes[id];
  if (!is_reduction(node.op) || keeps_unfused_order(graph, id, options)) return std::nullopt;
  const Shape& space = graph.nodes[node.inputs[0]].shape;
  const int64_t rank = static_cast<int64_t>(space.size());
  const std::vector<int64_t> dims = reduction_dims(node.attrs, rank);
  const bool rows = lazyfuse::reduces_trailing_dims(dims, rank);
  if (!rows && !reduces_leading_dims(dims, rank)) return std::nullopt;
  const int64_t kept = numel(node.shape);
  if (kept == 0 || (rows ? numel(space) / kept > options.max_row
                         : !columns_fit(kept, numel(space) / kept, options)))
    return std::nullopt;
  // A reduction of every dim is one row: it runs best over many blocks, not in a row kernel.
  if (dims.empty() || dims.size() == space.size()) return std::nullopt;
  return RowSpace{space, dims.size(), !rows, node.device};
}

// A row reduction with keepdim (of every dim too: one row), or a column reduction with keepdim,
// whose result an elementwise group over its operand's shape can read.
bool is_row_reduction(const Graph& graph, ValueId id, const FusionOptions& options) {
  const Node& node = graph.nodes[id];
  if (!is_reduction(node.op) || !node.attrs.has("keepdim") || !node.attrs.get_bool("keepdim") ||
      keeps_unfused_order(graph, id, options))
    return false;
  const Shape& space = graph.nodes[node.inputs[0]].shape;
  const int64_t rank = static_cast<int64_t>(space.size());
  const std::vector<int64_t> dims = reduction_dims(node.attrs, rank);
  const int64_t length = numel(node.shape) == 0 ? 0 : numel(space) / numel(node.shape);
  if (lazyfuse::reduces_trailing_dims(dims, rank)) return length <= options.max_row;
  return reduces_leading_dims(dims, rank) && columns_fit(numel(node.shape), length, options);
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

// The state the phases of run_fusion share: the graph's nodes cut into groups (a union-find over
// group ids, each live group's members and outside operands), and what every phase reads about
// the graph. Each phase is a method; run_fusion calls them in order.
class Grouping {
 public:
  Grouping(const Graph& graph, const FusionOptions& options)
      : graph_(graph),
        options_(options),
        users_(users_of(graph)),
        is_output_(graph.nodes.size(), false),
        group_of_(graph.nodes.size(), -1),
        epilogue_of_(graph.nodes.size(), -1) {
    for (ValueId v : graph.outputs) is_output_[v] = true;
  }

  // Phase 0: the bias add and relu after a matmul, which its step takes (epilogue_of_).
  void mark_matmul_epilogues();
  // Phase 1: elementwise nodes, in topological order, join the groups of their fusable operands
  // of the same shape and device, within the caps and without making a cycle.
  void group_elementwise();
  // Phase 2: a scalar constant gets a group of its own only when it is stored.
  void group_stored_scalars();
  // Phase 3: a reduction absorbs the group computing its operand (its prologue).
  void absorb_prologues();
  // Phase 4: a keepdim row reduction absorbs the group reading its result over its operand's
  // shape (its epilogue).
  void absorb_epilogues();
  // Phase 5: a row reduction of the same rows as the row step computing its operand joins it.
  void join_row_steps();
  // Phase 6: a row step takes its neighbours that fit in its kernel.
  void grow_row_steps();
  // Phase 7: a reduction over leading dims takes the elementwise group computing its operand.
  void absorb_column_prologues();
  // Phase 8: attention nodes over the same operands join: a forward and its logsumexp, the
  // three gradients.
  void join_attention();
  // Phase 9: one step per group, in no particular order.
  std::vector<Step> build_steps() const;

 private:
  int find(int group) { return groups_uf_.find(group); }
  // The group of `value`'s node now, or -1 when it has none (params, inlined scalars).
  int group(ValueId value) { return group_of_[value] >= 0 ? find(group_of_[value]) : -1; }
  bool depends_on(std::vector<int> stack, const absl::flat_hash_set<int>& set);
  void merge(int target, int from);
  bool can_join(ValueId id, const absl::flat_hash_set<int>& merged);
  // Whether one group made of groups `a` and `b` would read a value that depends on itself.
  bool merge_makes_cycle(int a, int b);
  // Whether group `g` may join row step `step` over `rows`, by what its members are.
  bool fits_row_step(int step, int g, const RowSpace& rows);

  const Graph& graph_;
  const FusionOptions& options_;
  const std::vector<std::vector<ValueId>> users_;
  std::vector<bool> is_output_;
  UnionFind groups_uf_;
  std::vector<Group> groups_;
  std::vector<int> group_of_;  // by node: the group it joined (find() gives the group now)
  // By node: the matmul whose epilogue it is, or -1.
  std::vector<ValueId> epilogue_of_;
};

// Whether any of the groups in `stack`, or any group they read from, transitively, is in `set`.
// Walked on the groups as they are now: a per-node record of ancestors goes stale when a group
// it names later gains outside operands.
bool Grouping::depends_on(std::vector<int> stack, const absl::flat_hash_set<int>& set) {
  absl::flat_hash_set<int> seen;
  while (!stack.empty()) {
    int g = find(stack.back());
    stack.pop_back();
    if (!seen.insert(g).second) continue;
    if (set.contains(g)) return true;
    for (ValueId in : groups_[g].ext_inputs)
      if (group_of_[in] >= 0) stack.push_back(group_of_[in]);
  }
  return false;
}

// Group `from` becomes part of group `target`: its members, and its outside operands, which
// depends_on follows (an operand that is now inside is harmless: its group is the target).
void Grouping::merge(int target, int from) {
  Group& into = groups_[target];
  into.members.insert(into.members.end(), groups_[from].members.begin(),
                      groups_[from].members.end());
  into.ext_inputs.insert(groups_[from].ext_inputs.begin(), groups_[from].ext_inputs.end());
  groups_uf_.unite(target, from);
  groups_[from] = Group();
}

// Whether node `id` may join the union of the groups in `merged`: no cycle, and the caps hold.
bool Grouping::can_join(ValueId id, const absl::flat_hash_set<int>& merged) {
  const Node& node = graph_.nodes[id];
  size_t members = 1;
  absl::flat_hash_set<ValueId> inputs;
  std::vector<int> read_groups;  // the groups the merged group would read from
  for (int g : merged) {
    members += groups_[g].members.size();
    inputs.insert(groups_[g].ext_inputs.begin(), groups_[g].ext_inputs.end());
    for (ValueId in : groups_[g].ext_inputs)
      if (group_of_[in] >= 0) read_groups.push_back(group_of_[in]);
  }
  for (ValueId in : node.inputs) {
    if (group_of_[in] >= 0 && merged.contains(find(group_of_[in]))) continue;
    if (group_of_[in] >= 0) read_groups.push_back(group_of_[in]);
    if (!is_scalar_constant(graph_.nodes[in])) inputs.insert(in);
  }
  if (depends_on(std::move(read_groups), merged)) return false;
  // Operands that become members stop being inputs.
  for (auto it = inputs.begin(); it != inputs.end();) {
    auto next = std::next(it);
    if (group_of_[*it] >= 0 && merged.contains(find(group_of_[*it]))) inputs.erase(it);
    it = next;
  }
  return static_cast<int>(members) <= options_.max_nodes &&
         static_cast<int>(inputs.size()) <= options_.max_inputs;
}

void Grouping::mark_matmul_epilogues() {
  if (!options_.enabled) return;
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& matmul = graph_.nodes[i];
    const ValueId id = static_cast<ValueId>(i);
    if (matmul.op != Op::Matmul || matmul.shape.size() != 2 || !is_floating(matmul.dtype) ||
        is_output_[i] || users_[i].size() != 1)
      continue;
    const ValueId add_id = users_[i][0];
    const Node& add = graph_.nodes[add_id];
    if (add.op != Op::Add || add.shape != matmul.shape || add.dtype != matmul.dtype ||
        add.device != matmul.device || add.inputs[0] == add.inputs[1])
      continue;
    const ValueId bias_id = add.inputs[0] == id ? add.inputs[1] : add.inputs[0];
    const Node& bias = graph_.nodes[bias_id];
    const int64_t columns = matmul.shape[1];
    // A scalar constant is computed in place, never stored: a library's epilogue cannot read it.
    const bool is_bias_vector = bias.dtype == matmul.dtype && !is_scalar_constant(bias) &&
                                (bias.shape == Shape{columns} || bias.shape == Shape{1, columns});
    if (!is_bias_vector) continue;
    epilogue_of_[add_id] = id;
    if (is_output_[add_id] || users_[add_id].size() != 1) continue;
    const Node& relu = graph_.nodes[users_[add_id][0]];
    if (relu.op == Op::Relu && relu.dtype == add.dtype) epilogue_of_[users_[add_id][0]] = id;
  }
}

void Grouping::group_elementwise() {
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& node = graph_.nodes[i];
    const ValueId id = static_cast<ValueId>(i);
    if (node.op == Op::Param || is_scalar_constant(node)) continue;
    if (epilogue_of_[i] >= 0) {
      // The matmul's step takes it; what it reads besides the step is an outside operand.
      const int target = find(group_of_[epilogue_of_[i]]);
      groups_[target].members.push_back(id);
      group_of_[i] = target;
      for (ValueId in : node.inputs)
        if (group_of_[in] < 0 || find(group_of_[in]) != target)
          groups_[target].ext_inputs.insert(in);
      continue;
    }

    absl::flat_hash_set<int> candidates;
    if (options_.enabled && is_fusable_elementwise(node.op)) {
      for (ValueId in : node.inputs) {
        const Node& operand = graph_.nodes[in];
        if (group_of_[in] >= 0 && is_fusable_elementwise(operand.op) && epilogue_of_[in] < 0 &&
            operand.shape == node.shape && operand.device == node.device)
          candidates.insert(find(group_of_[in]));
      }
    }
    // All candidates at once; when that would cycle, the first that can be joined alone.
    int target = -1;
    if (!candidates.empty() && can_join(id, candidates)) {
      target = *candidates.begin();
      for (int g : candidates)
        if (g != target) merge(target, g);
      target = find(target);
    } else {
      for (ValueId in : node.inputs) {
        if (group_of_[in] < 0) continue;
        const int g = find(group_of_[in]);
        if (candidates.contains(g) && can_join(id, {g})) {
          target = g;
          break;
        }
      }
    }
    if (target < 0) {
      target = groups_uf_.make();
      groups_.emplace_back();
    }
    Group& joined = groups_[target];
    joined.members.push_back(id);
    group_of_[i] = target;
    for (ValueId in : node.inputs) {
      if (group_of_[in] >= 0 && find(group_of_[in]) == target) continue;
      if (is_scalar_constant(graph_.nodes[in])) continue;
      joined.ext_inputs.insert(in);
    }
    // Members that joined may have been outside operands of the group before.
    for (auto it = joined.ext_inputs.begin(); it != joined.ext_inputs.end();) {
      auto next = std::next(it);
      if (group_of_[*it] >= 0 && find(group_of_[*it]) == target) joined.ext_inputs.erase(it);
      it = next;
    }
  }
}

// A scalar constant needs a step of its own only when it is returned or a non-elementwise
// node reads it; otherwise every step that uses it computes it in place.
void Grouping::group_stored_scalars() {
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    if (!is_scalar_constant(graph_.nodes[i])) continue;
    bool stored = is_output_[i];
    for (ValueId user : users_[i]) stored |= !is_fusable_elementwise(graph_.nodes[user].op);
    if (!stored) continue;
    group_of_[i] = groups_uf_.make();
    groups_.emplace_back();
    groups_.back().members.push_back(static_cast<ValueId>(i));
  }
}

// A reduction absorbs the elementwise group that computes its operand (its prologue) when
// nothing else reads that group's values and the reduced dims are the trailing ones: then each
// output element reduces a contiguous range of the prologue's iteration space.
void Grouping::absorb_prologues() {
  if (!options_.enabled) return;
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& node = graph_.nodes[i];
    if (!is_reduction(node.op)) continue;
    const ValueId operand = node.inputs[0];
    const Node& producer = graph_.nodes[operand];
    if (group_of_[operand] < 0 || !is_fusable_elementwise(producer.op) ||
        epilogue_of_[operand] >= 0 || producer.device != node.device)
      continue;
    const int prologue = find(group_of_[operand]);
    bool private_values = reduces_trailing_dims(graph_, static_cast<ValueId>(i));
    for (ValueId m : groups_[prologue].members) {
      private_values &= !is_output_[m];
      for (ValueId user : users_[m])
        private_values &= user == static_cast<ValueId>(i) || find(group_of_[user]) == prologue;
    }
    if (!private_values) continue;
    merge(find(group_of_[i]), prologue);
  }
}

// A row reduction with keepdim absorbs the elementwise group that reads its result over the
// operand's shape (softmax's normalisation): one kernel reduces each row, then walks the row
// again to compute that group. Only for rows up to options.max_row elements, which one block
// (one thread on the CPU) walks twice while they are still in cache. The group may read the
// prologue's values (recomputed in the second pass) but nothing that depends on the step.
void Grouping::absorb_epilogues() {
  if (!options_.enabled) return;
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& node = graph_.nodes[i];
    if (!is_row_reduction(graph_, static_cast<ValueId>(i), options_)) continue;
    const Shape& space = graph_.nodes[node.inputs[0]].shape;
    const int step_group = find(group_of_[i]);
    // The consumer group: elementwise users of the reduction over the operand's shape.
    int epilogue = -1;
    for (ValueId user : users_[i]) {
      const Node& u = graph_.nodes[user];
      if (is_fusable_elementwise(u.op) && u.shape == space && u.device == node.device &&
          group_of_[user] >= 0)
        epilogue = find(group_of_[user]);
    }
    if (epilogue < 0 || epilogue == step_group) continue;
    // Only a purely elementwise group: one that is itself a reduction's step stays one.
    bool elementwise = true;
    for (ValueId m : groups_[epilogue].members)
      elementwise &= is_fusable_elementwise(graph_.nodes[m].op);
    if (!elementwise) continue;
    const absl::flat_hash_set<int> step_set = {step_group};
    bool ok = true;
    // Nothing outside may read the prologue, except the epilogue itself.
    for (ValueId m : groups_[step_group].members) {
      if (m == static_cast<ValueId>(i)) continue;
      ok &= !is_output_[m];
      for (ValueId user : users_[m]) {
        const int g = find(group_of_[user]);
        ok &= g == step_group || g == epilogue;
      }
    }
    // The epilogue's other operands must not depend on the step (that would be a cycle).
    for (ValueId m : groups_[epilogue].members) {
      for (ValueId in : graph_.nodes[m].inputs) {
        if (group_of_[in] >= 0 &&
            (find(group_of_[in]) == step_group || find(group_of_[in]) == epilogue))
          continue;
        if (group_of_[in] >= 0) ok &= !depends_on({group_of_[in]}, step_set);
      }
    }
    if (!ok) continue;
    merge(step_group, epilogue);
  }
}

// A row reduction whose operand a row step computes joins that step when both reduce the same
// rows (softmax's sum joins the step of its max, whose epilogue computes exp(x - max)): one
// kernel then makes a pass over each row per reduction, rereading the row from cache, instead
// of storing the operand and reading it back.
void Grouping::join_row_steps() {
  if (!options_.enabled) return;
  auto row_space = [&](ValueId r) -> std::pair<Shape, Shape> {
    const Node& node = graph_.nodes[r];
    return {graph_.nodes[node.inputs[0]].shape, node.shape};
  };
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& node = graph_.nodes[i];
    if (!is_row_reduction(graph_, static_cast<ValueId>(i), options_)) continue;
    const ValueId operand = node.inputs[0];
    if (group_of_[operand] < 0 || !is_fusable_elementwise(graph_.nodes[operand].op)) continue;
    const int step_group = find(group_of_[i]);
    const int producer = find(group_of_[operand]);
    if (producer == step_group) continue;
    // The producer must be a row step over the same rows.
    bool same_rows = false;
    for (ValueId m : groups_[producer].members)
      same_rows |= is_row_reduction(graph_, m, options_) &&
                   row_space(m) == row_space(static_cast<ValueId>(i));
    if (!same_rows) continue;
    // Nothing else the step reads may depend on the producer (that would be a cycle).
    std::vector<int> others;
    for (ValueId in : groups_[step_group].ext_inputs) {
      const int g = group_of_[in] >= 0 ? find(group_of_[in]) : -1;
      if (g >= 0 && g != producer && g != step_group) others.push_back(g);
    }
    if (depends_on(std::move(others), {producer})) continue;
    merge(producer, step_group);
  }
}

bool Grouping::merge_makes_cycle(int a, int b) {
  auto reads_outside = [&](int from, int other) {
    std::vector<int> groups;
    for (ValueId in : groups_[from].ext_inputs) {
      const int g = group(in);
      if (g >= 0 && g != a && g != b) groups.push_back(g);
    }
    return groups;
  };
  return depends_on(reads_outside(a, b), {b}) || depends_on(reads_outside(b, a), {a});
}

bool Grouping::fits_row_step(int step, int g, const RowSpace& rows) {
  const Shape row_shape = rows.row_shape();
  auto in_union = [&](ValueId v) {
    const int owner = group(v);
    return owner == step || owner == g;
  };
  // The shape a member of the union has: the space, one value per row, or (for a reduction
  // without keepdim) neither, which no elementwise member of the kernel may read.
  auto readable = [&](ValueId v, bool by_row_value) {
    const Node& node = graph_.nodes[v];
    if (!in_union(v) || is_scalar_constant(node)) return true;
    return node.shape == row_shape || (!by_row_value && node.shape == rows.space);
  };
  size_t members = groups_[step].members.size();
  for (ValueId m : groups_[g].members) {
    const Node& node = graph_.nodes[m];
    ++members;
    if (node.device != rows.device) return false;
    if (is_reduction(node.op)) {
      if (row_space_of(graph_, m, options_) != rows) return false;
      continue;
    }
    if (!is_fusable_elementwise(node.op) || epilogue_of_[m] >= 0) return false;
    const bool row_value = node.shape == row_shape && node.shape != rows.space;
    if (!row_value && node.shape != rows.space) return false;
    // A row value is computed between the passes, from what the row kernel has once per row.
    if (row_value && node.op != Op::Const && is_generator(node.op)) return false;
    for (ValueId in : node.inputs) {
      if (!readable(in, row_value)) return false;
      if (row_value && !in_union(in) && !is_scalar_constant(graph_.nodes[in])) return false;
    }
  }
  // The step's members may read g's values too.
  for (ValueId m : groups_[step].members) {
    const Node& node = graph_.nodes[m];
    if (is_reduction(node.op)) continue;
    const bool row_value = node.shape != rows.space;
    for (ValueId in : node.inputs)
      if (group(in) == g && !readable(in, row_value)) return false;
  }
  // The caps, on the union.
  absl::flat_hash_set<ValueId> inputs;
  for (int part : {step, g})
    for (ValueId in : groups_[part].ext_inputs)
      if (!in_union(in) && !is_scalar_constant(graph_.nodes[in])) inputs.insert(in);
  return static_cast<int>(members) <= options_.max_nodes &&
         static_cast<int>(inputs.size()) <= options_.max_inputs;
}

void Grouping::grow_row_steps() {
  if (!options_.enabled) return;
  for (bool grew = true; grew;) {
    grew = false;
    for (size_t i = 0; i < graph_.nodes.size(); ++i) {
      const std::optional<RowSpace> rows = row_space_of(graph_, static_cast<ValueId>(i), options_);
      if (!rows) continue;
      int step = group(static_cast<ValueId>(i));
      // Neighbours: the groups the step reads, and those that read it.
      std::vector<int> neighbours;
      for (ValueId in : groups_[step].ext_inputs)
        if (group(in) >= 0) neighbours.push_back(group(in));
      for (ValueId m : groups_[step].members)
        for (ValueId user : users_[m])
          if (group(user) >= 0) neighbours.push_back(group(user));
      for (int g : neighbours) {
        g = find(g);
        step = find(step);
        if (g == step || groups_[g].members.empty() || !fits_row_step(step, g, *rows) ||
            merge_makes_cycle(step, g))
          continue;
        merge(step, g);
        grew = true;
      }
    }
  }
}

void Grouping::absorb_column_prologues() {
  if (!options_.enabled) return;
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& node = graph_.nodes[i];
    if (!is_reduction(node.op)) continue;
    const ValueId operand = node.inputs[0];
    const Shape& space = graph_.nodes[operand].shape;
    const int64_t rank = static_cast<int64_t>(space.size());
    if (!reduces_leading_dims(reduction_dims(node.attrs, rank), rank) ||
        numel(node.shape) < kMinColumns)
      continue;
    const int step = group(static_cast<ValueId>(i));
    const int producer = group(operand);
    if (producer < 0 || producer == step || groups_[step].members.size() != 1) continue;
    bool elementwise = true;
    for (ValueId m : groups_[producer].members) {
      const Node& member = graph_.nodes[m];
      elementwise &= is_fusable_elementwise(member.op) && epilogue_of_[m] < 0 &&
                     member.shape == space && member.device == node.device;
    }
    if (!elementwise || merge_makes_cycle(step, producer)) continue;
    merge(step, producer);
  }
}

void Grouping::join_attention() {
  if (!options_.enabled) return;
  std::vector<ValueId> nodes;
  for (size_t i = 0; i < graph_.nodes.size(); ++i)
    if (is_attention(graph_.nodes[i].op)) nodes.push_back(static_cast<ValueId>(i));
  for (size_t i = 0; i < nodes.size(); ++i)
    for (size_t j = i + 1; j < nodes.size(); ++j) {
      const int a = group(nodes[i]), b = group(nodes[j]);
      if (a != b && same_attention(graph_, nodes[i], nodes[j]) && !merge_makes_cycle(a, b))
        merge(a, b);
    }
}

std::vector<Step> Grouping::build_steps() const {
  std::vector<Step> steps;
  // find() compresses paths; build_steps reads the final groups through a copy.
  UnionFind uf = groups_uf_;
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (uf.find(static_cast<int>(g)) != static_cast<int>(g) || groups_[g].members.empty()) continue;
    std::vector<ValueId> members = groups_[g].members;
    std::sort(members.begin(), members.end());
    Step step;
    // Only a step computing half values depends on the policy (and is keyed by it): every
    // other step's kernel is the same under both.
    bool computes_half = false;
    for (ValueId m : members) computes_half |= is_half(graph_.nodes[m].dtype);
    step.round_each_op = options_.half_rounding == HalfRounding::EachOp || !computes_half;
    // A group with a reduction is a reduction step (with a prologue and an epilogue); any other
    // group is of its one kind.
    const Node* last = &graph_.nodes[members.back()];
    for (ValueId m : members)
      if (is_reduction(graph_.nodes[m].op) || graph_.nodes[m].op == Op::Matmul)
        last = &graph_.nodes[m];
    step.kind = step_kind(last->op);
    // A reduction iterates over its operand's elements.
    step.shape =
        step.kind == StepKind::Reduction ? graph_.nodes[last->inputs[0]].shape : last->shape;
    step.device = last->device;
    absl::flat_hash_set<ValueId> member_set(members.begin(), members.end());
    // Scalar constants used by the members are computed in place.
    std::vector<ValueId> with_consts;
    for (ValueId m : members) {
      for (ValueId in : graph_.nodes[m].inputs) {
        const bool computes_in_place = step.kind == StepKind::Elementwise || members.size() > 1;
        if (computes_in_place && is_scalar_constant(graph_.nodes[in]) && !member_set.contains(in)) {
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
      for (ValueId in : graph_.nodes[m].inputs) {
        if (!member_set.contains(in) && inputs_seen.insert(in).second) step.inputs.push_back(in);
      }
      // An inlined constant is recomputed wherever it is used, never stored.
      if (is_scalar_constant(graph_.nodes[m]) && group_of_[m] != static_cast<int>(g)) continue;
      bool needed = is_output_[m];
      for (ValueId user : users_[m]) needed |= !member_set.contains(user);
      if (needed) step.outputs.push_back(m);
    }
    record_kind_and_roles(graph_, step);
    steps.push_back(std::move(step));
  }
  return steps;
}

}  // namespace

Schedule run_fusion(Graph graph, const FusionOptions& options) {
  Grouping grouping(graph, options);
  grouping.mark_matmul_epilogues();
  grouping.group_elementwise();
  grouping.group_stored_scalars();
  grouping.absorb_prologues();
  grouping.absorb_epilogues();
  grouping.join_row_steps();
  grouping.grow_row_steps();
  grouping.absorb_column_prologues();
  grouping.join_attention();
  Schedule schedule;
  // Phase 10: producers first.
  schedule.steps = order_steps(graph, grouping.build_steps());
  for (Step& step : schedule.steps) step.kernel_key = step_kernel_key(graph, step);
  schedule.graph = std::move(graph);
  return schedule;
}

}  // namespace lazyfuse
