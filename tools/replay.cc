// Evaluating IR graphs on seeded random inputs and checking them (tools/replay.h): what
// `lazyfuse run` and `lazyfuse fuzz` share, so that the fuzzer's failures replay exactly.
#include "tools/replay.h"

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "absl/strings/str_format.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/op.h"
#include "lazyfuse/runtime/lazy.h"

namespace lazyfuse::tools {
namespace {

Tensor random_input(const Node& param) {
  Tensor u = rand(param.shape, TensorOptions().dtype(kFloat64));
  if (param.dtype == DType::Bool) return (u > 0.5).to(param.device);
  if (is_integral(param.dtype)) return (u * 10).to(param.dtype).to(param.device);
  return (u + 0.5).to(param.dtype).to(param.device);
}

// The graph with every floating value in float64 on the CPU: the float64 reference.
Graph float64_reference(Graph graph) {
  for (Node& node : graph.nodes) {
    node.device = Device::cpu();
    std::vector<DType> operands;
    for (ValueId in : node.inputs) operands.push_back(graph.nodes[in].dtype);
    DType given = is_floating(node.dtype) ? DType::Float64 : node.dtype;
    // A float32 that an op made of integers (tanh of an int32) stays float32 here, as the dtype
    // rules say, so a matmul may meet it beside a float64: emulated_reference casts its
    // operands to the matmul's float64.
    node.dtype = op_dtype_rule(node.op) == DTypeRule::Explicit || node.op == Op::Param ||
                         node.op == Op::Matmul
                     ? given
                     : infer_result_dtype(node.op, operands, given);
  }
  return graph;
}

// `graph` with `op` applied to the result of each node `i` and a constant of its type, where
// constant(i) gives one: the value every later node reads instead.
template <typename ConstantOf>
Graph with_constant_applied(const Graph& graph, Op op, ConstantOf constant) {
  Graph out;
  out.name = graph.name;
  std::vector<ValueId> id(graph.nodes.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    Node node = graph.nodes[i];
    for (ValueId& input : node.inputs) input = id[input];
    id[i] = out.add(node);
    const std::optional<AttrValue> value = constant(static_cast<ValueId>(i));
    if (!value) continue;
    Node operand;
    operand.op = Op::Const;
    operand.dtype = node.dtype;
    operand.device = node.device;
    operand.attrs.set("value", *value);
    Node applied;
    applied.op = op;
    applied.dtype = node.dtype;
    applied.shape = node.shape;
    applied.device = node.device;
    applied.inputs = {id[i], out.add(std::move(operand))};
    id[i] = out.add(std::move(applied));
  }
  for (ValueId output : graph.outputs) out.outputs.push_back(id[output]);
  return out;
}

// Where a float's rounding to nearest (ties to even) turns a value into infinity: its largest
// finite value and half a unit of its last place there (65504 + 16 in float16); infinity where
// nothing overflows.
double overflow_threshold(DType dtype) {
  switch (dtype) {
    case DType::Float16:
      return 65520.0;
    case DType::BFloat16:
      return std::ldexp(1.0, 128) - std::ldexp(1.0, 119);
    case DType::Float32:
      return std::ldexp(1.0, 128) - std::ldexp(1.0, 103);
    default:
      return INFINITY;
  }
}

// The largest finite value of a float, or infinity.
double max_finite(DType dtype) {
  switch (dtype) {
    case DType::Float16:
      return 65504.0;
    case DType::BFloat16:
      return 3.3895313892515355e38;
    case DType::Float32:
      return 3.4028234663852886e38;
    default:
      return INFINITY;
  }
}

// The unit roundoff of a float the graph computes in, or 0 for float64 and non-floats.
double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return 0x1p-24;
    case DType::Float16:
      return 0x1p-11;
    case DType::BFloat16:
      return 0x1p-8;
    default:
      return 0;
  }
}

