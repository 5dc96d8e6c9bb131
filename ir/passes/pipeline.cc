// The pass pipeline: straight-line, one named step per pass, so that dumps and the CLI can say
// which pass's output they show.
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

std::string pass_names(std::string_view separator) {
  std::string out;
  for (std::string_view name : kPassNames) {
    if (!out.empty()) out += separator;
    out += name;
  }
  return out;
}

bool runs_fusion(const PipelineOptions& options) {
  if (!options.only) return true;
  for (const std::string& name : *options.only)
    if (name == pass_name(Pass::Fusion) || name == pass_name(Pass::HorizontalFusion)) return true;
  return false;
}

Schedule run_pipeline(Graph graph, const PipelineOptions& options) {
  if (options.only) {
    for (const std::string& name : *options.only) {
      if (std::find(std::begin(kPassNames), std::end(kPassNames), name) == std::end(kPassNames))
        throw Error(absl::StrCat("unknown pass '", name, "' (passes: ", pass_names(", "), ")"));
    }
  }
  // An empty list runs no pass at all: the graph is verified and comes back as it was.
  auto enabled = [&](Pass pass) {
    return !options.only || std::find(options.only->begin(), options.only->end(),
                                      pass_name(pass)) != options.only->end();
  };
  auto after = [&](Pass pass, const Graph& g, bool placed) {
    if (kVerifyBetweenPasses) verify(g, {.placed = placed});
    if (options.after_pass) options.after_pass(pass_name(pass), print_graph(g));
  };

  if (options.before_all) options.before_all(print_graph(graph));
  verify(graph);
  bool placed = false;
  if (enabled(Pass::Placement)) {
    run_placement(graph);
    placed = true;
    after(Pass::Placement, graph, placed);
  }
  if (enabled(Pass::SinkViews)) {
    run_sink_views(graph);
    after(Pass::SinkViews, graph, placed);
  }
  if (enabled(Pass::Cse)) {
    run_cse(graph);
    after(Pass::Cse, graph, placed);
  }
  if (enabled(Pass::Dce)) {
    run_dce(graph);
    after(Pass::Dce, graph, placed);
  }
  FusionOptions fusion = options.fusion;
  if (!runs_fusion(options)) fusion.enabled = false;
  Schedule schedule = run_fusion(std::move(graph), fusion);
  if (enabled(Pass::Fusion) && options.after_pass)
    options.after_pass(pass_name(Pass::Fusion), print_schedule(schedule));
  if (enabled(Pass::HorizontalFusion)) {
    run_horizontal_fusion(schedule, fusion);
    if (options.after_pass)
      options.after_pass(pass_name(Pass::HorizontalFusion), print_schedule(schedule));
  }
  return schedule;
}

}  // namespace lazyfuse
