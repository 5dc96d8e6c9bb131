// The pass pipeline: the graph passes of kGraphPasses in order, then fusion and horizontal
// fusion, each named, so that dumps and the CLI can say which pass's output they show.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/ir/verifier.h"

namespace lazyfuse {
namespace {

#ifdef LAZYFUSE_VERIFY_PASSES
constexpr bool kVerifyBetweenPasses = true;
#else
constexpr bool kVerifyBetweenPasses = false;
#endif

}  // namespace

std::vector<std::string_view> pass_name_list() {
  std::vector<std::string_view> names;
  for (const GraphPass& pass : kGraphPasses) names.push_back(pass.name);
  names.push_back(kFusionPass);
  names.push_back(kHorizontalFusionPass);
  return names;
}

std::string pass_names(std::string_view separator) {
  std::string out;
  for (std::string_view name : pass_name_list()) {
    if (!out.empty()) out += separator;
    out += name;
  }
  return out;
}

bool runs_fusion(const PipelineOptions& options) {
  if (!options.only) return true;
  for (const std::string& name : *options.only)
    if (name == kFusionPass || name == kHorizontalFusionPass) return true;
  return false;
}

Schedule run_pipeline(Graph graph, const PipelineOptions& options) {
  if (options.only) {
    const std::vector<std::string_view> names = pass_name_list();
    for (const std::string& name : *options.only) {
      if (std::find(names.begin(), names.end(), name) == names.end())
        throw Error(absl::StrCat("unknown pass '", name, "' (passes: ", pass_names(", "), ")"));
    }
  }
  // An empty list runs no pass at all: the graph is verified and comes back as it was.
  auto enabled = [&](std::string_view pass) {
    return !options.only ||
           std::find(options.only->begin(), options.only->end(), pass) != options.only->end();
  };

  if (options.before_all) options.before_all(print_graph(graph));
  verify(graph);
  bool placed = false;
  for (const GraphPass& pass : kGraphPasses) {
    if (!enabled(pass.name)) continue;
    pass.run(graph);
    placed = placed || pass.places;
    if (kVerifyBetweenPasses) verify(graph, {.placed = placed});
    if (options.after_pass) options.after_pass(pass.name, print_graph(graph));
  }
  FusionOptions fusion = options.fusion;
  if (!runs_fusion(options)) fusion.enabled = false;
  Schedule schedule = run_fusion(std::move(graph), fusion);
  if (enabled(kFusionPass) && options.after_pass)
    options.after_pass(kFusionPass, print_schedule(schedule));
  if (enabled(kHorizontalFusionPass)) {
    run_horizontal_fusion(schedule, fusion);
    if (options.after_pass) options.after_pass(kHorizontalFusionPass, print_schedule(schedule));
  }
  return schedule;
}

}  // namespace lazyfuse