// Note [Conditioning]: the float64 reference computes without the graph's roundings, and an
// op can amplify a rounding error far past its dtype's tolerance (sin of a large exp, an exp
// of an exp) with nothing wrong. So the reference runs again with every value that the graph
// computes in a narrower float scaled by (1 + u), u that float's unit roundoff; again by
// (1 - u); and again with the sign alternating from node to node: how far roundings of the size
// the graph makes move each result. The comparison allows a few times that, and does not judge
// a result they move by a percent or more. Three probes, because one can land by chance where
// the result barely moves: sin of a float32 of 1e35 is any value in [-1, 1], and a probe
// shifting its phase has about a one-in-a-hundred chance to move it by less than a percent.
// A matmul's probes add k u (|a| @ |b|), what its k roundings per sum can reach. A fourth
// probe rounds every such value to its own float, as the graph does: it catches what scaling
// cannot, such as x + 1e9 - 1e9 that float32 makes 0 and a later 0 / 0 makes NaN. A fifth
// scales each element by its own factor in [1 - u, 1 + u] (a fixed pseudo-random draw): the
// graph's roundings differ from element to element, and values that are equal in float64 (a
// symmetric product's (i, j) and (j, i), rows of equal inputs) are not equal after them, which
// the uniform probes keep equal: a softmax over such a tie, or the difference of two exps of it,
// depends on nothing but those roundings.
//
// Nor does float64 overflow where the graph's floats do (an exp of 100 in float32 is infinity,
// and sin of it NaN). So every reference also gives each such value the range of its float:
// past the largest finite value it becomes infinity, as in the graph. Where half values round
// only at stores, one inside a kernel has float32's range: the reference gives half values
// their own range only as results, where made by a cast, a constant or a generator (which
// round under either policy) and where a cast reads them (it converts from their dtype), and
// the fourth probe finds the results that an intermediate stored between kernels, and
// overflowing there, would move.
enum class Perturbation { None, Up, Down, Alternating, Rounded, Scattered };

