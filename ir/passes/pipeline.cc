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

bool runs_fusion(const PipelineOptions& options) {
  if (!options.only) return true;
  for (const std::string& name : *options.only)
    if (name == "fusion" || name == "horizontal-fusion") return true;
  return false;
}

Schedule run_pipeline(Graph graph, const PipelineOptions& options) {
  if (options.only) {
    for (const std::string& name : *options.only) {
      if (std::find(std::begin(kPassNames), std::end(kPassNames), name) == std::end(kPassNames))
        throw Error(
            absl::StrCat("unknown pass '", name,
                         "' (passes: placement, sink-views, cse, dce, fusion, horizontal-fusion)"));
    }
  }
  // An empty list runs no pass at all: the graph is verified and comes back as it was.
  auto enabled = [&](std::string_view name) {
    return !options.only ||
           std::find(options.only->begin(), options.only->end(), name) != options.only->end();
  };
  auto after = [&](std::string_view name, const Graph& g, bool placed) {
    if (kVerifyBetweenPasses) verify(g, {.placed = placed});
    if (options.after_pass) options.after_pass(name, print_graph(g));
  };

  if (options.before_all) options.before_all(print_graph(graph));
  verify(graph);
  bool placed = false;
  if (enabled("placement")) {
    run_placement(graph);
    placed = true;
    after("placement", graph, placed);
  }
  if (enabled("sink-views")) {
    run_sink_views(graph);
    after("sink-views", graph, placed);
  }
  if (enabled("cse")) {
    run_cse(graph);
    after("cse", graph, placed);
  }
  if (enabled("dce")) {
    run_dce(graph);
    after("dce", graph, placed);
  }
  FusionOptions fusion = options.fusion;
  if (!runs_fusion(options)) fusion.enabled = false;
  Schedule schedule = run_fusion(std::move(graph), fusion);
  if (enabled("fusion") && options.after_pass)
    options.after_pass("fusion", print_schedule(schedule));
  if (enabled("horizontal-fusion")) {
    run_horizontal_fusion(schedule, fusion);
    if (options.after_pass) options.after_pass("horizontal-fusion", print_schedule(schedule));
  }
  return schedule;
}

}  // namespace lazyfuse
