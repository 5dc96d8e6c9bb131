// The evaluation fuzzer's property (ir_eval_check.h).
#include "tests/fuzz/ir_eval_check.h"

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/graph.h"
#include "tests/fuzz/ir_text_check.h"
#include "tools/replay.h"

namespace lazyfuse::fuzz {

std::string check_ir_evaluation(std::string_view text) {
  std::optional<Graph> parsed = parsed_and_verified(text);
  if (!parsed) return "";  // the IR text fuzzer's ground
  const Graph& graph = *parsed;
  if (graph.nodes.size() > kEvalMaxNodes) return "";
  for (const Node& node : graph.nodes) {
    if (!node.device.is_cpu()) return "";
    // The verifier has checked that the count (and the strides) fit in an int64.
    if (numel(node.shape) > kEvalMaxElements) return "";
  }
  tools::CheckResult result;
  try {
    result = tools::check_graph(graph, /*seed=*/1, tools::Reference::Unfused);
  } catch (const Error&) {
    return "";  // a typed rejection
  }
  if (!result.failed()) return "";
  std::string finding = "fused and unfused evaluation differ:";
  for (const tools::OutputCheck& check : result.checks)
    absl::StrAppend(&finding, "\n  ", check.line());
  return finding;
}

}  // namespace lazyfuse::fuzz
