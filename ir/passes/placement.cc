// Placement.
//
// Before: a verified graph whose nodes carry the device the frontend chose (an op's device is
// its first tensor operand's) or the IR text gave.
// After: every scalar constant sits on the device of its users (a copy per device when users
// differ), and every node other than a transfer has all operands on its own device; otherwise
// DeviceMismatchError, raised before anything runs, naming the op, both devices, and where the
// op and each operand were written. The graph is otherwise unchanged.
#include <map>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/passes/passes.h"

namespace lazyfuse {
namespace {

std::string describe_operand(const Graph& graph, int position, ValueId id) {
  const Node& operand = graph.nodes[id];
  std::string origin = operand.op == Op::Param
                           ? "a tensor made"
                           : absl::StrCat("the result of ", op_name(operand.op), " written");
  return absl::StrCat("operand ", position, " (%", id, ": ", operand.type_str(), ") is ", origin,
                      " at ", operand.where.str());
}

}  // namespace

void run_placement(Graph& graph) {
  // Scalar constants first: a constant with users on several devices gets one copy per device.
  std::vector<std::vector<ValueId>> users = users_of(graph);
  std::vector<std::map<std::pair<int, int>, ValueId>> copies(graph.nodes.size());
  Graph placed;
  placed.name = graph.name;
  std::vector<ValueId> remap(graph.nodes.size(), -1);
  // Constants are emitted next to their first user so the SSA order holds.
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (is_scalar_constant(node) && !users[i].empty()) continue;
    Node copy = node;
    for (size_t k = 0; k < copy.inputs.size(); ++k) {
      ValueId input = node.inputs[k];
      if (is_scalar_constant(graph.nodes[input]) && remap[input] < 0) {
        Device device = node.op == Op::To ? graph.nodes[input].device : node.device;
        auto key = std::make_pair(static_cast<int>(device.type()), device.index());
        auto [it, inserted] = copies[input].try_emplace(key, -1);
        if (inserted) {
          Node constant = graph.nodes[input];
          constant.device = device;
          it->second = placed.add(std::move(constant));
        }
        copy.inputs[k] = it->second;
      } else {
        copy.inputs[k] = remap[input];
      }
    }
    remap[i] = placed.add(std::move(copy));
  }
  for (ValueId& output : graph.outputs) {
    if (remap[output] < 0) {
      remap[output] = placed.add(graph.nodes[output]);  // a returned constant no one else uses
    }
    placed.outputs.push_back(remap[output]);
  }

  for (size_t i = 0; i < placed.nodes.size(); ++i) {
    const Node& node = placed.nodes[i];
    if (node.op == Op::To) continue;
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      const Node& operand = placed.nodes[node.inputs[k]];
      if (operand.device == node.device) continue;
      // Name the first operand's device first, as PyTorch does.
      Device first = placed.nodes[node.inputs[0]].device;
      Device other = first == operand.device ? node.device : operand.device;
      std::string message = absl::StrCat(
          "Expected all tensors to be on the same device, but found at least two devices, ",
          first.str(), " and ", other.str(), "! In ", op_name(node.op), " at ", node.where.str(),
          " on ", node.device.str());
      for (size_t j = 0; j < node.inputs.size(); ++j)
        absl::StrAppend(&message, "; ",
                        describe_operand(placed, static_cast<int>(j), node.inputs[j]));
      absl::StrAppend(&message, ". Move the operands to one device with .to(device).");
      throw DeviceMismatchError(message);
    }
  }
  graph = std::move(placed);
}

}  // namespace lazyfuse