// `draw` picks the Scattered probe's factors.
Graph emulated_reference(const Graph& graph, const Graph& reference, Perturbation perturbation,
                         int64_t draw = 0) {
  Graph out;
  out.name = reference.name;
  std::vector<bool> is_output(graph.nodes.size(), false);
  for (ValueId v : graph.outputs) is_output[v] = true;
  std::vector<ValueId> id(reference.nodes.size());      // each value as the ops reading it see it
  std::vector<ValueId> stored(reference.nodes.size());  // each result as stored
  // Each value in its own dtype's range, as a cast reads it: a cast converts from the operand's
  // dtype, so a half value kept in float32 inside a kernel reaches it rounded (an exp past
  // 65504 is infinity there, and an int32 cast of it saturates).
  std::vector<ValueId> in_own_range(reference.nodes.size());
  double sign = perturbation == Perturbation::Down ? -1 : 1;
  for (size_t i = 0; i < reference.nodes.size(); ++i) {
    Node node = reference.nodes[i];
    for (ValueId& input : node.inputs) {
      input = graph.nodes[i].op == Op::Cast ? in_own_range[input] : id[input];
      if (node.op == Op::Matmul && out.nodes[input].dtype != node.dtype) {
        Node cast = out.nodes[input];
        cast.op = Op::Cast;
        cast.dtype = node.dtype;
        cast.attrs = Attrs();
        cast.inputs = {input};
        input = out.add(std::move(cast));
      }
    }
    ValueId value = out.add(node);
    id[i] = stored[i] = in_own_range[i] = value;
    const double u = unit_roundoff(graph.nodes[i].dtype);
    if (u == 0 || node.op == Op::Param) continue;
    // A node of `op` over `inputs`, typed like `node` (or bool), of its shape.
    auto add = [&](Op op, std::vector<ValueId> inputs, DType dtype) {
      Node made;
      made.op = op;
      made.dtype = dtype;
      made.shape = node.shape;
      made.device = node.device;
      made.inputs = std::move(inputs);
      return out.add(std::move(made));
    };
    auto constant = [&](double v) {
      Node made;
      made.op = Op::Const;
      made.dtype = node.dtype;
      made.device = node.device;
      made.attrs.set("value", v);
      return out.add(std::move(made));
    };
    if (perturbation == Perturbation::Rounded) {
      value = add(Op::Cast, {add(Op::Cast, {value}, graph.nodes[i].dtype)}, node.dtype);
    } else if (perturbation != Perturbation::None) {
      // The relative change of each element: u, -u, or for Scattered one drawn in [-u, u].
      ValueId change = constant(sign * u);
      if (perturbation == Perturbation::Scattered) {
        Node factors;
        factors.op = Op::Rand;
        factors.dtype = node.dtype;
        factors.shape = node.shape;
        factors.device = node.device;
        factors.attrs.set("seed", 0x5ca77e7ed + draw);
        factors.attrs.set("offset", static_cast<int64_t>(i) << 32);
        change = add(Op::Add,
                     {add(Op::Mul, {out.add(std::move(factors)), constant(2 * u)}, node.dtype),
                      constant(-u)},
                     node.dtype);
      }
      value = add(Op::Mul,
                  {value, perturbation == Perturbation::Scattered
                              ? add(Op::Add, {change, constant(1)}, node.dtype)
                              : constant(1 + sign * u)},
                  node.dtype);
      if (node.op == Op::Matmul) {
        // A matmul rounds once per term of each sum, so its error reaches k u (|a| @ |b|), k
        // the length of the sums, however small the result that the terms cancel down to.
        auto absolute = [&](ValueId operand) {
          Node made = out.nodes[operand];
          made.op = Op::Abs;
          made.attrs = Attrs();
          made.inputs = {operand};
          return out.add(std::move(made));
        };
        const Shape& left = out.nodes[node.inputs[0]].shape;
        const double terms = left.empty() ? 1 : static_cast<double>(left.back());
        const ValueId magnitudes =
            add(Op::Matmul, {absolute(node.inputs[0]), absolute(node.inputs[1])}, node.dtype);
        value = add(
            Op::Add,
            {value, add(Op::Mul, {add(Op::Mul, {magnitudes, change}, node.dtype), constant(terms)},
                        node.dtype)},
            node.dtype);
      }
      if (perturbation == Perturbation::Alternating) sign = -sign;
    }
    // Rounding half values only at stores (Note [Half precision in fused kernels] in
    // ir/half_rounding.h), a value inside a kernel overflows where float32 does, for the ops of the
    // kernel that read it too, even when it is a result; one stored between kernels overflows
    // at its own range, which the Rounded perturbation meets (Note [Conditioning]). A result, as
    // stored, overflows at its own range.
    const Op op = graph.nodes[i].op;
    const bool rounds_anyway = op == Op::Cast || op == Op::Const || is_generator(op);
    const bool kept_in_float32 = half_rounding() == HalfRounding::AtStores &&
                                 is_half(graph.nodes[i].dtype) && !rounds_anyway;
    auto overflowing_past = [&](DType range) {
      const ValueId past_range =
          add(Op::Ge, {add(Op::Abs, {value}, node.dtype), constant(overflow_threshold(range))},
              DType::Bool);
      const ValueId infinite = add(Op::Mul, {value, constant(INFINITY)}, node.dtype);
      return add(Op::Where, {past_range, infinite, value}, node.dtype);
    };
    id[i] = overflowing_past(kept_in_float32 ? DType::Float32 : graph.nodes[i].dtype);
    in_own_range[i] = kept_in_float32 ? overflowing_past(graph.nodes[i].dtype) : id[i];
    if (is_output[i]) stored[i] = in_own_range[i];
  }
  for (ValueId output : reference.outputs) out.outputs.push_back(stored[output]);
  return out;
}

