// lazyfuse run: evaluate a graph on seeded random inputs and print its outputs; with --check,
// --check-unfused or --check-cpu, compare them with a reference (tools/replay.h): what
// `lazyfuse fuzz` checks, so that its reproducers replay here.
#include <iostream>

#include "lazyfuse/ir/verifier.h"
#include "lazyfuse/runtime/devices.h"
#include "tools/commands.h"
#include "tools/replay.h"

namespace lazyfuse::tools {

int run(const std::string& path, const std::string& device_name, uint64_t seed,
        std::optional<Reference> reference) {
  Graph graph = load_graph(path);
  if (!device_name.empty()) {
    Device device = resolve_device(Device(device_name));
    for (Node& node : graph.nodes) node.device = device;
  }
  for (Node& node : graph.nodes) node.device = resolve_device(node.device);
  // Before drawing inputs: a param's shape may be anything the parser accepts.
  verify(graph);
  if (reference == Reference::Unfused) warn_about_test_fault();
  if (!reference) {
    std::vector<Tensor> outputs = evaluate_graph(graph, random_inputs(graph, seed));
    for (size_t k = 0; k < outputs.size(); ++k)
      std::cout << "%" << graph.outputs[k] << " = " << outputs[k] << "\n";
    return 0;
  }
  CheckResult result = check_graph(graph, seed, *reference);
  for (size_t k = 0; k < result.outputs.size(); ++k)
    std::cout << "%" << graph.outputs[k] << " = " << result.outputs[k] << "\n";
  for (const OutputCheck& output : result.checks) std::cout << output.line() << "\n";
  return result.failed() ? 1 : 0;
}

}  // namespace lazyfuse::tools
