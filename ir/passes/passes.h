// The passes over a Graph, one per file, and the pipeline that runs them in order.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lazyfuse/ir/graph.h"
#include "lazyfuse/ir/schedule.h"

namespace lazyfuse {

// placement.cc: scalar constants take their user's device; every other node's operands must be
// on its device (a transfer excepted), else DeviceMismatchError.
void run_placement(Graph& graph);
// sink_views.cc: views of elementwise results move onto their operands, so chains fuse.
void run_sink_views(Graph& graph);
// cse.cc: structurally equal nodes become one.
void run_cse(Graph& graph);
// dce.cc: nodes no output depends on are removed (params stay: callers bind them by position).
void run_dce(Graph& graph);
// fusion.cc: the graph cut into steps: fused elementwise kernels, reductions, library calls,
// views and transfers.
Schedule run_fusion(Graph graph, const FusionOptions& options);
// horizontal_fusion.cc: elementwise steps that do not depend on each other share a kernel
// (siblings over one space) or a launch (a Group step).
void run_horizontal_fusion(Schedule& schedule, const FusionOptions& options);

// A pass over the graph, before fusion cuts it into steps.
struct GraphPass {
  std::string_view name;
  void (*run)(Graph& graph);
  bool places = false;  // after it, every operand is on its node's device (verify's `placed`)
};

// The passes in pipeline order, by the names --passes, --print-after and LAZYFUSE_DUMP give
// them: the graph passes, then fusion and horizontal fusion, which make and reshape the
// schedule. The one list that the pipeline, the CLI and its help read: a new graph pass is a
// file of its own in ir/passes/ and a line here.
inline constexpr GraphPass kGraphPasses[] = {{"placement", run_placement, /*places=*/true},
                                             {"sink-views", run_sink_views},
                                             {"cse", run_cse},
                                             {"dce", run_dce}};
inline constexpr std::string_view kFusionPass = "fusion";
inline constexpr std::string_view kHorizontalFusionPass = "horizontal-fusion";
// Every pass's name, in pipeline order.
std::vector<std::string_view> pass_name_list();
// Every pass name, in order, between `separator`s: "placement,sink-views,...".
std::string pass_names(std::string_view separator);

struct PipelineOptions {
  FusionOptions fusion;
  // Passes to run, in pipeline order: absent runs all of them, an empty list none (the graph is
  // only verified, as `lazyfuse opt --passes=` asks, like mlir-opt without passes).
  std::optional<std::vector<std::string>> only;
  // Called after each pass with its name and the IR text as it stands.
  std::function<void(std::string_view pass, const std::string& ir)> after_pass;
  // Called before the first pass with the input IR (LAZYFUSE_DUMP=ir shows it).
  std::function<void(const std::string& ir)> before_all;
};

// Whether the pipeline cuts the graph into fused steps (a schedule worth print_schedule): when
// fusion runs, or horizontal-fusion, which works on fusion's steps and so runs fusion first.
bool runs_fusion(const PipelineOptions& options);

// Runs verify, placement, sink-views, cse, dce, fusion, horizontal-fusion (verifying between passes
// in debug builds). With `only` given and fusion not in it, every node becomes a step of its own.
Schedule run_pipeline(Graph graph, const PipelineOptions& options);

}  // namespace lazyfuse
