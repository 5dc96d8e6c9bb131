// The kernel plan shared by every backend: merging dims, classifying operand access, and a
// reduction step's roles and parts.
#include "lazyfuse/codegen/kernel_plan.h"

#include <algorithm>

#include "lazyfuse/ir/infer.h"

namespace lazyfuse {

IterationSpace merge_dims(const Shape& space, const OperandStrides& full) {
  IterationSpace merged;
  merged.numel = numel(space);
  const size_t operands = full.size();
  merged.strides.resize(operands);
  for (size_t d = 0; d < space.size(); ++d) {
    const int64_t size = space[d];
    if (size == 1) continue;
    // A dim continues the one before it when every operand steps from the last element of one
    // row of it to the first of the next by the same stride.
    bool merge = !merged.sizes.empty();
    for (size_t k = 0; merge && k < operands; ++k)
      merge = merged.strides[k].back() == full[k][d] * size;
    if (merge) {
      merged.sizes.back() *= size;
      for (size_t k = 0; k < operands; ++k) merged.strides[k].back() = full[k][d];
    } else {
      merged.sizes.push_back(size);
      for (size_t k = 0; k < operands; ++k) merged.strides[k].push_back(full[k][d]);
    }
  }
  if (merged.sizes.empty()) {
    merged.sizes.push_back(1);
    for (Strides& s : merged.strides) s.push_back(0);
  }
  return merged;
}

OperandAccess classify_access(const Shape& sizes, const Strides& strides, int64_t* period) {
  const Strides dense = contiguous_strides(sizes);
  const size_t leading_zeros =
      std::find_if(strides.begin(), strides.end(), [](int64_t x) { return x != 0; }) -
      strides.begin();
  if (leading_zeros == strides.size()) return OperandAccess::Broadcast;
  if (!std::equal(strides.begin() + leading_zeros, strides.end(), dense.begin() + leading_zeros))
    return OperandAccess::Strided;
  if (leading_zeros == 0) return OperandAccess::Contiguous;
  *period = dense[leading_zeros] * sizes[leading_zeros];
  return OperandAccess::Repeated;
}

ReductionParts reduction_parts(const Step& step) {
  ReductionParts parts;
  for (size_t i = 0; i < step.nodes.size(); ++i) {
    const ValueId v = step.nodes[i];
    switch (step.roles[i]) {
      case Role::Reduction:
        parts.reductions.push_back(v);
        break;
      case Role::RowValue:
        parts.row_values.push_back(v);
        break;
      case Role::Epilogue:
        parts.epilogue.push_back(v);
        break;
      default:
        parts.prologue.push_back(v);
        break;
    }
  }
  if (!parts.reductions.empty()) parts.reduction = parts.reductions.back();
  return parts;
}

bool is_column_row_step(const Step& step) {
  if (step.kind != StepKind::Column) return false;
  int reductions = 0;
  for (Role role : step.roles) {
    reductions += role == Role::Reduction;
    if (role == Role::RowValue || role == Role::Epilogue) return true;
  }
  return reductions > 1;
}

std::vector<Step> split_reduction_step(const Graph& graph, const Step& step) {
  const ReductionParts parts = reduction_parts(step);
  // A part over `nodes` that stores `outputs`; its inputs are whatever the nodes read that they
  // do not compute. A part is elementwise or one reduction (its last member) of what it
  // computes before it, over leading dims where the step's is.
  const StepKind reduction_kind =
      step.kind == StepKind::Column ? StepKind::Column : StepKind::Reduction;
  auto make = [&](StepKind kind, std::vector<ValueId> nodes, std::vector<ValueId> outputs) {
    Step sub = step;
    sub.kind = kind;
    sub.roles.assign(nodes.size(), kind == StepKind::Elementwise ? Role::Work : Role::Prologue);
    if (kind != StepKind::Elementwise) sub.roles.back() = Role::Reduction;
    sub.nodes = std::move(nodes);
    sub.outputs = std::move(outputs);
    sub.inputs.clear();
    std::vector<bool> member(graph.nodes.size(), false), read(graph.nodes.size(), false);
    for (ValueId m : sub.nodes) member[m] = true;
    for (ValueId m : sub.nodes) {
      for (ValueId in : graph.nodes[m].inputs) {
        if (member[in] || read[in]) continue;
        read[in] = true;
        sub.inputs.push_back(in);
      }
    }
    return sub;
  };
  // Values earlier parts computed (reductions, stored members): later parts read them.
  std::vector<bool> available(graph.nodes.size(), false);
  std::vector<bool> is_member(graph.nodes.size(), false), is_output(graph.nodes.size(), false);
  for (ValueId m : step.nodes) is_member[m] = true;
  for (ValueId v : step.outputs) is_output[v] = true;
  // The members `value` needs that no earlier part computed, `value` included, in order.
  auto needed_for = [&](ValueId value) {
    std::vector<bool> needed(graph.nodes.size(), false);
    needed[value] = true;
    std::vector<ValueId> members;
    for (auto it = step.nodes.rbegin(); it != step.nodes.rend(); ++it) {
      const ValueId v = *it;
      if (!needed[v] || (v != value && available[v])) continue;
      members.push_back(v);
      if (v != value && is_reduction(graph.nodes[v].op)) continue;
      for (ValueId in : graph.nodes[v].inputs) needed[in] = is_member[in];
    }
    std::reverse(members.begin(), members.end());
    return members;
  };
  std::vector<Step> steps;
  // The row values whose operands are all computed, as steps over their own shapes.
  auto compute_ready_row_values = [&] {
    std::vector<ValueId> ready;
    for (ValueId v : parts.row_values) {
      if (available[v]) continue;
      bool operands_ready = true;
      for (ValueId in : graph.nodes[v].inputs)
        operands_ready &= !is_member[in] || available[in] || is_scalar_constant(graph.nodes[in]);
      if (!operands_ready) continue;
      ready.push_back(v);
      available[v] = true;  // a later row value may read it: it is computed before that one
    }
    while (!ready.empty()) {
      const Shape shape = graph.nodes[ready[0]].shape;
      std::vector<ValueId> nodes, outputs, rest;
      for (ValueId v : ready) {
        if (graph.nodes[v].shape != shape) {
          rest.push_back(v);
          continue;
        }
        for (ValueId in : graph.nodes[v].inputs)
          if (is_member[in] && is_scalar_constant(graph.nodes[in])) nodes.push_back(in);
        nodes.push_back(v);
        outputs.push_back(v);
      }
      std::sort(nodes.begin(), nodes.end());
      nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
      Step sub = make(StepKind::Elementwise, std::move(nodes), std::move(outputs));
      sub.shape = shape;
      steps.push_back(std::move(sub));
      ready = std::move(rest);
    }
  };
  for (ValueId r : parts.reductions) {
    compute_ready_row_values();
    std::vector<ValueId> nodes = needed_for(r);
    std::vector<bool> in_part(graph.nodes.size(), false);
    for (ValueId m : nodes) in_part[m] = true;
    // What this part computes that a later part reads, or that the step stores, is stored now
    // rather than computed again (softmax's exponentials: the sum reads them, and so does the
    // normalisation after it).
    // A member a few cheap ops away from what is stored already (a LayerNorm's x - mean, or
    // (x + residual) - mean) is computed again where it is read rather than stored and read
    // back: on the CPU the store and the second read cost more than the ops.
    auto cheap_to_recompute = [&](auto&& self, ValueId m, int depth) -> bool {
      const Node& node = graph.nodes[m];
      static constexpr Op kCheap[] = {Op::Add, Op::Sub, Op::Mul, Op::Neg, Op::Abs, Op::Relu};
      if (depth == 0 || is_output[m] ||
          std::find(std::begin(kCheap), std::end(kCheap), node.op) == std::end(kCheap))
        return false;
      for (ValueId in : node.inputs)
        if (is_member[in] && !available[in] && !is_scalar_constant(graph.nodes[in]) &&
            !self(self, in, depth - 1))
          return false;
      return true;
    };
    std::vector<ValueId> carried;
    for (ValueId m : nodes) {
      const Node& node = graph.nodes[m];
      if (m == r || is_scalar_constant(node) ||
          cheap_to_recompute(cheap_to_recompute, m, /*depth=*/3))
        continue;
      bool read_later = is_output[m];
      for (ValueId u : step.nodes)
        if (!in_part[u])
          for (ValueId in : graph.nodes[u].inputs) read_later |= in == m;
      if (read_later) carried.push_back(m);
    }
    // Over leading dims the CPU reduces a stored operand (its fused reductions walk rows).
    const ValueId operand = graph.nodes[r].inputs[0];
    if (step.kind == StepKind::Column && nodes.size() > 1 &&
        std::find(carried.begin(), carried.end(), operand) == carried.end())
      carried.push_back(operand);
    if (carried.empty()) {
      steps.push_back(make(reduction_kind, std::move(nodes), {r}));
    } else {
      // The elementwise members as a step of their own that also stores the operand, then the
      // reduction of the stored operand.
      if (in_part[operand] && std::find(carried.begin(), carried.end(), operand) == carried.end())
        carried.push_back(operand);
      std::erase(nodes, r);
      steps.push_back(make(StepKind::Elementwise, std::move(nodes), carried));
      for (ValueId m : carried) available[m] = true;
      steps.push_back(make(reduction_kind, {r}, {r}));
    }
    available[r] = true;
  }
  compute_ready_row_values();
  // The last part: what the step stores and no earlier part did.
  std::vector<bool> needed(graph.nodes.size(), false);
  std::vector<ValueId> stored;
  for (ValueId v : step.outputs) {
    if (available[v]) continue;
    stored.push_back(v);
    for (ValueId m : needed_for(v)) needed[m] = !available[m];
  }
  std::vector<ValueId> rest;
  for (ValueId v : step.nodes)
    if (needed[v]) rest.push_back(v);
  if (!stored.empty()) steps.push_back(make(StepKind::Elementwise, std::move(rest), stored));
  return steps;
}

std::optional<MatmulEpilogue> matmul_epilogue(const Graph& graph, const Step& step) {
  if (step.kind != StepKind::Matmul) return std::nullopt;
  const ValueId add = step.first_with_role(Role::Bias);
  if (add < 0) return std::nullopt;
  MatmulEpilogue epilogue;
  epilogue.matmul = step.first_with_role(Role::Product);
  const std::vector<ValueId>& operands = graph.nodes[add].inputs;
  epilogue.bias = operands[0] == epilogue.matmul ? operands[1] : operands[0];
  epilogue.relu = step.first_with_role(Role::Activation) >= 0;
  Step& elementwise = epilogue.elementwise;
  elementwise.kind = StepKind::Elementwise;
  for (size_t i = 0; i < step.nodes.size(); ++i)
    if (step.roles[i] != Role::Product) elementwise.nodes.push_back(step.nodes[i]);
  elementwise.roles.assign(elementwise.nodes.size(), Role::Work);
  elementwise.inputs = {epilogue.matmul, epilogue.bias};
  elementwise.outputs = step.outputs;
  elementwise.shape = graph.nodes[epilogue.matmul].shape;
  elementwise.device = step.device;
  elementwise.round_each_op = step.round_each_op;
  elementwise.kernel_key = step_kernel_key(graph, elementwise);
  return epilogue;
}

}  // namespace lazyfuse