// The same graph on the CPU: the unfused reference.
Graph cpu_copy(Graph graph) {
  for (Node& node : graph.nodes) node.device = Device::cpu();
  return graph;
}

// `graph` with 1 added to the result of every `op` node that is not bool: the test fault.
Graph with_fault(const Graph& graph, Op op) {
  return with_constant_applied(graph, Op::Add, [&](ValueId i) -> std::optional<AttrValue> {
    const Node& node = graph.nodes[i];
    if (node.op != op || node.dtype == DType::Bool) return std::nullopt;
    if (is_integral(node.dtype)) return int64_t{1};
    return 1.0;
  });
}

// Per-dtype tolerances: against float64, and a GPU against the CPU (the order of float
// operations and the transcendental functions differ, so results agree only within the
// dtype's precision; in float64 a little less closely than the reference).
double tolerance(DType dtype, bool gpu) {
  switch (dtype) {
    case DType::Float64:
      return gpu ? 1e-9 : 1e-10;
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
double float64_tolerance(DType dtype) { return tolerance(dtype, false); }
double gpu_tolerance(DType dtype) { return tolerance(dtype, true); }

}  // namespace

std::vector<Tensor> random_inputs(const Graph& graph, uint64_t seed) {
  manual_seed(seed);
  std::vector<Tensor> inputs;
  std::vector<Tensor> params;
  for (const Node& node : graph.nodes) {
    inputs.push_back(node.op == Op::Param ? random_input(node) : Tensor());
    if (node.op == Op::Param) params.push_back(inputs.back());
  }
  eval(params);
  return inputs;
}

std::vector<Tensor> evaluate_graph(const Graph& graph, const std::vector<Tensor>& inputs,
                                   const EvalOptions& options) {
  std::vector<LazyRef> values;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (node.op == Op::Param) {
      values.push_back(inputs[i].value());
      continue;
    }
    LazyInputs operands;
    for (ValueId in : node.inputs) operands.push_back(values[in]);
    Node description = node;
    description.inputs.clear();
    // The executor derives every view from the graph; these strides only serve views that
    // the frontend would build on top of the result, and there are none.
    values.push_back(
        make_pending(description, std::move(operands), contiguous_strides(node.shape)));
  }
  std::vector<Tensor> outputs;
  for (ValueId v : graph.outputs) outputs.emplace_back(values[v]);
  eval(outputs, options);
  return outputs;
}

std::string OutputCheck::line() const {
  return absl::StrFormat(
      "check %%%d: %s (%d of %d elements outside %g; largest relative error %.3g)", value,
      bad ? "MISMATCH" : "ok", bad, total, tolerance, worst);
}

bool CheckResult::failed() const {
  for (const OutputCheck& check : checks)
    if (check.bad > 0) return true;
  return false;
}

std::string test_fault() {
  const char* fault = std::getenv("LAZYFUSE_TEST_FAULT");
  if (fault == nullptr || *fault == '\0') return "";
  if (!op_from_name(fault))
    throw Error(absl::StrFormat("LAZYFUSE_TEST_FAULT=%s names no op", fault));
  return fault;
}

void warn_about_test_fault() {
  std::string fault = test_fault();
  if (!fault.empty())
    std::cerr << "warning: LAZYFUSE_TEST_FAULT=" << fault << ": every " << fault
              << " result is off by one on purpose, to test the fuzzer\n";
}

// The graph's parameters as `target` takes them: the same values, in its dtypes, on the CPU.
std::vector<Tensor> cpu_inputs_for(const Graph& target, const Graph& graph,
                                   const std::vector<Tensor>& inputs) {
  std::vector<Tensor> converted;
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    converted.push_back(graph.nodes[i].op == Op::Param ? inputs[i].to(target.nodes[i].dtype).cpu()
                                                       : Tensor());
  std::vector<Tensor> params;
  for (const Tensor& input : converted)
    if (input.defined()) params.push_back(input);
  eval(params);
  return converted;
}

