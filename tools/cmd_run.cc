// lazyfuse run: evaluate a graph on seeded random inputs and print its outputs; with --check,
// compare them with the same graph evaluated in float64 on the CPU.
#include <cmath>
#include <iostream>

#include "absl/strings/str_format.h"
#include "frontend/tensor.h"
#include "ir/errors.h"
#include "ir/op.h"
#include "runtime/devices.h"
#include "runtime/lazy.h"
#include "tools/commands.h"

namespace lazyfuse::tools {
namespace {

// Inputs in every op's comfortable domain: floats in [0.5, 1.5) (log and sqrt stay finite),
// integers in [0, 10), bools half true.
Tensor random_input(const Node& param) {
  Tensor u = rand(param.shape, TensorOptions().dtype(kFloat64));
  if (param.dtype == DType::Bool) return (u > 0.5).to(param.device);
  if (is_integral(param.dtype)) return (u * 10).to(param.dtype).to(param.device);
  return (u + 0.5).to(param.dtype).to(param.device);
}

// Builds the pending values of `graph` over `inputs` and evaluates its outputs.
std::vector<Tensor> evaluate_graph(const Graph& graph, const std::vector<Tensor>& inputs) {
  std::vector<LazyRef> values;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (node.op == Op::Param) {
      values.push_back(inputs[i].value());
      continue;
    }
    std::vector<LazyRef> operands;
    for (ValueId in : node.inputs) operands.push_back(values[in]);
    Node description = node;
    description.inputs.clear();
    values.push_back(
        make_pending(description, std::move(operands), contiguous_strides(node.shape)));
  }
  std::vector<Tensor> outputs;
  for (ValueId v : graph.outputs) outputs.emplace_back(values[v]);
  eval(outputs);
  return outputs;
}

// The graph with every floating value in float64 on the CPU: the reference.
Graph reference_of(Graph graph) {
  for (Node& node : graph.nodes) {
    node.device = Device::cpu();
    std::vector<DType> operands;
    for (ValueId in : node.inputs) operands.push_back(graph.nodes[in].dtype);
    DType given = is_floating(node.dtype) ? DType::Float64 : node.dtype;
    node.dtype = op_dtype_rule(node.op) == DTypeRule::Explicit || node.op == Op::Param
                     ? given
                     : infer_result_dtype(node.op, operands, given);
  }
  return graph;
}

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::Float64:
      return 1e-10;
    case DType::Float32:
      return 1e-4;
    case DType::Float16:
      return 1e-2;
    case DType::BFloat16:
      return 5e-2;
    default:
      return 0;
  }
}

}  // namespace

int run(const std::string& path, const std::string& device_name, uint64_t seed, bool check) {
  Graph graph = load_graph(path);
  if (!device_name.empty()) {
    Device device = resolve_device(Device(device_name));
    for (Node& node : graph.nodes) node.device = device;
  }
  for (Node& node : graph.nodes) node.device = resolve_device(node.device);
  manual_seed(seed);
  std::vector<Tensor> inputs;
  for (const Node& node : graph.nodes)
    inputs.push_back(node.op == Op::Param ? random_input(node) : Tensor());
  std::vector<Tensor> outputs = evaluate_graph(graph, inputs);
  for (size_t k = 0; k < outputs.size(); ++k)
    std::cout << "%" << graph.outputs[k] << " = " << outputs[k] << "\n";
  if (!check) return 0;

  Graph reference = reference_of(graph);
  std::vector<Tensor> reference_inputs;
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    reference_inputs.push_back(
        graph.nodes[i].op == Op::Param ? inputs[i].to(reference.nodes[i].dtype).cpu() : Tensor());
  std::vector<Tensor> expected = evaluate_graph(reference, reference_inputs);
  int mismatches = 0;
  for (size_t k = 0; k < outputs.size(); ++k) {
    std::vector<double> got = outputs[k].to_vector<double>(),
                        want = expected[k].to_vector<double>();
    const double tol = tolerance(outputs[k].dtype());
    double worst = 0;
    int64_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const bool same = (std::isnan(got[i]) && std::isnan(want[i])) || got[i] == want[i];
      const double error =
          same ? 0 : std::fabs(got[i] - want[i]) / std::max(1.0, std::fabs(want[i]));
      worst = std::max(worst, std::isnan(error) ? INFINITY : error);
      bad += !same && !(error <= tol);
    }
    std::cout << absl::StrFormat(
        "check %%%d: %s (%d of %d elements outside %g; largest relative error %.3g)\n",
        graph.outputs[k], bad ? "MISMATCH" : "ok", bad, got.size(), tol, worst);
    mismatches += bad > 0;
  }
  return mismatches ? 1 : 0;
}

}  // namespace lazyfuse::tools
