// Building a graph from pending values, and evaluating it.
#include "runtime/lazy.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ir/errors.h"
#include "ir/passes/passes.h"
#include "runtime/env.h"
#include "runtime/executor.h"

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
  auto value = std::make_shared<LazyValue>();
  value->node.op = Op::Param;
  value->node.dtype = buffer.dtype;
  value->node.shape = buffer.shape;
  value->node.device = buffer.storage->device();
  value->node.where = where;
  value->strides = buffer.strides;
  value->buffer = std::move(buffer);
  return value;
}

LazyRef make_pending(Node node, std::vector<LazyRef> inputs, Strides strides) {
  auto value = std::make_shared<LazyValue>();
  value->pending_nodes = 1;
  std::lock_guard lock(eval_mutex);
  for (const LazyRef& input : inputs) {
    if (!input->computed())
      value->pending_nodes =
          std::min<int64_t>(value->pending_nodes + input->pending_nodes, 1 << 30);
  }
  value->node = std::move(node);
  value->inputs = std::move(inputs);
  value->strides = std::move(strides);
  return value;
}

BuiltGraph build_graph(std::span<const LazyRef> outputs) {
  BuiltGraph built;
  absl::flat_hash_map<const LazyValue*, ValueId> ids;
  // Post-order DFS without recursion (deep chains must not overflow the stack). Computed values
  // reached become the params, in order of first use; pending ones follow, inputs first.
  std::vector<LazyRef> order;
  std::vector<std::pair<LazyRef, bool>> stack;
  absl::flat_hash_map<const LazyValue*, bool> visited;
  for (auto it = outputs.rbegin(); it != outputs.rend(); ++it) stack.push_back({*it, false});
  while (!stack.empty()) {
    auto [value, expanded] = std::move(stack.back());
    stack.pop_back();
    if (expanded) {
      order.push_back(std::move(value));
      continue;
    }
    if (!visited.emplace(value.get(), true).second) continue;
    if (value->computed()) {
      built.params.push_back(value);
      continue;
    }
    stack.push_back({value, true});  // popped once every input above it is done
    for (auto it = value->inputs.rbegin(); it != value->inputs.rend(); ++it)
      if (!visited.contains(it->get())) stack.push_back({*it, false});
  }
  for (const LazyRef& param : built.params) {
    Node node = param->node;
    node.op = Op::Param;
    node.inputs.clear();
    node.attrs = Attrs();
    ids[param.get()] = built.graph.add(std::move(node));
  }
  for (const LazyRef& value : order) {
    Node node = value->node;
    node.inputs.clear();
    for (const LazyRef& input : value->inputs) node.inputs.push_back(ids.at(input.get()));
    ids[value.get()] = built.graph.add(std::move(node));
  }
  for (const LazyRef& output : outputs) built.graph.outputs.push_back(ids.at(output.get()));
  return built;
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

void evaluate(std::span<const LazyRef> outputs, const EvalOptions& options) {
  // One evaluation at a time: values may be shared between graphs that threads evaluate.
  std::lock_guard lock(eval_mutex);
  std::vector<LazyRef> pending;
  for (const LazyRef& output : outputs)
    if (!output->computed()) pending.push_back(output);
  if (pending.empty()) return;
  auto started = std::chrono::steady_clock::now();
  BuiltGraph built = build_graph(pending);
  const EnvConfig& env = env_config();
  PipelineOptions pipeline;
  pipeline.fusion.enabled = options.fusion && env.fusion;
  if (env.dump_ir)
    pipeline.before_all = [](const std::string& ir) { std::cerr << "// IR before passes\n" << ir; };
  if (env.dump_ir || env.dump_fusion) {
    pipeline.after_pass = [&env](std::string_view pass, const std::string& ir) {
      if (env.dump_ir || pass == "fusion") std::cerr << "// IR after " << pass << "\n" << ir;
    };
  }
  Schedule schedule = run_pipeline(built.graph, pipeline);

  std::vector<std::optional<BufferView>> values(schedule.graph.nodes.size());
  for (size_t i = 0; i < built.params.size(); ++i) values[i] = *built.params[i]->buffer;
  run_schedule(schedule, values);

  // Only now, with every result in hand, do values change: a failure above loses nothing.
  for (size_t i = 0; i < pending.size(); ++i) {
    ValueId id = schedule.graph.outputs[i];
    BufferView buffer = *values[id];
    pending[i]->buffer = std::move(buffer);
    pending[i]->strides = pending[i]->buffer->strides;
    pending[i]->inputs.clear();
    pending[i]->pending_nodes = 0;
  }
  ++stats.evaluations;
  stats.kernels += schedule.num_kernels();
  for (const Step& step : schedule.steps)
    stats.elementwise_kernels += step.kind == StepKind::Elementwise;
  if (env.debug >= 1) {
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    std::cerr << "[lazyfuse] evaluated " << pending.size()
              << " value(s): " << schedule.graph.nodes.size() << " nodes, "
              << schedule.num_kernels() << " kernel(s), " << ms << " ms\n";
  }
}

}  // namespace lazyfuse
