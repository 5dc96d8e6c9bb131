// View sinking.
//
// A view of an elementwise result, (a + b).t(), would cut a fused group: the view needs its
// operand stored. But a view commutes with an elementwise op, (a + b).t() == a.t() + b.t(), and
// a view of a stored value costs nothing (a kernel reads it through strides). So views of
// elementwise nodes are moved onto those nodes' operands, until they sit on params, generators
// or library results; the elementwise chain around them then fuses into one kernel.
//
// Only permute, narrow and expand move: they are views of any strides. A reshape may need a
// copy when its operand is strided, which the IR cannot see, so it stays. Moving a view changes
// the layout a value is stored in, so a reshape further on may find no view of it where the
// frontend foresaw one: the runtime then copies (Note [Reshape of any layout] in
// runtime/executor.cc), and every rewrite here stays valid. Only an elementwise
// node whose one use is the view moves, so no work is duplicated; an operand of another shape is
// first expanded to the node's shape (a view too); a scalar constant needs no view.
//
// A view of a constant (any view, reshape too) is the constant in the view's shape: it is folded
// into one, so that a constant spread over a shape (the ones a gradient starts from, expanded
// over what a sum reduced) fuses like any generator instead of being stored first.
//
// An expand of a value that is not elementwise (a reduction's result), read by an elementwise op
// that broadcasts its operands anyway ((s.expand(x) / e) with s of shape [rows, 1], what the
// gradient of a keepdim sum or of a mean makes), is dropped: the op reads the expand's operand and
// broadcasts it to the same values. Fusion then sees the op read a reduction's result directly,
// and a row reduction can take the op into its kernel.
//
// Two kinds of elementwise node stay where they are. One whose operands are keepdim reductions
// over trailing dims (and scalar constants), or such nodes, has one value per row (the gradient
// of a row's log-sum: its sum over the row divided by the sum): an expand of it stays, so that
// the row kernel that computes those reductions computes it once per row, and an op reading the
// expand reads the node itself where its own broadcasting allows. And any view, a reshape too,
// of an op of constants alone (the ones a gradient starts from, divided by a count) moves onto
// the constants, which then fold.
//
// An arange read by one elementwise op that broadcasts it over the trailing dims of the op's
// shape (one-hot's classes against [rows, 1] labels) becomes an arange of the op's shape that
// counts modulo its own length: a generator of the op's shape fuses into its kernel.
//
// A transpose of a matrix product whose one use it is becomes the product of the transposed
// operands, swapped ((x @ y)^T == y^T @ x^T): gemm reads a transposed operand in place, where
// the transpose of a stored product is read across its rows. Only where every reader of the
// transpose computes: one that views it further (an attention's key gradient, transposed back
// across heads and reshaped) was laid out by the user for those views, and would be copied.
//
// Before: a placed graph. After: no view reads a constant or an op of constants alone; no
// permute, narrow or expand reads an elementwise node that has no other use and is not returned,
// except an expand of a row value; no elementwise op reads an expand that its own broadcasting
// makes unneeded; no arange is read broadcast over trailing dims by its one reader; no transpose
// reads a product of matrices that has no other use and is not returned, unless a view reads
// the transpose; values are
// unchanged (and, as after cse and dce, no two nodes are equal and none is dead).
#include <algorithm>

#include "lazyfuse/ir/infer.h"
#include "lazyfuse/ir/passes/passes.h"

namespace lazyfuse {
namespace {

bool movable_view(Op op) { return op == Op::Permute || op == Op::Narrow || op == Op::Expand; }

bool is_computing_elementwise(Op op) { return is_elementwise(op) && !is_generator(op); }

// What each node is, for the rules above, in one forward walk.
struct NodeRoles {
  std::vector<bool> per_row;   // one value per row, computed from row reductions
  std::vector<bool> constant;  // a constant, or an op of constants alone
};
NodeRoles node_roles(const Graph& graph) {
  NodeRoles roles{std::vector<bool>(graph.nodes.size(), false),
                  std::vector<bool>(graph.nodes.size(), false)};
  auto is_row_reduction = [&](const Node& node) {
    if (!is_reduction(node.op) || !node.attrs.has("keepdim") || !node.attrs.get_bool("keepdim"))
      return false;
    const int64_t rank = static_cast<int64_t>(graph.nodes[node.inputs[0]].shape.size());
    return reduces_trailing_dims(reduction_dims(node.attrs, rank), rank);
  };
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (node.op == Op::Const) {
      roles.constant[i] = true;
      continue;
    }
    if (!is_computing_elementwise(node.op)) continue;
    bool constant = true, per_row = false, row_operands = true;
    for (ValueId in : node.inputs) {
      const Node& operand = graph.nodes[in];
      constant &= roles.constant[in];
      if (is_scalar_constant(operand)) continue;
      const bool row_value =
          operand.shape == node.shape && (roles.per_row[in] || is_row_reduction(operand));
      row_operands &= row_value;
      per_row |= row_value;
    }
    roles.constant[i] = constant;
    roles.per_row[i] = per_row && row_operands;
  }
  return roles;
}

// Turns every view of a constant into a constant of the view's shape (in one forward walk, so
// a chain of views folds whole). Returns whether anything changed.
bool fold_views_of_constants(Graph& graph) {
  bool any = false;
  for (Node& node : graph.nodes) {
    if (!is_view(node.op) || graph.nodes[node.inputs[0]].op != Op::Const) continue;
    node.attrs = graph.nodes[node.inputs[0]].attrs;
    node.op = Op::Const;
    node.inputs.clear();
    any = true;
  }
  return any;
}

// Each elementwise op reads, in place of an expand, the expand's operand wherever the op's own
// broadcasting gives it the same shape. Returns whether anything changed.
bool drop_broadcast_expands(Graph& graph) {
  const NodeRoles roles = node_roles(graph);
  bool any = false;
  for (Node& node : graph.nodes) {
    if (!is_elementwise(node.op) || node.inputs.size() < 2) continue;
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      const Node& expand = graph.nodes[node.inputs[k]];
      // An expand of an elementwise result sinks onto its operands instead (sink_once), so the
      // work moves into the kernel of the op's shape; one of a row value stays and is dropped.
      if (expand.op != Op::Expand) continue;
      const ValueId operand = expand.inputs[0];
      if (is_elementwise(graph.nodes[operand].op) && !roles.per_row[operand]) continue;
      std::vector<const Shape*> shapes;
      for (size_t j = 0; j < node.inputs.size(); ++j)
        shapes.push_back(j == k ? &graph.nodes[expand.inputs[0]].shape
                                : &graph.nodes[node.inputs[j]].shape);
      if (infer_shape(node.op, shapes, node.attrs, node.shape) != node.shape) continue;
      node.inputs[k] = expand.inputs[0];
      any = true;
    }
  }
  return any;
}

