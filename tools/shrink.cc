// Test-case reduction for IR graphs (tools/shrink.h). Each candidate step is a Rewrite stated
// over the current graph; rebuild() turns it into a new graph, drops what the outputs no longer
// need and re-derives every dtype and shape, so the predicate only ever sees well-typed graphs.
#include "tools/shrink.h"

#include <algorithm>
#include <compare>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"
#include "lazyfuse/ir/verifier.h"

namespace lazyfuse::tools {
namespace {

// One candidate step, stated over the values of the graph it applies to.
struct Rewrite {
  // Per node: an earlier node whose value the node's users read instead, or -1.
  std::vector<ValueId> forward;
  // Per node: replaced by a fresh param of its dtype, shape and device (its operands may die).
  std::vector<bool> to_param;
  // New shapes of sources (params and generators), by node.
  std::map<ValueId, Shape> shapes;
  std::vector<ValueId> outputs;

  explicit Rewrite(const Graph& graph)
      : forward(graph.nodes.size(), -1),
        to_param(graph.nodes.size(), false),
        outputs(graph.outputs) {}
};

bool is_source(Op op) { return op == Op::Param || is_generator(op); }

// What every kept step must decrease, compared in this order. Replacing a node by a param
// keeps the node count but removes a computed node; shrinking a size keeps the nodes but
// removes elements; dropping a dim of size 1 removes neither but removes a dim.
struct Size {
  int64_t computed_nodes = 0;
  int64_t nodes = 0;
  int64_t outputs = 0;
  double elements = 0;  // a double: a sum of numels cannot overflow it
  int64_t dims = 0;
  friend auto operator<=>(const Size&, const Size&) = default;
};

Size size_of(const Graph& graph) {
  Size size;
  for (const Node& node : graph.nodes) {
    size.computed_nodes += node.op != Op::Param;
    size.nodes += 1;
    double elements = 1;
    for (int64_t d : node.shape) elements *= static_cast<double>(d);
    size.elements += elements;
    size.dims += static_cast<int64_t>(node.shape.size());
  }
  size.outputs = static_cast<int64_t>(graph.outputs.size());
  return size;
}

// The shape of reshape, expand or narrow, whose result shape is given by the node rather than
// implied by the operand, after the operand's shape changed from `before` to `after`: dims that
// followed the operand follow it still, dims the op set itself stay. nullopt where there is no
// such reading (the candidate is then dropped).
std::optional<Shape> given_shape(const Node& node, const Shape& before, const Shape& after) {
  if (before == after) return node.shape;
  switch (node.op) {
    case Op::Reshape:
      if (numel(before) == numel(after)) return node.shape;
      if (node.shape == before) return after;
      return std::nullopt;
    case Op::Expand: {
      if (before.size() != after.size() || node.shape.size() < after.size()) return std::nullopt;
      Shape result = node.shape;
      const size_t offset = result.size() - after.size();
      for (size_t i = 0; i < after.size(); ++i) {
        // A dim the operand had at the expanded size was copied, not broadcast.
        if (before[i] == node.shape[offset + i]) result[offset + i] = after[i];
      }
      return result;
    }
    case Op::Narrow: {
      if (before.size() != after.size() || node.shape.size() != after.size() || after.empty())
        return std::nullopt;
      const int64_t rank = static_cast<int64_t>(after.size());
      const int64_t dim = normalize_dim(node.attrs.get_int("dim"), rank, "narrow");
      const int64_t start = node.attrs.get_int("start");
      Shape result = after;
      result[dim] = node.shape[dim];
      if (after[dim] != before[dim]) {
        result[dim] = std::min(node.shape[dim], after[dim] - start);
        if (result[dim] < 1) return std::nullopt;
      }
      return result;
    }
    default:
      return std::nullopt;
  }
}

bool has_given_shape(Op op) { return op == Op::Reshape || op == Op::Expand || op == Op::Narrow; }

// The graph `rewrite` describes: only what its outputs need, params first (the old ones in
// their order, then the new ones), every computed node retyped by its op's rules over its new
// operands. nullopt when a rule rejects the new operands or the result fails the verifier.
std::optional<Graph> rebuild(const Graph& graph, const Rewrite& rewrite) {
  const size_t n = graph.nodes.size();
  auto resolve = [&](ValueId v) {
    while (rewrite.forward[v] >= 0) v = rewrite.forward[v];
    return v;
  };
  std::vector<bool> live(n, false);
  for (ValueId output : rewrite.outputs) live[resolve(output)] = true;
  for (size_t i = n; i-- > 0;) {
    if (!live[i] || rewrite.to_param[i]) continue;
    for (ValueId input : graph.nodes[i].inputs) live[resolve(input)] = true;
  }
  std::vector<ValueId> order;
  for (size_t i = 0; i < n; ++i)
    if (live[i] && graph.nodes[i].op == Op::Param) order.push_back(static_cast<ValueId>(i));
  for (size_t i = 0; i < n; ++i)
    if (live[i] && rewrite.to_param[i] && graph.nodes[i].op != Op::Param)
      order.push_back(static_cast<ValueId>(i));
  for (size_t i = 0; i < n; ++i)
    if (live[i] && !rewrite.to_param[i] && graph.nodes[i].op != Op::Param)
      order.push_back(static_cast<ValueId>(i));

  Graph out;
  out.name = graph.name;
  std::vector<ValueId> id(n, -1);
  for (ValueId old : order) {
    const Node& node = graph.nodes[old];
    Node copy = node;
    auto reshaped = rewrite.shapes.find(old);
    if (node.op == Op::Param || rewrite.to_param[old]) {
      copy.op = Op::Param;
      copy.inputs.clear();
      copy.attrs = Attrs();
      if (reshaped != rewrite.shapes.end()) copy.shape = reshaped->second;
      id[old] = out.add(std::move(copy));
      continue;
    }
    if (is_generator(node.op)) {
      if (reshaped != rewrite.shapes.end()) copy.shape = reshaped->second;
      id[old] = out.add(std::move(copy));
      continue;
    }
    std::vector<DType> dtypes;
    std::vector<const Shape*> shapes;  // into `out`, which grows only after they are read
    copy.inputs.clear();
    for (ValueId input : node.inputs) {
      const ValueId now = id[resolve(input)];
      copy.inputs.push_back(now);
      dtypes.push_back(out.nodes[now].dtype);
      shapes.push_back(&out.nodes[now].shape);
    }
    try {
      if (op_dtype_rule(node.op) != DTypeRule::Explicit)
        copy.dtype = infer_result_dtype(node.op, dtypes, node.dtype);
      if (has_given_shape(node.op)) {
        std::optional<Shape> shape =
            given_shape(node, graph.nodes[node.inputs[0]].shape, *shapes[0]);
        if (!shape) return std::nullopt;
        copy.shape = std::move(*shape);
      } else {
        copy.shape = infer_shape(node.op, shapes, node.attrs, node.shape);
      }
    } catch (const Error&) {
      return std::nullopt;
    }
    id[old] = out.add(std::move(copy));
  }
  for (ValueId output : rewrite.outputs) out.outputs.push_back(id[resolve(output)]);
  try {
    verify(out);
  } catch (const Error&) {
    return std::nullopt;
  }
  return out;
}

// The kinds of step, tried in this order: the first ones remove the most at once.
enum class Kind { DropOutput, ToParam, Forward, ShrinkSize, DropDim };

// Sizes a dim of size `size` is tried at: 1 first, then halves, then one less.
std::vector<int64_t> smaller_sizes(int64_t size) {
  std::vector<int64_t> sizes;
  for (int64_t s : {int64_t{1}, size / 2, size - 1})
    if (s >= 1 && s < size && std::find(sizes.begin(), sizes.end(), s) == sizes.end())
      sizes.push_back(s);
  return sizes;
}

// Every step of `kind` on `graph`. Node steps run from the last node to the first: replacing a
// late node by a param cuts off everything above it that nothing else needs.
std::vector<Rewrite> candidates(Kind kind, const Graph& graph) {
  std::vector<Rewrite> steps;
  const ValueId n = static_cast<ValueId>(graph.nodes.size());
  std::vector<ValueId> sources;
  for (ValueId i = 0; i < n; ++i)
    if (is_source(graph.nodes[i].op) && !graph.nodes[i].shape.empty()) sources.push_back(i);
  switch (kind) {
    case Kind::DropOutput:
      for (size_t k = 0; graph.outputs.size() > 1 && k < graph.outputs.size(); ++k) {
        Rewrite step(graph);
        step.outputs.erase(step.outputs.begin() + static_cast<std::ptrdiff_t>(k));
        steps.push_back(std::move(step));
      }
      break;
    case Kind::ToParam:
      for (ValueId i = n - 1; i >= 0; --i) {
        if (graph.nodes[i].op == Op::Param) continue;
        Rewrite step(graph);
        step.to_param[i] = true;
        steps.push_back(std::move(step));
      }
      break;
    case Kind::Forward:
      for (ValueId i = n - 1; i >= 0; --i) {
        std::set<ValueId> seen;
        for (ValueId input : graph.nodes[i].inputs) {
          if (!seen.insert(input).second) continue;
          Rewrite step(graph);
          step.forward[i] = input;
          steps.push_back(std::move(step));
        }
      }
      break;
    case Kind::ShrinkSize: {
      // Sizes are counted from the last dim, as broadcasting aligns them. All sources with one
      // size at one dim shrink together first (they usually broadcast against each other),
      // then each alone.
      std::set<std::pair<size_t, int64_t>, std::greater<>> dims;  // (dim from the end, size)
      for (ValueId s : sources) {
        const Shape& shape = graph.nodes[s].shape;
        for (size_t d = 0; d < shape.size(); ++d)
          if (shape[d] > 1) dims.insert({shape.size() - d, shape[d]});
      }
      for (const auto& [from_end, size] : dims) {
        for (int64_t smaller : smaller_sizes(size)) {
          Rewrite together(graph);
          std::vector<ValueId> matching;
          for (ValueId s : sources) {
            Shape shape = graph.nodes[s].shape;
            if (shape.size() < from_end || shape[shape.size() - from_end] != size) continue;
            shape[shape.size() - from_end] = smaller;
            together.shapes[s] = shape;
            matching.push_back(s);
          }
          steps.push_back(together);
          if (matching.size() < 2) continue;
          for (ValueId s : matching) {
            Rewrite alone(graph);
            alone.shapes[s] = together.shapes[s];
            steps.push_back(std::move(alone));
          }
        }
      }
      break;
    }
    case Kind::DropDim: {
      size_t max_rank = 0;
      for (ValueId s : sources) max_rank = std::max(max_rank, graph.nodes[s].shape.size());
      for (size_t from_end = max_rank; from_end >= 1; --from_end) {
        Rewrite together(graph);
        std::vector<ValueId> matching;
        for (ValueId s : sources) {
          Shape shape = graph.nodes[s].shape;
          if (shape.size() < from_end || shape[shape.size() - from_end] != 1) continue;
          shape.erase(shape.end() - static_cast<std::ptrdiff_t>(from_end));
          together.shapes[s] = shape;
          matching.push_back(s);
        }
        if (matching.empty()) continue;
        steps.push_back(together);
        if (matching.size() < 2) continue;
        for (ValueId s : matching) {
          Rewrite alone(graph);
          alone.shapes[s] = together.shapes[s];
          steps.push_back(std::move(alone));
        }
      }
      break;
    }
  }
  return steps;
}

}  // namespace

ShrinkResult shrink_graph(const Graph& graph, const std::function<bool(const Graph&)>& still_fails,
                          const ShrinkOptions& options) {
  ShrinkResult result;
  result.graph = graph;
  // Calls the predicate within the budget; a candidate beyond it counts as passing.
  auto fails = [&](const Graph& candidate) {
    if (result.attempts >= options.max_attempts) {
      result.exhausted = true;
      return false;
    }
    ++result.attempts;
    return still_fails(candidate);
  };
  auto try_step = [&](const Rewrite& step) {
    std::optional<Graph> next = rebuild(result.graph, step);
    if (!next || !(size_of(*next) < size_of(result.graph)) || !fails(*next)) return false;
    result.graph = std::move(*next);
    ++result.accepted;
    return true;
  };
  // Nodes the outputs do not need go first, in one step.
  try_step(Rewrite(result.graph));

  const Kind kinds[] = {Kind::DropOutput, Kind::ToParam, Kind::Forward, Kind::ShrinkSize,
                        Kind::DropDim};
  bool progress = true;
  while (progress && !result.exhausted) {
    progress = false;
    for (Kind kind : kinds) {
      std::vector<Rewrite> steps = candidates(kind, result.graph);
      for (int k = 0; k < static_cast<int>(steps.size()) && !result.exhausted; ++k) {
        if (!try_step(steps[k])) continue;
        progress = true;
        // The steps of the smaller graph; the one now at position k is the next untried one,
        // roughly (positions shift as nodes go). Anything skipped is retried next round.
        steps = candidates(kind, result.graph);
        k = std::min(k, static_cast<int>(steps.size())) - 1;
      }
    }
  }
  return result;
}

}  // namespace lazyfuse::tools