// Note [Conditioning]: how far roundings of the graph's own size move each float64 result
// (`results`, the unperturbed reference): relative to max(1, |result|), per element.
std::vector<std::vector<double>> sensitivity_of(const Graph& graph, const Graph& float64_graph,
                                                const std::vector<Tensor>& float64_inputs,
                                                const std::vector<Tensor>& results) {
  std::vector<std::vector<double>> sensitivity(results.size());
  // The Scattered probe three times, with three draws: one draw can leave two tied elements
  // nearly tied by chance.
  const std::pair<Perturbation, int64_t> probes[] = {
      {Perturbation::Up, 0},       {Perturbation::Down, 0},      {Perturbation::Alternating, 0},
      {Perturbation::Rounded, 0},  {Perturbation::Scattered, 0}, {Perturbation::Scattered, 1},
      {Perturbation::Scattered, 2}};
  for (const auto& [perturbation, draw] : probes) {
    const std::vector<Tensor> moved = evaluate_graph(
        emulated_reference(graph, float64_graph, perturbation, draw), float64_inputs);
    for (size_t k = 0; k < results.size(); ++k) {
      const std::vector<double> a = results[k].to_vector<double>(),
                                b = moved[k].to_vector<double>();
      sensitivity[k].resize(a.size(), 0);
      for (size_t i = 0; i < a.size(); ++i) {
        // A NaN that a rounding makes or unmakes (0 / 0 where the graph's float32 rounding
        // left a difference) moves the result without bound.
        // Nor has a result that they move by a percent of its own size, however small it is (a
        // softmax's 0.002 that a tie in bfloat16 makes 0.2): its leading digit is rounding.
        const double difference = std::fabs(a[i] - b[i]);
        const double change = std::isnan(a[i]) != std::isnan(b[i]) ||
                                      (difference > 0 && difference >= 1e-2 * std::fabs(a[i]))
                                  ? INFINITY
                                  : difference / std::max(1.0, std::fabs(a[i]));
        if (!std::isnan(change)) sensitivity[k][i] = std::max(sensitivity[k][i], change);
      }
    }
  }
  return sensitivity;
}