// Each arange that one elementwise op reads, broadcast over the op's trailing dims, takes the
// op's shape and counts modulo its own length. Returns whether anything changed.
bool widen_broadcast_aranges(Graph& graph) {
  const std::vector<std::vector<ValueId>> users = users_of(graph);
  bool any = false;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    Node& arange = graph.nodes[i];
    if (arange.op != Op::Arange || users[i].size() != 1) continue;
    const Node& reader = graph.nodes[users[i][0]];
    if (!is_computing_elementwise(reader.op) || reader.shape == arange.shape ||
        reader.device != arange.device)
      continue;
    // Its dims after leading ones must be the reader's trailing dims, so that the reader's
    // element i reads the arange's element i mod its length.
    auto first =
        std::find_if(arange.shape.begin(), arange.shape.end(), [](int64_t d) { return d != 1; });
    const size_t kept = static_cast<size_t>(arange.shape.end() - first);
    if (kept == 0 || kept > reader.shape.size() ||
        !std::equal(first, arange.shape.end(), reader.shape.end() - static_cast<ptrdiff_t>(kept)))
      continue;
    const int64_t length = numel(arange.shape);
    if (!arange.attrs.has("period")) arange.attrs.set("period", length);
    arange.shape = reader.shape;
    any = true;
  }
  return any;
}

// Rebuilds `graph` in order without the nodes `moves` marks, each of which has one use, a view:
// in the marked node's and its view's place, what rebuild(view, remap, rebuilt) adds to
// `rebuilt` (remap: old value -> new, for everything before the view); every other node copied.
template <typename Rebuild>
void rebuild_at_views(Graph& graph, const std::vector<bool>& moves, Rebuild&& rebuild) {
  Graph rebuilt;
  rebuilt.name = graph.name;
  std::vector<ValueId> remap(graph.nodes.size(), -1);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (moves[i]) continue;  // rebuilt at its view
    if (!is_view(node.op) || !moves[node.inputs[0]]) {
      Node copy = node;
      for (ValueId& in : copy.inputs) in = remap[in];
      remap[i] = rebuilt.add(std::move(copy));
      continue;
    }
    remap[i] = rebuild(node, remap, rebuilt);
  }
  for (ValueId output : graph.outputs) rebuilt.outputs.push_back(remap[output]);
  graph = std::move(rebuilt);
}

