// Building a graph from pending values, and evaluating it.
#include "lazyfuse/runtime/lazy.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/runtime/backend.h"
#include "lazyfuse/runtime/env.h"
#include "lazyfuse/runtime/executor.h"
#include "lazyfuse/runtime/host_profile.h"
#include "lazyfuse/runtime/pool_allocator.h"

namespace lazyfuse {

namespace {
// Evaluation writes values' buffers; everything that reads whether a value is computed takes
// this lock too, so threads may share tensors.
std::mutex eval_mutex;
}  // namespace

bool is_computed(const LazyRef& value) {
  std::lock_guard lock(eval_mutex);
  return value->computed();
}

LazyRef make_leaf(BufferView buffer, SourceLoc where) {
  auto value = make_pooled<LazyValue>();
  value->node.op = Op::Param;
  value->node.dtype = buffer.dtype;
  value->node.shape = buffer.shape;
  value->node.device = buffer.storage->device();
  value->node.where = where;
  value->strides = buffer.strides;
  value->buffer = std::move(buffer);
  return value;
}

void note_replaced(const LazyRef& result, const LazyRef& old_value) {
  std::lock_guard lock(eval_mutex);
  if (result->computed() || !result->replaces.expired() || result == old_value) return;
  // A chain of updates still pending (m.mul_(b).add_(x)) replaces what its first one did.
  LazyRef replaced = old_value;
  if (!replaced->computed())
    if (LazyRef earlier = replaced->replaces.lock()) replaced = std::move(earlier);
  result->replaces = replaced;
}

// Note [Bounding pending work]
// Work that is never asked for would pile up without end (a loop that only adds), and a graph
// costs host memory and pass time in proportion to its nodes. So a pending graph is cut,
// ArrayFire's rule, once the process holds more than LAZYFUSE_MAX_PENDING pending values beyond
// what it held when the last evaluation ended: the value just made is evaluated, and with it what
// it reads. What is counted is a census of values, each once, not a sum over each value's inputs:
// in a residual network every block reads the stream twice, and a sum doubles per block (GPT-2's
// step of ~5k nodes was cut into 169 evaluations: issue 43). A value leaves the census when it
// is computed or destroyed. The cut waits for a value that reads pending work: a constant made
// past the bound would be evaluated alone. Cutting at a count of values made since an evaluation
// ended puts the cuts of a loop's every iteration at the same op, so a cut step repeats the same
// graphs and hits the schedule cache. The default bound (env.h) keeps a whole large model's
// training step in one evaluation: its graph is built and scheduled in a time and memory linear in
// its nodes.
namespace {
std::atomic<int64_t> pending_census{0};
// The census above which the node made is evaluated; -1 after an evaluation, so that the next
// node made sets it from what is pending then (once the values the evaluation left unread, such
// as a chain's old head the caller still held, are gone).
std::atomic<int64_t> pending_cut_at{-1};

void leave_census(LazyValue& value) {
  if (!value.in_census) return;
  value.in_census = false;
  pending_census.fetch_sub(1, std::memory_order_relaxed);
}

void rebase_pending_cut() { pending_cut_at.store(-1, std::memory_order_relaxed); }
}  // namespace

// A value holds its inputs, so a pending chain would be destroyed recursively, a value's
// destructor releasing its input's: a chain as long as the pending bound allows overflowed the
// stack (under AddressSanitizer, whose frames are larger, at 65,536). The inputs this value was
// the last to hold are released here, one at a time, each emptied of its own first.
LazyValue::~LazyValue() {
  leave_census(*this);
  if (inputs.empty()) return;
  std::vector<LazyRef> doomed(std::make_move_iterator(inputs.begin()),
                              std::make_move_iterator(inputs.end()));
  inputs.clear();
  while (!doomed.empty()) {
    LazyRef value = std::move(doomed.back());
    doomed.pop_back();
    if (value.use_count() == 1) {
      for (LazyRef& input : value->inputs) doomed.push_back(std::move(input));
      value->inputs.clear();
    }
  }
}

int64_t pending_values() { return pending_census.load(std::memory_order_relaxed); }

void evaluate_if_past_pending_bound(const LazyRef& value) {
  const int64_t census = pending_census.load(std::memory_order_relaxed);
  int64_t cut_at = pending_cut_at.load(std::memory_order_relaxed);
  if (cut_at < 0) {
    cut_at = census - 1 + env_config().max_pending;  // `value` is the first made since
    pending_cut_at.store(cut_at, std::memory_order_relaxed);
  }
  if (census <= cut_at) return;
  // A value that reads nothing pending (a constant, a generator) would be evaluated alone,
  // leaving the work that made the census grow: the cut waits for a value that reads it.
  bool reads_pending = false;
  {
    std::lock_guard lock(eval_mutex);
    for (const LazyRef& input : value->inputs) reads_pending |= !input->computed();
  }
  if (reads_pending) evaluate(std::span(&value, 1));
}

LazyRef make_pending(Node node, LazyInputs inputs, Strides strides) {
  auto value = make_pooled<LazyValue>();
  value->in_census = true;
  pending_census.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(eval_mutex);
  value->node = std::move(node);
  value->inputs = std::move(inputs);
  value->strides = std::move(strides);
  return value;
}

namespace {

// The pending DAG behind some outputs, in evaluation order: the computed values it reaches
// (the params, in order of first use), then the pending values, each after its inputs. Each
// value's position is left in its `walk_index` (valid until the next walk; under eval_mutex).
// Small graphs, the ones evaluated in a loop, walk without touching the heap.
struct Walk {
  uint64_t id = 0;  // the walk_id it left in the values it reached
  absl::InlinedVector<LazyValue*, 8> params;
  absl::InlinedVector<LazyValue*, 16> pending;
};

// Note [Views of computed values]
// A narrow of a computed value needs no kernel: it is the value's buffer at another offset, with
// other sizes, which is what a View step computes anyway. Evaluation takes such a view (and the
// reshapes, permutes and expands over it) when it meets one, so the view is a param of the graph
// rather than a node whose offset is an attribute in the schedule's key. A loop that slices each
// step's batch out of one tensor (x.narrow(0, i * b, b)) then repeats one cached schedule
// instead of making one per offset, and a CUDA graph reads each batch where it is. Only chains
// with a narrow in them: other views' attributes are the same every run, and a view taken shares
// its base's storage, which stops an update being written into the base's buffer (Note
// [Writing an update into its own buffer]; a Linear's weight is read through its transpose).
// t.ir() and t.fused_ir() still show the views: they do not evaluate. A reshape that no strides
// express stays a node (the pipeline copies there).
// Takes the views between `value` and the computed value under them where they qualify; returns
// whether `value` is computed now.
bool take_views_of_computed(LazyValue* value) {
  absl::InlinedVector<LazyValue*, 4> chain;
  bool narrows = false;
  for (LazyValue* v = value; !v->computed(); v = v->inputs[0].get()) {
    if (!is_view(v->node.op) || v->inputs.size() != 1) return false;
    narrows |= v->node.op == Op::Narrow;
    chain.push_back(v);
  }
  if (!narrows) return false;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    LazyValue& view = **it;
    const BufferView& base = *view.inputs[0]->buffer;
    Strides strides;
    if (view.node.dtype != base.dtype ||
        (view.node.op == Op::Reshape &&
         !view_strides(base.shape, base.strides, view.node.shape, &strides)))
      return false;
    view.buffer = apply_view(view.node, base);
    view.strides = view.buffer->strides;
    view.inputs.clear();
    leave_census(view);
  }
  return true;
}

Walk walk_pending(std::span<const LazyRef> outputs, bool take_views = false) {
  static uint64_t walks = 0;
  const uint64_t walk = ++walks;
  Walk result;
  result.id = walk;
  // Post-order DFS without recursion (deep chains must not overflow the stack).
  absl::InlinedVector<std::pair<LazyValue*, bool>, 32> stack;
  for (auto it = outputs.rbegin(); it != outputs.rend(); ++it) stack.push_back({it->get(), false});
  while (!stack.empty()) {
    auto [value, expanded] = stack.back();
    stack.pop_back();
    if (expanded) {
      result.pending.push_back(value);
      continue;
    }
    if (value->walk_id == walk) continue;
    value->walk_id = walk;
    if (value->computed() ||
        (take_views && is_view(value->node.op) && take_views_of_computed(value))) {
      result.params.push_back(value);
      continue;
    }
    stack.push_back({value, true});  // popped once every input above it is done
    for (auto it = value->inputs.rbegin(); it != value->inputs.rend(); ++it)
      if ((*it)->walk_id != walk) stack.push_back({it->get(), false});
  }
  ValueId next = 0;
  for (LazyValue* value : result.params) value->walk_index = next++;
  for (LazyValue* value : result.pending) value->walk_index = next++;
  return result;
}

// The graph node for a walked value: a param keeps only its type and origin.
Node graph_node(const LazyValue& value) {
  Node node = value.node;
  node.inputs.clear();
  if (value.computed()) {
    node.op = Op::Param;
    node.attrs = Attrs();
  } else {
    for (const LazyRef& input : value.inputs) node.inputs.push_back(input->walk_index);
  }
  return node;
}

Graph walk_to_graph(const Walk& walk, std::span<const LazyRef> outputs) {
  Graph graph;
  graph.nodes.reserve(walk.params.size() + walk.pending.size());
  for (const LazyValue* value : walk.params) graph.add(graph_node(*value));
  for (const LazyValue* value : walk.pending) graph.add(graph_node(*value));
  for (const LazyRef& output : outputs) graph.outputs.push_back(output->walk_index);
  return graph;
}

BuiltGraph build_graph_locked(std::span<const LazyRef> outputs) {
  Walk walk = walk_pending(outputs);
  BuiltGraph built;
  built.graph = walk_to_graph(walk, outputs);
  for (LazyValue* param : walk.params) built.params.push_back(param->shared_from_this());
  return built;
}

// Note [Schedule cache]
// A loop evaluates the same expression over new data again and again; the pass pipeline's
// result depends only on the graph (ops, types, shapes, devices, attributes, wiring, where each
// node was written) and the fusion options, never on the data. So the schedule is kept under a
// hash of those, and a repeat skips building the graph and every pass: the walk hashes the
// pending values, and a hit is confirmed node by node against the graph it was made from (a
// hash collision costs a miss, never a wrong schedule). Params match on type and device alone.
// Dumps (LAZYFUSE_DUMP) bypass the cache so they always show the passes. A full cache makes room
// by dropping the schedule used longest ago, so that a loop's own schedules stay while a stream
// of one-off graphs (shapes that change) passes through. The cache is bounded in entries and in
// the nodes of their graphs together, not per graph: a large model's whole training step (GPT-2's
// is ~5k nodes) is the schedule that most needs reusing, and what it keeps (its graph twice, its
// plans) grows with its nodes.
constexpr size_t kScheduleCacheEntries = 256;
constexpr size_t kScheduleCacheNodes = size_t{1} << 20;

struct CachedSchedule {
  Graph graph;                                          // before the passes
  HalfRounding half_rounding = HalfRounding::AtStores;  // what its kernels were made for
  Schedule schedule;
  std::vector<std::unique_ptr<StepCache>> step_caches;  // one per step, the backends'
  // The device of every compute step where there is one and nothing moves between devices:
  // its backend may replay the schedule's runs (Backend::run_replayable).
  std::optional<Device> replay_device;
  std::unique_ptr<ReplayCache> replay;  // the backend's
  // Per value: the value it is a view of, through any chain of views (itself when it is none).
  std::vector<ValueId> view_root;
  // Per param: no output is the param or a view of it (a backend may read a copy instead).
  absl::InlinedVector<bool, 8> param_substitutable;
  // Whether the schedule lets an output be written into a param's buffer, by (output << 32 |
  // param): schedule_allows_writing_into.
  absl::flat_hash_map<uint64_t, bool> writes_into_param;
  bool ran = false;        // a run completed: its kernels are compiled, its plans made
  uint64_t last_used = 0;  // schedule_cache_clock when it was last made or found
};

// Note [Writing an update into its own buffer]
// An in-place op computes its result out of place and rebinds the tensor (Note [In-place
// updates] in frontend/in_place.cc). Left at that, an optimizer step allocates every parameter
// and its state anew and frees the old buffers: memory churns and a parameter's address changes
// every step, which keeps a training step out of CUDA graphs (Note [CUDA graph replay]). So
// evaluation writes such a result into the replaced value's own buffer when no one can tell:
// - the replaced value is one of the graph's params, computed, the sole owner of a dense buffer
//   of the result's dtype and shape on its device;
// - every reference to it comes from values pending in this evaluation, and no value that will
//   stay pending afterwards (one held outside the evaluation that is not one of its outputs)
//   reaches it: once the outputs are computed, nothing reads the old value again;
// - in the schedule, the result is computed by an elementwise step (or group member) that reads
//   the param itself, not a view of it, with no member after the result's node reading it (a
//   kernel stores each output as it is computed); no other member of its group and no output
//   reads the param or a view of it. An elementwise kernel reads and writes each element at the
//   same place, so reading the old value and writing the new one there is safe;
// - nothing can fail once the old value is overwritten, since a failed evaluation must leave the
//   old value to the pending values that read it: the writing step is the schedule's last
//   compute step (only views follow), a group does all that can fail (allocating, staging)
//   before any member writes (both backends), and the schedule has completed a run before (its
//   kernels are compiled and its plans made).
// A value the user still holds, one a retained autograd graph saved, or a pending expression
// over the old value keeps the update out of place.

// Whether `schedule` computes `output` where it may be written into param `param`'s buffer
// (the schedule's part of the Note above).
bool schedule_allows_writing_into(const Schedule& schedule, std::span<const ValueId> view_root,
                                  ValueId output, ValueId param) {
  const Graph& graph = schedule.graph;
  // The param and the views of it.
  auto is_param_view = [&](ValueId v) { return view_root[v] == param; };
  if (std::any_of(graph.outputs.begin(), graph.outputs.end(), is_param_view)) return false;
  auto reads_param = [&](const Step& step) {
    return std::any_of(step.inputs.begin(), step.inputs.end(), is_param_view);
  };
  auto computes_output = [&](const Step& step) {
    return std::find(step.outputs.begin(), step.outputs.end(), output) != step.outputs.end();
  };
  size_t at = 0;
  while (at < schedule.steps.size() && !computes_output(schedule.steps[at])) ++at;
  if (at == schedule.steps.size()) return false;
  const Step& writer = schedule.steps[at];
  const Step* member = &writer;
  if (writer.kind == StepKind::Group) {
    member = nullptr;
    for (const Step& m : writer.members) {
      if (computes_output(m))
        member = &m;
      else if (reads_param(m))
        return false;
    }
    if (member == nullptr) return false;
  }
  if (member->kind != StepKind::Elementwise) return false;
  for (ValueId v : member->inputs)
    if (v != param && is_param_view(v)) return false;
  const auto position = std::find(member->nodes.begin(), member->nodes.end(), output);
  if (position == member->nodes.end()) return false;
  for (auto it = std::next(position); it != member->nodes.end(); ++it) {
    const std::vector<ValueId>& inputs = graph.nodes[*it].inputs;
    if (std::find(inputs.begin(), inputs.end(), param) != inputs.end()) return false;
  }
  for (size_t later = at + 1; later < schedule.steps.size(); ++later)
    if (schedule.steps[later].kind != StepKind::View || reads_param(schedule.steps[later]))
      return false;
  return true;
}

// The outputs this evaluation writes into the buffer of the param their in-place op replaced,
// as (output, param) value ids (the evaluation's part of the Note above). Under eval_mutex.
absl::InlinedVector<std::pair<ValueId, ValueId>, 8> outputs_written_in_place(
    const Walk& walk, std::span<const LazyRef> outputs, const Graph& graph,
    CachedSchedule* cached) {
  absl::InlinedVector<std::pair<ValueId, ValueId>, 8> written;
  if (!cached->ran) return written;
  absl::InlinedVector<std::pair<size_t, LazyValue*>, 8> candidates;  // output index, old value
  for (size_t i = 0; i < outputs.size(); ++i) {
    LazyValue* old_value = outputs[i]->replaces.lock().get();
    if (old_value != nullptr && old_value->walk_id == walk.id && old_value->computed())
      candidates.push_back({i, old_value});
  }
  if (candidates.empty()) return written;
  // References to each walked value from the evaluation itself: its pending values' inputs and
  // the list of outputs.
  const size_t count = walk.params.size() + walk.pending.size();
  absl::InlinedVector<int64_t, 32> internal(count, 0);
  for (const LazyValue* value : walk.pending)
    for (const LazyRef& input : value->inputs) ++internal[input->walk_index];
  absl::InlinedVector<bool, 32> is_output(count, false);
  for (const LazyRef& output : outputs) {
    ++internal[output->walk_index];
    is_output[output->walk_index] = true;
  }
  // What values that stay pending after this evaluation (held outside it, not outputs) reach.
  // Not through an output: computed, it is read from its own buffer from then on.
  absl::InlinedVector<bool, 32> reached(count, false);
  for (size_t k = walk.pending.size(); k-- > 0;) {
    const LazyValue* value = walk.pending[k];
    const ValueId id = value->walk_index;
    if (is_output[id]) continue;
    if (!reached[id] && value->weak_from_this().use_count() <= internal[id]) continue;
    for (const LazyRef& input : value->inputs) reached[input->walk_index] = true;
  }
  for (const auto& [index, old_value] : candidates) {
    const ValueId param = old_value->walk_index;
    const ValueId output = graph.outputs[index];
    // An output listed twice (a count every parameter's state returns) is written once.
    if (std::any_of(written.begin(), written.end(),
                    [&](const auto& w) { return w.first == output; }))
      continue;
    const BufferView& buffer = *old_value->buffer;
    const Node& result = graph.nodes[output];
    if (reached[param] || old_value->weak_from_this().use_count() != internal[param] ||
        buffer.dtype != result.dtype || buffer.shape != result.shape ||
        buffer.storage->device() != result.device || buffer.offset != 0 ||
        !buffer.is_contiguous() || buffer.storage.use_count() != 1 ||
        buffer.storage->is_external() ||  // the caller's memory (from_blob): read, never written
        buffer.storage->nbytes() != numel(buffer.shape) * dtype_size(buffer.dtype))
      continue;
    const uint64_t key = static_cast<uint64_t>(output) << 32 | static_cast<uint32_t>(param);
    auto [it, fresh] = cached->writes_into_param.try_emplace(key, false);
    if (fresh)
      it->second = schedule_allows_writing_into(cached->schedule, cached->view_root, output, param);
    if (it->second) written.push_back({output, param});
  }
  return written;
}

// Each value's view root: the value it is a view of through the schedule's View steps (which
// come after the steps computing their inputs), or itself.
std::vector<ValueId> view_roots(const Schedule& schedule) {
  std::vector<ValueId> root(schedule.graph.nodes.size());
  for (size_t v = 0; v < root.size(); ++v) root[v] = static_cast<ValueId>(v);
  for (const Step& step : schedule.steps)
    if (step.kind == StepKind::View)
      root[step.nodes[0]] = root[schedule.graph.nodes[step.nodes[0]].inputs[0]];
  return root;
}

// Whether each of the graph's first `params` values (its params) is read by no output except
// through work: an output that is a param, or views of one, would alias whatever buffer the
// param was bound to.
absl::InlinedVector<bool, 8> substitutable_params(const Schedule& schedule,
                                                  std::span<const ValueId> view_root,
                                                  size_t params) {
  absl::InlinedVector<bool, 8> substitutable(params, true);
  for (ValueId output : schedule.graph.outputs)
    if (static_cast<size_t>(view_root[output]) < params) substitutable[view_root[output]] = false;
  return substitutable;
}

// The one device a schedule computes on, when it moves nothing between devices.
std::optional<Device> single_compute_device(const Schedule& schedule) {
  std::optional<Device> device;
  for (const Step& step : schedule.steps) {
    if (step.kind == StepKind::View) continue;
    // A collective waits on other processes: never part of a replayed CUDA graph.
    if (step.kind == StepKind::Transfer || step.kind == StepKind::Collective ||
        (device && *device != step.device))
      return std::nullopt;
    device = step.device;
  }
  return device;
}

// The cache key's hash: a multiply per word, mixed once at the end. It never leaves the
// process, and a collision costs a miss (walk_matches confirms every hit).
class WordHash {
 public:
  void add(uint64_t x) { h_ = std::rotl((h_ ^ x) * 0x9E3779B97F4A7C15ull, 31); }
  void add(const Shape& shape) {
    add(shape.size());
    for (int64_t d : shape) add(static_cast<uint64_t>(d));
  }
  void add(const Device& device) {
    add(static_cast<uint64_t>(device.type()) << 32 | static_cast<uint32_t>(device.index()));
  }
  uint64_t value() const {
    uint64_t z = h_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t h_ = 0;
};

uint64_t hash_walk(const Walk& walk, std::span<const LazyRef> outputs, bool fusion,
                   HalfRounding rounding) {
  WordHash h;
  h.add(fusion);
  h.add(static_cast<uint64_t>(rounding));
  h.add(walk.params.size() << 32 | walk.pending.size());
  for (const LazyValue* value : walk.params) {
    h.add(static_cast<uint64_t>(value->node.dtype));
    h.add(value->node.shape);
    h.add(value->node.device);
  }
  for (const LazyValue* value : walk.pending) {
    const Node& node = value->node;
    h.add(static_cast<uint64_t>(node.op) << 8 | static_cast<uint64_t>(node.dtype));
    h.add(node.shape);
    h.add(node.device);
    h.add(reinterpret_cast<uintptr_t>(node.where.file));
    h.add(static_cast<uint64_t>(node.where.line) << 32 | node.where.column);
    if (!node.attrs.empty()) h.add(hash_attrs(node.attrs));
    for (const LazyRef& input : value->inputs) h.add(static_cast<uint64_t>(input->walk_index));
  }
  for (const LazyRef& output : outputs) h.add(static_cast<uint64_t>(output->walk_index));
  return h.value();
}

bool same_where(const SourceLoc& a, const SourceLoc& b) {
  return a.file == b.file && a.line == b.line && a.column == b.column;
}

bool walk_matches(const Walk& walk, std::span<const LazyRef> outputs, const Graph& graph) {
  if (graph.nodes.size() != walk.params.size() + walk.pending.size() ||
      graph.outputs.size() != outputs.size())
    return false;
  for (size_t i = 0; i < walk.params.size(); ++i) {
    const Node &node = graph.nodes[i], &param = walk.params[i]->node;
    if (node.dtype != param.dtype || node.shape != param.shape || node.device != param.device)
      return false;
  }
  for (size_t i = 0; i < walk.pending.size(); ++i) {
    const Node& node = graph.nodes[walk.params.size() + i];
    const LazyValue& value = *walk.pending[i];
    if (node.op != value.node.op || node.dtype != value.node.dtype ||
        node.shape != value.node.shape || node.device != value.node.device ||
        !same_where(node.where, value.node.where) || node.attrs != value.node.attrs ||
        node.inputs.size() != value.inputs.size())
      return false;
    for (size_t k = 0; k < node.inputs.size(); ++k)
      if (node.inputs[k] != value.inputs[k]->walk_index) return false;
  }
  for (size_t i = 0; i < outputs.size(); ++i)
    if (graph.outputs[i] != outputs[i]->walk_index) return false;
  return true;
}

// Never destroyed: what the backends keep for a schedule (CUDA graphs) goes with the process,
// not after the driver at exit.
auto& schedule_cache = *new absl::flat_hash_map<uint64_t, std::shared_ptr<CachedSchedule>>();
uint64_t schedule_cache_clock = 0;
size_t schedule_cache_nodes = 0;  // of the cached schedules' graphs together

// Caches `made` under `key`, first dropping the schedules used longest ago until it fits (a
// scan each: it runs only where the passes have just run, which cost far more).
void cache_schedule(uint64_t key, std::shared_ptr<CachedSchedule> made) {
  if (auto it = schedule_cache.find(key); it != schedule_cache.end()) {
    schedule_cache_nodes -= it->second->graph.nodes.size();
    schedule_cache.erase(it);
  }
  const size_t nodes = made->graph.nodes.size();
  while (!schedule_cache.empty() && (schedule_cache.size() >= kScheduleCacheEntries ||
                                     schedule_cache_nodes + nodes > kScheduleCacheNodes)) {
    const auto oldest = std::min_element(
        schedule_cache.begin(), schedule_cache.end(),
        [](const auto& a, const auto& b) { return a.second->last_used < b.second->last_used; });
    schedule_cache_nodes -= oldest->second->graph.nodes.size();
    schedule_cache.erase(oldest);
  }
  schedule_cache_nodes += nodes;
  schedule_cache.emplace(key, std::move(made));
}

}  // namespace

BuiltGraph build_graph(std::span<const LazyRef> outputs) {
  std::lock_guard lock(eval_mutex);
  return build_graph_locked(outputs);
}

namespace {
EvalStats stats;
}  // namespace

EvalStats eval_stats() {
  std::lock_guard lock(eval_mutex);
  return stats;
}
void reset_eval_stats() {
  std::lock_guard lock(eval_mutex);
  stats = EvalStats();
}

namespace {
std::atomic<HalfRounding>& half_rounding_setting() {
  static std::atomic<HalfRounding> rounding =
      env_config().half_rounding_at_stores ? HalfRounding::AtStores : HalfRounding::EachOp;
  return rounding;
}
}  // namespace

HalfRounding half_rounding() { return half_rounding_setting().load(std::memory_order_relaxed); }
void set_half_rounding(HalfRounding rounding) { half_rounding_setting().store(rounding); }

PipelineOptions evaluation_pipeline(const EvalOptions& options) {
  PipelineOptions pipeline;
  pipeline.fusion.enabled = options.fusion && env_config().fusion;
  pipeline.fusion.half_rounding = half_rounding();
  return pipeline;
}

std::string scheduled_ir(std::span<const LazyRef> outputs, const EvalOptions& options) {
  BuiltGraph built = build_graph(outputs);
  return print_schedule(run_pipeline(std::move(built.graph), evaluation_pipeline(options)));
}

void evaluate(std::span<const LazyRef> outputs, const EvalOptions& options) {
  // One evaluation at a time: values may be shared between graphs that threads evaluate.
  std::lock_guard lock(eval_mutex);
  absl::InlinedVector<LazyRef, 4> pending;
  for (const LazyRef& output : outputs)
    if (!output->computed() && !(is_view(output->node.op) && take_views_of_computed(output.get())))
      pending.push_back(output);
  if (pending.empty()) return;
  const EnvConfig& env = env_config();
  std::chrono::steady_clock::time_point started;
  if (env.debug >= 1) started = std::chrono::steady_clock::now();
  const Walk walk = [&] {
    ScopedHostPhase phase(HostPhase::Walk);
    return walk_pending(pending, /*take_views=*/true);
  }();
  const bool fusion = options.fusion && env.fusion;
  const HalfRounding rounding = half_rounding();
  const bool dumping = env.dump_ir || env.dump_fusion;
  const size_t num_nodes = walk.params.size() + walk.pending.size();
  const bool cacheable = !dumping && num_nodes <= kScheduleCacheNodes;
  std::shared_ptr<CachedSchedule> cached;
  uint64_t key = 0;
  if (cacheable) {
    ScopedHostPhase phase(HostPhase::Lookup);
    key = hash_walk(walk, pending, fusion, rounding);
    auto it = schedule_cache.find(key);
    if (it != schedule_cache.end() && it->second->half_rounding == rounding &&
        walk_matches(walk, pending, it->second->graph))
      cached = it->second;
  }
  if (cached == nullptr) {
    ScopedHostPhase phase(HostPhase::Passes);
    auto made = std::make_shared<CachedSchedule>();
    made->graph = walk_to_graph(walk, pending);
    made->half_rounding = rounding;
    PipelineOptions pipeline = evaluation_pipeline(options);
    if (env.dump_ir)
      pipeline.before_all = [](const std::string& ir) {
        std::cerr << "// IR before passes\n" << ir;
      };
    if (dumping) {
      pipeline.after_pass = [&env](std::string_view pass, const std::string& ir) {
        if (env.dump_ir || pass == "horizontal-fusion")
          std::cerr << "// IR after " << pass << "\n" << ir;
      };
    }
    made->schedule = run_pipeline(made->graph, pipeline);
    made->replay_device = single_compute_device(made->schedule);
    made->view_root = view_roots(made->schedule);
    made->param_substitutable =
        substitutable_params(made->schedule, made->view_root, walk.params.size());
    cached = made;
    if (cacheable) {
      cache_schedule(key, cached);
    } else {
      ++stats.schedule_cache_bypasses;
    }
  } else {
    ++stats.schedule_cache_hits;
  }
  cached->last_used = ++schedule_cache_clock;
  const Schedule& schedule = cached->schedule;

  ValueBuffers values(schedule.graph.nodes.size());
  const absl::InlinedVector<std::pair<ValueId, ValueId>, 8> in_place =
      cacheable ? outputs_written_in_place(walk, pending, cached->schedule.graph, cached.get())
                : absl::InlinedVector<std::pair<ValueId, ValueId>, 8>();
  const int64_t launches_before = launches_started();
  {
    ScopedHostPhase phase(HostPhase::Run);
    // A whole run from the params; a backend replaying runs may call it again after a try it
    // did not keep, so each call starts afresh.
    auto run = [&](std::span<const std::optional<BufferView>> substitutes) {
      for (std::optional<BufferView>& value : values) value.reset();
      for (size_t i = 0; i < walk.params.size(); ++i)
        values[i] =
            i < substitutes.size() && substitutes[i] ? *substitutes[i] : *walk.params[i]->buffer;
      // Bound before the run: the step computing each of these writes there.
      for (const auto& [output, param] : in_place) values[output] = *walk.params[param]->buffer;
      run_schedule(schedule, values, cacheable ? &cached->step_caches : nullptr);
    };
    if (cacheable && cached->replay_device) {
      absl::InlinedVector<const BufferView*, 8> params;
      for (const LazyValue* param : walk.params) params.push_back(&*param->buffer);
      backend_for(*cached->replay_device)
          .run_replayable(*cached->replay_device, &cached->replay, params,
                          cached->param_substitutable, run);
    } else {
      run({});
    }
    cached->ran = true;
  }
  const int64_t launches = launches_started() - launches_before;

  // Only now, with every result in hand, do values change: a failure above loses nothing.
  ScopedHostPhase finish(HostPhase::Finish);
  for (size_t i = 0; i < pending.size(); ++i) {
    ValueId id = schedule.graph.outputs[i];
    BufferView buffer = *values[id];
    pending[i]->buffer = std::move(buffer);
    pending[i]->strides = pending[i]->buffer->strides;
    pending[i]->inputs.clear();
    leave_census(*pending[i]);
  }
  rebase_pending_cut();
  ++stats.evaluations;
  stats.in_place_outputs += static_cast<int64_t>(in_place.size());
  stats.nodes += static_cast<int64_t>(schedule.graph.nodes.size());
  stats.kernels += schedule.num_kernels();
  stats.launches += launches;
  for (const Step& step : schedule.steps)
    stats.elementwise_kernels += step.kind == StepKind::Elementwise || step.kind == StepKind::Group;
  if (env.debug >= 1) {
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    std::cerr << "[lazyfuse] evaluated " << pending.size()
              << " value(s): " << schedule.graph.nodes.size() << " nodes, "
              << schedule.num_kernels() << " kernel(s) in " << launches << " launch(es), "
              << in_place.size() << " written in place, " << ms << " ms\n";
  }
}

}  // namespace lazyfuse
