// Running a schedule across devices.
#include "lazyfuse/runtime/executor.h"
#include "lazyfuse/runtime/distributed/process_group.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cpu/cpu_program.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"

namespace lazyfuse {

// Note [Reshape of any layout]
// The frontend builds a reshape as a view where the strides it foresees for the operand allow
// one, and copies first where they do not (Tensor::reshape). The passes may lay a value out
// otherwise than foreseen: sink_views computes an elementwise chain in a view's shape, or a
// product in its transpose's. A graph must stay valid under every such rewrite, so a reshape
// means torch.reshape's value, whatever the operand's layout: a view of it where its strides
// allow one, else a view of a contiguous copy of it.
BufferView apply_view(const Node& node, const BufferView& input) {
  BufferView out = input;
  out.shape = node.shape;
  switch (node.op) {
    case Op::Reshape:
      if (!view_strides(input.shape, input.strides, node.shape, &out.strides)) {
        out = contiguous(input);
        out.shape = node.shape;
        out.strides = contiguous_strides(node.shape);
      }
      break;
    case Op::Permute: {
      const std::vector<int64_t>& dims = node.attrs.get_ints("dims");
      int64_t rank = static_cast<int64_t>(input.shape.size());
      for (size_t i = 0; i < dims.size(); ++i)
        out.strides[i] = input.strides[normalize_dim(dims[i], rank, "permute")];
      break;
    }
    case Op::Expand:
      out.strides = broadcast_strides(input.shape, input.strides, node.shape);
      break;
    case Op::Narrow: {
      int64_t dim = normalize_dim(node.attrs.get_int("dim"),
                                  static_cast<int64_t>(input.shape.size()), "narrow");
      out.offset += node.attrs.get_int("start") * input.strides[dim];
      break;
    }
    default:
      throw VerifierError(absl::StrCat(op_name(node.op), " is not a view"));
  }
  return out;
}

BufferView contiguous(const BufferView& source) {
  if (source.is_contiguous()) return source;
  return backend_for(source.storage->device()).contiguous(source);
}

BufferView copy_to_device(const BufferView& source, const Device& device) {
  if (source.storage->device() == device) return contiguous(source);
  BufferView out = allocate_buffer(device, source.dtype, source.shape);
  copy_into(source, out);
  return out;
}

void read_to_host(const BufferView& source, DType as, void* out) {
  // A GPU value is copied to host memory first, as PyTorch's printing does.
  const BufferView host = copy_to_device(source, Device::cpu());
  const CpuOperand operand =
      make_cpu_operand(host.data(), host.dtype, host.shape, host.strides, host.shape);
  cpu_gather(operand, as, 0, numel(host.shape), out);
}

BufferView host_buffer_from(const void* data, DType from, DType dtype, const Shape& shape) {
  BufferView buffer = allocate_buffer(Device::cpu(), dtype, shape);
  const int64_t count = numel(shape);
  cpu_gather(make_cpu_operand(data, from, {count}, {1}, {count}), dtype, 0, count, buffer.data());
  return buffer;
}

void copy_into(const BufferView& source, const BufferView& target) {
  const Device& from = source.storage->device();
  const Device& to = target.storage->device();
  if (source.dtype != target.dtype || numel(source.shape) != numel(target.shape) ||
      !target.is_contiguous())
    throw ShapeError(absl::StrCat("copy_into: ", shape_str(source.shape), " ",
                                  dtype_torch_name(source.dtype), " into a buffer of ",
                                  shape_str(target.shape), " ", dtype_torch_name(target.dtype),
                                  target.is_contiguous() ? "" : " (not contiguous)"));
  // Whichever side's backend can move the bytes does: a GPU's backend copies to and from the
  // host.
  Backend& target_backend = backend_for(to);
  Backend& copier = target_backend.can_copy(from, to) ? target_backend : backend_for(from);
  if (!copier.can_copy(from, to))
    throw UnsupportedError(absl::StrCat("no backend copies from ", from.str(), " to ", to.str()));
  // Transfers move dense bytes: make the source dense where it lives first.
  BufferView dense = contiguous(source);
  const size_t bytes = static_cast<size_t>(numel(source.shape) * dtype_size(source.dtype));
  if (bytes > 0) copier.copy(dense.data(), from, target.data(), to, bytes);
}

// Note [Overlapped collectives]
// A collective step of a CPU tensor whose next step does not read it starts on the process
// group's communication thread and the steps after it go on; a step that reads its value waits for
// it first, and so does the end of the schedule. order_steps puts each collective as early as its
// operand allows, so a data-parallel step's all-reduce of one bucket of gradients runs while the
// backward computes the next. The group runs collectives in the order started, which is the
// schedule's, the same on every process. A failure waits for every collective in flight before it
// leaves, so that none outlives the buffers of the evaluation.
namespace {

class CollectivesInFlight {
 public:
  ~CollectivesInFlight() {
    for (auto& [value, result] : pending_)
      if (result.valid()) result.wait();
  }
  void start(ValueId value, std::future<BufferView> result) {
    pending_.emplace_back(value, std::move(result));
  }
  // Waits for the collective computing `value`, if one is in flight, and stores its result.
  void settle(ValueId value, ValueBuffers& values) {
    for (auto& [v, result] : pending_)
      if (v == value && result.valid()) values[v] = result.get();
  }
  void settle_all(ValueBuffers& values) {
    for (auto& [v, result] : pending_)
      if (result.valid()) values[v] = result.get();
  }
  bool empty() const { return pending_.empty(); }

