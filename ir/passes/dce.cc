// Dead-code elimination.
//
// Before: a verified graph.
// After: every non-param node is an output or an operand, transitively, of one; params all stay
// and keep their positions, since the caller binds buffers to them by position. Nodes keep
// their relative order.
#include "lazyfuse/ir/passes/passes.h"

namespace lazyfuse {

void run_dce(Graph& graph) {
  std::vector<bool> live(graph.nodes.size(), false);
  for (ValueId output : graph.outputs) live[output] = true;
  for (size_t i = graph.nodes.size(); i-- > 0;) {
    if (graph.nodes[i].op == Op::Param) live[i] = true;
    if (!live[i]) continue;
    for (ValueId input : graph.nodes[i].inputs) live[input] = true;
  }
  std::vector<ValueId> remap(graph.nodes.size(), -1);
  std::vector<Node> kept;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (!live[i]) continue;
    Node node = std::move(graph.nodes[i]);
    for (ValueId& input : node.inputs) input = remap[input];
    remap[i] = static_cast<ValueId>(kept.size());
    kept.push_back(std::move(node));
  }
  graph.nodes = std::move(kept);
  for (ValueId& output : graph.outputs) output = remap[output];
}

}  // namespace lazyfuse
