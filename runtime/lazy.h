// The pending program: a DAG of LazyValues that tensors point at. Each holds the description of
// the node that computes it and, once computed, its buffer; from then on it is a leaf and later
// graphs start from it.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "lazyfuse/ir/graph.h"
#include "lazyfuse/ir/half_rounding.h"
#include "lazyfuse/runtime/storage.h"

namespace lazyfuse {

struct PipelineOptions;  // ir/passes/passes.h: the passes stay out of the public headers

struct LazyValue : std::enable_shared_from_this<LazyValue> {
  Node node;  // op, dtype, shape, device, attrs, where; node.inputs is unused here
  absl::InlinedVector<std::shared_ptr<LazyValue>, 3> inputs;
  std::optional<BufferView> buffer;  // set once computed; `inputs` is then cleared
  // The strides the value has or will have: contiguous for computed values, derived for views.
  Strides strides;
  // Whether the value is counted in pending_values(): made pending and not computed yet.
  bool in_census = false;
  // Scratch for walks over the pending graph (under the evaluation lock): the walk that last
  // reached this value, and its position in that walk's graph.
  uint64_t walk_id = 0;
  ValueId walk_index = -1;
  // The value an in-place op replaced with this one (Note [Writing an update into its own
  // buffer] in lazy.cc): its buffer may become this value's. Weak: it keeps nothing alive.
  std::weak_ptr<LazyValue> replaces;

  bool computed() const { return buffer.has_value(); }
  ~LazyValue();
};

using LazyRef = std::shared_ptr<LazyValue>;
// A value's inputs, inline up to three (where, clamp and scatter_add take three); a cat of more
// keeps them on the heap.
using LazyInputs = absl::InlinedVector<LazyRef, 3>;

// Whether the value holds its buffer, read under the evaluation lock (another thread may be
// computing it).
bool is_computed(const LazyRef& value);
// Wraps a buffer as a computed value.
LazyRef make_leaf(BufferView buffer, SourceLoc where);
// A pending node over `inputs`; dtype, shape and device already decided by the caller.
LazyRef make_pending(Node node, LazyInputs inputs, Strides strides);
// How many values are pending in the process: made, not computed and not yet destroyed. Each
// is counted once however many graphs share it (Note [Bounding pending work] in lazy.cc).
int64_t pending_values();
// Evaluates `value` when the pending values have grown past LAZYFUSE_MAX_PENDING since the last
// evaluation ended (Note [Bounding pending work] in lazy.cc). Called as each node is made.
void evaluate_if_past_pending_bound(const std::shared_ptr<LazyValue>& value);
// Records that an in-place op rebound a tensor from `old_value` to `result`, so that evaluation
// may write `result` into `old_value`'s buffer where nothing can read that again. Only a pending
// result that replaces nothing yet takes it.
void note_replaced(const LazyRef& result, const LazyRef& old_value);

// The graph that computes `outputs` from computed values (params, in order of first use).
struct BuiltGraph {
  Graph graph;
  std::vector<LazyRef> params;  // the value bound to each param
};
BuiltGraph build_graph(std::span<const LazyRef> outputs);

struct EvalOptions {
  bool fusion = true;
};
// The passes' options for an evaluation with `options`: fusion as they and LAZYFUSE_FUSION say,
// half values rounded as half_rounding() says.
PipelineOptions evaluation_pipeline(const EvalOptions& options);
// What an evaluation of `outputs` with `options` would run, as text (print_schedule): the same
// graph through the same passes with the same switches. Computes nothing.
std::string scheduled_ir(std::span<const LazyRef> outputs, const EvalOptions& options = {});
// How fused kernels round float16 and bfloat16 values (Note [Half precision in fused kernels] in
// ir/half_rounding.h): only where stored, the default, or after every op as PyTorch eager does
// (LAZYFUSE_HALF_ROUNDING=each_op). Process-wide; evaluations after a change compile for it.
HalfRounding half_rounding();
void set_half_rounding(HalfRounding rounding);
// The rounding for one scope: HalfRoundingGuard each_op(HalfRounding::EachOp);
class HalfRoundingGuard {
 public:
  explicit HalfRoundingGuard(HalfRounding rounding) : saved_(half_rounding()) {
    set_half_rounding(rounding);
  }
  ~HalfRoundingGuard() { set_half_rounding(saved_); }
  HalfRoundingGuard(const HalfRoundingGuard&) = delete;
  HalfRoundingGuard& operator=(const HalfRoundingGuard&) = delete;

 private:
  HalfRounding saved_;
};
// Computes every pending value in `outputs` in one go: one graph, one pass pipeline, shared
// work. On success each becomes a leaf holding its buffer; if anything throws, every value is
// left as it was.
void evaluate(std::span<const LazyRef> outputs, const EvalOptions& options = {});

// Counters of what evaluation did, for tests that state kernel counts and for LAZYFUSE_DEBUG.
struct EvalStats {
  int64_t evaluations = 0;
  int64_t nodes = 0;    // the evaluated graphs' nodes, params included
  int64_t kernels = 0;  // Schedule::num_kernels() summed: no views, no transfers
  // What the backends started running them (count_launch in runtime/backend.h): on a GPU, kernel
  // launches and library calls, copies that stage operands included.
  int64_t launches = 0;
  int64_t elementwise_kernels = 0;
  // Evaluations that reused a schedule (Note [Schedule cache] in lazy.cc), and those that could
  // not be cached (dumping, or too many nodes); the rest ran the passes and cached the result.
  int64_t schedule_cache_hits = 0;
  int64_t schedule_cache_bypasses = 0;
  // Outputs written into the buffer of the value an in-place op replaced (Note [Writing an
  // update into its own buffer] in lazy.cc).
  int64_t in_place_outputs = 0;
};
EvalStats eval_stats();
void reset_eval_stats();

}  // namespace lazyfuse