CheckResult check_graph(const Graph& graph, uint64_t seed, Reference reference) {
  // Against itself unfused, or a GPU against the CPU unfused, half types round after every op:
  // then fused kernels give the bits of kernels that each store their value (Note [Half
  // precision in fused kernels] in ir/schedule.h). Against float64, the default rounding.
  std::optional<HalfRoundingGuard> each_op;
  if (reference != Reference::Float64) each_op.emplace(HalfRounding::EachOp);
  const std::vector<Tensor> inputs = random_inputs(graph, seed);
  const std::string fault = reference == Reference::Unfused ? test_fault() : "";
  CheckResult result;
  result.outputs =
      evaluate_graph(fault.empty() ? graph : with_fault(graph, *op_from_name(fault)), inputs);
  bool on_gpu = false;
  for (const Node& node : graph.nodes) on_gpu = on_gpu || node.device.is_cuda();

  // Compared bit for bit (fused against unfused on the same devices, or a CPU graph against
  // the CPU), or within tolerances that the float64 reference's conditioning widens: against
  // float64, or a GPU against the CPU, whose math libraries round differently (sin of a large
  // exp amplifies the last bit of the exp).
  const bool within_tolerance =
      reference == Reference::Float64 || (reference == Reference::Cpu && on_gpu);
  std::vector<Tensor> expected;
  std::vector<std::vector<double>> sensitivity(graph.outputs.size());
  if (within_tolerance) {
    const Graph float64_graph = float64_reference(graph);
    const std::vector<Tensor> float64_inputs = cpu_inputs_for(float64_graph, graph, inputs);
    const std::vector<Tensor> float64_results = evaluate_graph(
        emulated_reference(graph, float64_graph, Perturbation::None), float64_inputs);
    sensitivity = sensitivity_of(graph, float64_graph, float64_inputs, float64_results);
    if (reference == Reference::Float64) expected = float64_results;
  }
  if (reference == Reference::Unfused)
    expected = evaluate_graph(graph, inputs, EvalOptions{.fusion = false});
  if (reference == Reference::Cpu) {
    const Graph cpu_graph = cpu_copy(graph);
    expected = evaluate_graph(cpu_graph, cpu_inputs_for(cpu_graph, graph, inputs),
                              EvalOptions{.fusion = false});
  }

  for (size_t k = 0; k < result.outputs.size(); ++k) {
    std::vector<double> got = result.outputs[k].to_vector<double>(),
                        want = expected[k].to_vector<double>();
    const DType dtype = result.outputs[k].dtype();
    OutputCheck check;
    check.value = graph.outputs[k];
    check.total = static_cast<int64_t>(got.size());
    check.tolerance = !within_tolerance                 ? 0
                      : reference == Reference::Float64 ? float64_tolerance(dtype)
                                                        : gpu_tolerance(dtype);
    // Against float64, or a GPU against the CPU, a value keeps the precision of the least
    // precise float it was computed through (exp in float32, then cast to float64), and an
    // integer or bool computed from floats may land one unit away (a cast truncating across an
    // integer, a comparison flipping).
    bool from_floats = false;
    // A value past the range of a float it went through is that float's infinity.
    double largest_finite = INFINITY;
    if (within_tolerance) {
      auto tolerance_of = reference == Reference::Float64 ? float64_tolerance : gpu_tolerance;
      std::vector<bool> needed(graph.nodes.size(), false);
      needed[graph.outputs[k]] = true;
      for (size_t i = graph.nodes.size(); i-- > 0;) {
        if (!needed[i]) continue;
        const Node& node = graph.nodes[i];
        if (is_floating(node.dtype)) {
          from_floats = true;
          check.tolerance = std::max(check.tolerance, tolerance_of(node.dtype));
          largest_finite = std::min(largest_finite, max_finite(node.dtype));
        }
        // An integer product is computed in float64 on both devices (run_matmul), exact below
        // 2^53: past that it carries float64's rounding, in each device's order of additions
        // (the GPU fuzz found chained int64 products 2e-16 apart).
        if (node.op == Op::Matmul && is_integral(node.dtype)) {
          from_floats = true;
          check.tolerance = std::max(check.tolerance, tolerance_of(DType::Float64));
        }
        for (ValueId in : node.inputs) needed[in] = true;
      }
    }
    const bool within_one_unit = from_floats && !is_floating(dtype);
    for (size_t i = 0; i < got.size(); ++i) {
      const bool same = (std::isnan(got[i]) && std::isnan(want[i])) || got[i] == want[i];
      const double error =
          same ? 0 : std::fabs(got[i] - want[i]) / std::max(1.0, std::fabs(want[i]));
      // A result that roundings of the graph's size move by a percent or more carries no digits
      // to compare (sin of a float32 of 1e19): only the bit-for-bit comparisons judge it.
      const double moved = sensitivity[k].empty() ? 0 : sensitivity[k][i];
      if (moved >= 1e-2) continue;
      check.worst = std::max(check.worst, std::isnan(error) ? INFINITY : error);
      const double allowed = check.tolerance + 8 * moved;
      const bool overflowed = std::isinf(got[i]) && std::fabs(want[i]) > largest_finite &&
                              std::signbit(got[i]) == std::signbit(want[i]);
      const bool close =
          error <= allowed || overflowed || (within_one_unit && std::fabs(got[i] - want[i]) <= 1);
      check.bad += !same && !close;
    }
    result.checks.push_back(check);
  }
  return result;
}

}  // namespace lazyfuse::tools
