// Steps: kernel names and keys, counts, and an order. (print_schedule is in printer.cc, beside the
// parser's twin of every choice it makes; how a backend lowers a reduction step is
// codegen/kernel_plan.cc's.)
#include "lazyfuse/ir/schedule.h"

#include <algorithm>
#include <iterator>
#include <queue>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/stable_hash.h"

namespace lazyfuse {

const char* step_kind_name(StepKind kind) {
  switch (kind) {
    case StepKind::Elementwise:
      return "elementwise";
    case StepKind::Reduction:
      return "reduction";
    case StepKind::Row:
      return "row";
    case StepKind::Column:
      return "column";
    case StepKind::Matmul:
      return "matmul";
    case StepKind::View:
      return "view";
    case StepKind::Transfer:
      return "transfer";
    case StepKind::Index:
      return "index";
    case StepKind::Collective:
      return "collective";
    case StepKind::Group:
      return "group";
    case StepKind::Attention:
      return "attention";
  }
  return "?";
}

std::optional<StepKind> step_kind_named(std::string_view name) {
  static constexpr StepKind kKinds[] = {
      StepKind::Elementwise, StepKind::Reduction, StepKind::Row,      StepKind::Column,
      StepKind::Matmul,      StepKind::View,      StepKind::Transfer, StepKind::Index,
      StepKind::Collective,  StepKind::Group,     StepKind::Attention};
  // Attention is the last kind: every kind is listed.
  static_assert(std::size(kKinds) == static_cast<size_t>(StepKind::Attention) + 1);
  for (StepKind kind : kKinds)
    if (name == step_kind_name(kind)) return kind;
  return std::nullopt;
}

const char* role_name(Role role) {
  switch (role) {
    case Role::Work:
      return "work";
    case Role::Prologue:
      return "prologue";
    case Role::Reduction:
      return "reduction";
    case Role::RowValue:
      return "row value";
    case Role::Epilogue:
      return "epilogue";
    case Role::Product:
      return "product";
    case Role::Bias:
      return "bias";
    case Role::Activation:
      return "activation";
  }
  return "?";
}

std::vector<ValueId> Step::with_role(Role role) const {
  std::vector<ValueId> found;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (roles[i] == role) found.push_back(nodes[i]);
  return found;
}

ValueId Step::first_with_role(Role role) const {
  for (size_t i = 0; i < nodes.size(); ++i)
    if (roles[i] == role) return nodes[i];
  return -1;
}

Role Step::role_of(ValueId member) const {
  const auto at = std::find(nodes.begin(), nodes.end(), member);
  if (at == nodes.end())
    throw VerifierError(absl::StrCat("%", member, " is not a member of step ", kernel_name()));
  return roles[at - nodes.begin()];
}

std::string Step::kernel_name() const {
  return absl::StrFormat("%s_%08x", kind == StepKind::Group ? "g" : "k",
                         static_cast<uint32_t>(kernel_key ^ (kernel_key >> 32)));
}

uint64_t step_kernel_key(const Graph& graph, const Step& step) {
  if (step.kind == StepKind::Group) {
    StableHash h;
    h.add(step.kind);
    for (const Step& member : step.members) h.add(step_kernel_key(graph, member));
    return h.value();
  }
  // Local numbering: inputs first, then members, so the key does not depend on value ids.
  absl::flat_hash_map<ValueId, int> local;
  for (ValueId v : step.inputs) local.emplace(v, static_cast<int>(local.size()));
  for (ValueId v : step.nodes) local.emplace(v, static_cast<int>(local.size()));
  StableHash h;
  h.add(step.kind).add(step.shape.size()).add(step.device);
  if (!step.round_each_op) h.add(std::string_view("round at stores"));
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
  for (size_t i = 0; i < step.nodes.size(); ++i) {
    const Node& n = graph.nodes[step.nodes[i]];
    std::vector<int> operands;
    for (ValueId in : n.inputs) operands.push_back(local.at(in));
    h.add(n.op).add(n.dtype).add(n.shape.size()).add(operands).add(hash_attrs(n.attrs));
    // A row step's member with one value per row is computed (and stored) once per row: a
    // kernel of its own, even where a step of rows of one element has the same structure.
    if (step.roles[i] == Role::RowValue) h.add(std::string_view("row value"));
  }
  for (ValueId v : step.outputs) h.add(local.at(v));
  return h.value();
}

std::vector<Step> order_steps(const Graph& graph, std::vector<Step> steps) {
  std::vector<int> producer_step(graph.nodes.size(), -1);
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
  // Ready steps by their last node; a collective before any other, so that it starts as soon as
  // its operand is computed and the steps that do not read it run while it is in flight.
  using Entry = std::tuple<bool, ValueId, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> ready;
  auto entry = [&](int s) {
    return Entry{steps[s].kind != StepKind::Collective, steps[s].nodes.back(), s};
  };
  for (size_t s = 0; s < steps.size(); ++s)
    if (indegree[s] == 0) ready.push(entry(static_cast<int>(s)));
  std::vector<Step> ordered;
  while (!ready.empty()) {
    const int s = std::get<2>(ready.top());
    ready.pop();
    for (int c : consumers[s])
      if (--indegree[c] == 0) ready.push(entry(c));
    ordered.push_back(std::move(steps[s]));
  }
  // A cycle between steps would leave some out of the order, and their values uncomputed.
  if (ordered.size() != steps.size())
    throw VerifierError("fusion: the steps depend on each other in a cycle");
  return ordered;
}

int Schedule::num_kernels() const {
  int count = 0;
  for (const Step& step : steps)
    count += step.kind != StepKind::View && step.kind != StepKind::Transfer &&
             step.kind != StepKind::Collective;
  return count;
}

}  // namespace lazyfuse
