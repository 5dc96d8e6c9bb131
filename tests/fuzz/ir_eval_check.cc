// The evaluation fuzzer's property (ir_eval_check.h).
#include "tests/fuzz/ir_eval_check.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ir/errors.h"
#include "ir/graph.h"
#include "ir/verifier.h"
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
    if (std::find(node.shape.begin(), node.shape.end(), 0) != node.shape.end()) continue;
    long long elements = 1;
    for (int64_t size : node.shape) {
      elements *= size;  // sizes are positive; stops before the product could overflow
      if (elements > kEvalMaxElements) return "";
    }
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