 private:
  std::vector<std::pair<ValueId, std::future<BufferView>>> pending_;
};

}  // namespace

void run_schedule(const Schedule& schedule, ValueBuffers& values,
                  std::vector<std::unique_ptr<StepCache>>* caches) {
  if (caches != nullptr && caches->size() != schedule.steps.size())
    caches->resize(schedule.steps.size());
  const Graph& graph = schedule.graph;
  // The last step that reads each value, so intermediates are freed early. (Inline: a small
  // graph evaluated in a loop should not touch the heap for its bookkeeping.)
  absl::InlinedVector<int, 32> last_reader(graph.nodes.size(), -1);
  for (size_t s = 0; s < schedule.steps.size(); ++s)
    for (ValueId v : schedule.steps[s].inputs) last_reader[v] = static_cast<int>(s);
  absl::InlinedVector<bool, 32> is_output(graph.nodes.size(), false);
  for (ValueId v : graph.outputs) is_output[v] = true;

  CollectivesInFlight in_flight;
  for (size_t s = 0; s < schedule.steps.size(); ++s) {
    const Step& step = schedule.steps[s];
    const Node& node = graph.nodes[step.nodes.back()];
    if (!in_flight.empty())
      for (ValueId v : step.inputs) in_flight.settle(v, values);
    if (step.kind == StepKind::View) {
      values[step.nodes[0]] = apply_view(node, *values[node.inputs[0]]);
    } else if (step.kind == StepKind::Transfer) {
      values[step.nodes[0]] = copy_to_device(*values[node.inputs[0]], node.device);
    } else if (step.kind == StepKind::Collective) {
      // In the background only when the next step has other work: handing a collective to the
      // communication thread and back costs more than it overlaps otherwise (docs/design.md,
      // "Distributed jobs").
      const bool next_reads_it =
          s + 1 == schedule.steps.size() ||
          std::find(schedule.steps[s + 1].inputs.begin(), schedule.steps[s + 1].inputs.end(),
                    step.nodes[0]) != schedule.steps[s + 1].inputs.end();
      in_flight.start(step.nodes[0],
                      start_collective_step(node, *values[node.inputs[0]], !next_reads_it));
    } else {
      backend_for(step.device)
          .run_step(graph, step, values, caches != nullptr ? &(*caches)[s] : nullptr);
    }
    for (ValueId v : step.inputs) {
      if (last_reader[v] == static_cast<int>(s) && !is_output[v] && graph.nodes[v].op != Op::Param)
        values[v].reset();
    }
  }
  in_flight.settle_all(values);
}

}  // namespace lazyfuse
