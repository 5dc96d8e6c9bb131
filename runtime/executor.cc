// Running a schedule across devices.
#include "lazyfuse/runtime/executor.h"
#include "lazyfuse/runtime/process_group.h"

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"

namespace lazyfuse {

BufferView apply_view(const Node& node, const BufferView& input) {
  BufferView out = input;
  out.shape = node.shape;
  switch (node.op) {
    case Op::Reshape:
      if (!view_strides(input.shape, input.strides, node.shape, &out.strides))
        throw ShapeError(absl::StrCat("reshape at ", node.where.str(),
                                      ": no view of the operand has shape ",
                                      shape_str(node.shape)));
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
  const Device& from = source.storage->device();
  if (from == device) return contiguous(source);
  // Whichever side's backend can move the bytes does: a GPU's backend copies to and from the
  // host.
  Backend& target = backend_for(device);
  Backend& copier = target.can_copy(from, device) ? target : backend_for(from);
  if (!copier.can_copy(from, device))
    throw UnsupportedError(
        absl::StrCat("no backend copies from ", from.str(), " to ", device.str()));
  // Transfers move dense bytes: make the source dense where it lives first.
  BufferView dense = contiguous(source);
  BufferView out = allocate_buffer(device, source.dtype, source.shape);
  const size_t bytes = static_cast<size_t>(numel(source.shape) * dtype_size(source.dtype));
  if (bytes > 0) copier.copy(dense.data(), from, out.data(), device, bytes);
  return out;
}

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

  for (size_t s = 0; s < schedule.steps.size(); ++s) {
    const Step& step = schedule.steps[s];
    const Node& node = graph.nodes[step.nodes.back()];
    if (step.kind == StepKind::View) {
      values[step.nodes[0]] = apply_view(node, *values[node.inputs[0]]);
    } else if (step.kind == StepKind::Transfer) {
      values[step.nodes[0]] = copy_to_device(*values[node.inputs[0]], node.device);
    } else if (step.kind == StepKind::Collective) {
      values[step.nodes[0]] = run_collective_step(node, *values[node.inputs[0]]);
    } else {
      backend_for(step.device)
          .run_step(graph, step, values, caches != nullptr ? &(*caches)[s] : nullptr);
    }
    for (ValueId v : step.inputs) {
      if (last_reader[v] == static_cast<int>(s) && !is_output[v] && graph.nodes[v].op != Op::Param)
        values[v].reset();
    }
  }
}

}  // namespace lazyfuse
