// Common-subexpression elimination.
//
// Before: a verified graph.
// After: no two non-param nodes are structurally equal (same op, dtype, shape, device,
// attributes and operands); uses of a duplicate point at the first copy. Generators are pure
// (rand draws from its seed and offset), so they merge too. Duplicates are left for dce.
#include "absl/container/flat_hash_map.h"
#include "lazyfuse/ir/passes/passes.h"

namespace lazyfuse {

void run_cse(Graph& graph) {
  std::vector<uint64_t> hashes = structural_hashes(graph);
  absl::flat_hash_map<uint64_t, std::vector<ValueId>> seen;
  std::vector<ValueId> canonical(graph.nodes.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    Node& node = graph.nodes[i];
    for (ValueId& input : node.inputs) input = canonical[input];
    canonical[i] = static_cast<ValueId>(i);
    if (node.op == Op::Param) continue;
    // The hash only proposes; equality of the node decides (hashes can collide).
    std::vector<ValueId>& candidates = seen[hashes[i]];
    for (ValueId other : candidates) {
      const Node& o = graph.nodes[other];
      if (o.op == node.op && o.dtype == node.dtype && o.shape == node.shape &&
          o.device == node.device && o.inputs == node.inputs && o.attrs == node.attrs) {
        canonical[i] = other;
        break;
      }
    }
    if (canonical[i] == static_cast<ValueId>(i)) candidates.push_back(canonical[i]);
  }
  for (ValueId& output : graph.outputs) output = canonical[output];
}

}  // namespace lazyfuse