// One sweep; returns whether anything moved.
bool sink_once(Graph& graph) {
  std::vector<std::vector<ValueId>> users = users_of(graph);
  std::vector<bool> is_output(graph.nodes.size(), false);
  for (ValueId v : graph.outputs) is_output[v] = true;
  const NodeRoles roles = node_roles(graph);
  // The elementwise nodes that move below their one view.
  std::vector<bool> moves(graph.nodes.size(), false);
  bool any = false;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (!is_view(node.op)) continue;
    ValueId operand = node.inputs[0];
    // A reshape may need a copy of a strided operand; an op of constants has none.
    const bool moves_here = movable_view(node.op)
                                ? !(node.op == Op::Expand && roles.per_row[operand])
                                : roles.constant[operand];
    // An op of scalar constants alone gets no view on any operand, so it would not take the
    // view's shape: it stays (it is as cheap as a constant).
    bool viewable = false;
    for (ValueId in : graph.nodes[operand].inputs) viewable |= !is_scalar_constant(graph.nodes[in]);
    if (moves_here && is_elementwise(graph.nodes[operand].op) && viewable &&
        users[operand].size() == 1 && !is_output[operand]) {
      moves[operand] = true;
      any = true;
    }
  }
  if (!any) return false;
  // view(op(x, y)) becomes op(view(expand(x)), view(expand(y))).
  rebuild_at_views(graph, moves,
                   [&](const Node& node, const std::vector<ValueId>& remap, Graph& sunk) {
                     const Node& inner = graph.nodes[node.inputs[0]];
                     Node moved = inner;
                     moved.shape = node.shape;
                     moved.where = node.where;
                     for (ValueId& in : moved.inputs) {
                       const Node& operand = graph.nodes[in];
                       ValueId value = remap[in];
                       if (is_scalar_constant(operand)) {
                         in = value;
                         continue;
                       }
                       if (operand.shape != inner.shape) {
                         Node expand = operand;
                         expand.op = Op::Expand;
                         expand.shape = inner.shape;
                         expand.inputs = {value};
                         expand.attrs = Attrs();
                         expand.where = node.where;
                         value = sunk.add(std::move(expand));
                       }
                       Node view = node;
                       view.dtype = operand.dtype;
                       view.inputs = {value};
                       in = sunk.add(std::move(view));
                     }
                     return sunk.add(std::move(moved));
                   });
  return true;
}

// Whether `dims` swaps the last two dims and keeps the others: a matrix transpose.
bool swaps_last_two(const std::vector<int64_t>& dims) {
  const int64_t rank = static_cast<int64_t>(dims.size());
  if (rank < 2) return false;
  for (int64_t d = 0; d < rank - 2; ++d)
    if (dims[d] != d) return false;
  return dims[rank - 2] == rank - 1 && dims[rank - 1] == rank - 2;
}

// A transpose of a product becomes the product of the transposes, swapped: (x @ y)^T is
// y^T @ x^T, and a library's gemm reads a transposed operand where it lies. Otherwise the
// transpose of a stored product is read element by element across its rows: the weight
// gradient of a Linear layer (the gradient of weight.t()) was an optimizer's strided read of
// every weight. Only a product of matrices (no 1-d operand) whose one use is the transpose and
// that is not returned; the same products are summed, by gemm in its own order.
bool transpose_products(Graph& graph) {
  const std::vector<std::vector<ValueId>> users = users_of(graph);
  std::vector<bool> is_output(graph.nodes.size(), false);
  for (ValueId v : graph.outputs) is_output[v] = true;
  std::vector<bool> moves(graph.nodes.size(), false);
  bool any = false;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    if (node.op != Op::Permute || !swaps_last_two(node.attrs.get_ints("dims"))) continue;
    if (std::any_of(users[i].begin(), users[i].end(),
                    [&](ValueId reader) { return is_view(graph.nodes[reader].op); }))
      continue;
    const ValueId product = node.inputs[0];
    const Node& matmul = graph.nodes[product];
    if (matmul.op != Op::Matmul || users[product].size() != 1 || is_output[product]) continue;
    if (graph.nodes[matmul.inputs[0]].shape.size() < 2 ||
        graph.nodes[matmul.inputs[1]].shape.size() < 2)
      continue;
    moves[product] = true;
    any = true;
  }
  if (!any) return false;
  rebuild_at_views(
      graph, moves, [&](const Node& node, const std::vector<ValueId>& remap, Graph& swapped) {
        const Node& matmul = graph.nodes[node.inputs[0]];
        auto transposed = [&](ValueId operand) {
          Node view = graph.nodes[operand];
          const int64_t rank = static_cast<int64_t>(view.shape.size());
          std::vector<int64_t> dims(static_cast<size_t>(rank));
          for (int64_t d = 0; d < rank; ++d) dims[d] = d;
          std::swap(dims[rank - 2], dims[rank - 1]);
          std::swap(view.shape[rank - 2], view.shape[rank - 1]);
          view.op = Op::Permute;
          view.inputs = {remap[operand]};
          view.attrs = Attrs();
          view.attrs.set("dims", dims);
          view.where = node.where;
          return swapped.add(std::move(view));
        };
        const ValueId y_t = transposed(matmul.inputs[1]), x_t = transposed(matmul.inputs[0]);
        Node product = matmul;
        product.shape = node.shape;
        product.inputs = {y_t, x_t};
        product.where = node.where;
        return swapped.add(std::move(product));
      });
  return true;
}

}  // namespace

void run_sink_views(Graph& graph) {
  // Each sweep moves views one op further; a chain of n ops takes n sweeps. Before each, cse
  // merges equal views of one value (the user's, or those a sweep made of one operand), so
  // that value has one use and can move too.
  for (size_t sweep = 0; sweep <= graph.nodes.size(); ++sweep) {
    const bool folded = fold_views_of_constants(graph);
    const bool dropped = drop_broadcast_expands(graph);
    const bool widened = widen_broadcast_aranges(graph);
    const bool products = transpose_products(graph);
    run_cse(graph);
    run_dce(graph);
    if (!sink_once(graph) && !folded && !dropped && !widened && !products) break;
  }
}

}  // namespace lazyfuse
