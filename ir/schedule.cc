// Printing a schedule: the graph with each fused kernel as a region.
#include "ir/schedule.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace lazyfuse {

std::string Step::kernel_name() const {
  return absl::StrFormat("k_%08x", static_cast<uint32_t>(kernel_key ^ (kernel_key >> 32)));
}

int Schedule::num_kernels() const {
  int count = 0;
  for (const Step& step : steps)
    count += step.kind != StepKind::View && step.kind != StepKind::Transfer;
  return count;
}

ReductionParts reduction_parts(const Graph& graph, const Step& step) {
  ReductionParts parts;
  for (ValueId v : step.nodes)
    if (is_reduction(graph.nodes[v].op)) parts.reduction = v;
  // The prologue is what the reduction depends on inside the step; members are in
  // topological order, so one backward sweep finds it.
  std::vector<ValueId> needed = {parts.reduction};
  std::vector<bool> in_prologue(graph.nodes.size(), false);
  for (auto it = step.nodes.rbegin(); it != step.nodes.rend(); ++it) {
    ValueId v = *it;
    bool needed_here = false;
    for (ValueId n : needed) needed_here |= n == v;
    if (!needed_here) continue;
    if (v != parts.reduction) in_prologue[v] = true;
    for (ValueId in : graph.nodes[v].inputs) needed.push_back(in);
  }
  for (ValueId v : step.nodes) {
    if (v == parts.reduction) continue;
    (in_prologue[v] ? parts.prologue : parts.epilogue).push_back(v);
  }
  return parts;
}

std::string print_schedule(const Schedule& schedule, const PrintOptions& options) {
  const Graph& graph = schedule.graph;
  std::string out = absl::StrCat("graph @", graph.name, "(");
  int num_params = graph.num_params();
  for (int i = 0; i < num_params; ++i)
    absl::StrAppend(&out, i ? ", " : "", "%", i, ": ", graph.nodes[i].type_str());
  absl::StrAppend(&out, ") {\n");
  auto names = [](const std::vector<ValueId>& ids) {
    return absl::StrJoin(ids, ", ", [](std::string* s, ValueId v) { absl::StrAppend(s, "%", v); });
  };
  for (const Step& step : schedule.steps) {
    if (step.kind != StepKind::Elementwise && step.nodes.size() == 1) {
      absl::StrAppend(&out, "  ", print_node(graph, step.nodes[0], options), "\n");
      continue;
    }
    std::vector<std::string> types;
    for (ValueId v : step.outputs) types.push_back(graph.nodes[v].type_str());
    absl::StrAppend(&out, "  ", names(step.outputs), " = kernel @", step.kernel_name(), "(",
                    names(step.inputs), ") : ", absl::StrJoin(types, ", "), " {\n");
    for (ValueId v : step.nodes) absl::StrAppend(&out, "    ", print_node(graph, v, options), "\n");
    absl::StrAppend(&out, "  }\n");
  }
  absl::StrAppend(&out, "  return", graph.outputs.empty() ? "" : " ", names(graph.outputs),
                  "\n}\n");
  return out;
}

}  // namespace lazyfuse
