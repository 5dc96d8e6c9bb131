// Activation checkpointing (frontend/checkpoint.h): the tape a checkpointed function's ops are
// recorded on, and its replay in backward.
//
// Note [Activation checkpointing]
// Inside a checkpointed function every op records its GradNode as usual, so backward walks the
// same nodes and applies the same rules; make_op also puts on the function's tape each op that
// needs a gradient, reads a value of the tape, or is a source (a dropout's draws, replayed from
// their seed and offset): its op, attributes and type, and where each operand comes from (an
// input of the function, an earlier entry, or outside: a parameter, or a value made inside from
// parameters alone). When the function returns its nodes drop their values: the tape keeps the
// inputs and the outside values, nothing made from the inputs. Those values are then read only
// by the forward's own kernels, and the executor frees each after its last reader
// (runtime/executor.cc), so a checkpointed block's activations do not live until backward.
// (Until the function returns the nodes keep their values, so the attention pattern, which walks
// the recorded graph, still sees a hand-written attention inside.)
//
// When backward first reaches a node of the tape, it replays the tape: each input through
// `after` (ir/ops.def), which reads one element of the gradient arriving there, then every entry
// over the replayed values, and the tape's rules read those. `after` makes the replayed values
// new values, which CSE cannot merge back into the forward's, and orders their kernels after
// that gradient, so the recomputation runs where backward needs it rather than beside the
// forward (steps run in the order their inputs allow, nearest the program's order). The replay
// runs with autocast off, since the tape holds the casts autocast made, and grad mode off: the
// rules read replayed values with the forward's edges, as they read saved ones.
#include "lazyfuse/frontend/checkpoint.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "lazyfuse/frontend/autocast.h"
#include "lazyfuse/frontend/autograd.h"
#include "lazyfuse/frontend/op_builder.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {

struct CheckpointTape : std::enable_shared_from_this<CheckpointTape> {
  // Where an entry's operand comes from.
  struct Source {
    enum Kind : uint8_t { Input, Entry, Outside } kind = Outside;
    int index = -1;   // the input's or the entry's
    LazyRef outside;  // the value itself, when it comes from outside
  };
  struct Entry {
    Op op = Op::Param;
    Attrs attrs;
    SourceLoc where;
    DType dtype = DType::Float32;
    Shape shape;
    Device device = Device::cpu();
    std::vector<Source> operands;
  };

  SourceLoc where;              // the checkpoint call
  std::vector<LazyRef> inputs;  // null for an undefined input
  std::vector<Entry> entries;
  // Its nodes not yet released by a backward; the tape frees what it keeps when none is left.
  int64_t unreleased = 0;
  bool released = false;

  // While the function runs: what each value seen so far is, the values themselves (so that no
  // address is reused while it is a key), and the nodes recorded.
  absl::flat_hash_map<const LazyValue*, Source> sources;
  std::vector<LazyRef> seen;
  std::vector<std::weak_ptr<GradNode>> nodes;

  Source source_of(const LazyRef& value) const {
    auto found = sources.find(value.get());
    if (found != sources.end()) return found->second;
    return {Source::Outside, -1, value};
  }
};

namespace {

thread_local CheckpointTape* recording = nullptr;

// Records on `tape` while it lives; then drops the values the tape's nodes held.
class Recording {
 public:
  explicit Recording(CheckpointTape& tape) : tape_(tape) { recording = &tape; }
  ~Recording() {
    recording = nullptr;
    for (const std::weak_ptr<GradNode>& weak : tape_.nodes) {
      if (std::shared_ptr<GradNode> node = weak.lock()) {
        for (SavedOperand& operand : node->operands) operand.value = nullptr;
        node->result = nullptr;
      }
    }
    tape_.nodes.clear();
    tape_.sources.clear();
    tape_.seen.clear();
  }
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;

 private:
  CheckpointTape& tape_;
};

// One element of `gradient` as a 0-d bool, through views only (an expanded gradient stays
// unmaterialized): what `after` reads.
Tensor ready_signal(const Tensor& gradient) {
  Tensor first = gradient;
  for (int64_t d = 0; d < first.dim(); ++d) first = first.narrow(d, 0, 1);
  first = first.reshape({});
  return first == first;
}

}  // namespace

namespace nn::utils {

std::vector<Tensor> checkpoint(
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& function,
    const std::vector<Tensor>& inputs, const Loc& where) {
  if (!GradMode::is_enabled() || recording != nullptr) return function(inputs);
  auto tape = std::make_shared<CheckpointTape>();
  tape->where = SourceLoc::from(where);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      tape->inputs.push_back(nullptr);
      continue;
    }
    const LazyRef& value = inputs[i].value();
    tape->inputs.push_back(value);
    tape->sources.try_emplace(value.get(), CheckpointTape::Source{CheckpointTape::Source::Input,
                                                                  static_cast<int>(i), nullptr});
  }
  Recording scope(*tape);
  return function(inputs);
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& function, const Tensor& input,
                  const Loc& where) {
  return checkpoint(
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{function(in[0])}; }, {input},
      where)[0];
}

}  // namespace nn::utils

namespace detail {

void record_on_tape(Op op, const Tensor& result, std::span<const Tensor> operands) {
  if (recording == nullptr) return;
  CheckpointTape& tape = *recording;
  const std::shared_ptr<AutogradMeta>& meta = result.impl()->autograd;
  GradNode* node = meta != nullptr ? meta->grad_fn.get() : nullptr;
  CheckpointTape::Entry entry;
  bool reads_the_tape = false;
  for (const Tensor& operand : operands) {
    entry.operands.push_back(tape.source_of(operand.value()));
    reads_the_tape |= entry.operands.back().kind != CheckpointTape::Source::Outside;
  }
  // What needs no gradient and reads no value of the tape (an op on parameters alone) stays
  // outside: kept, not replayed. A source made inside (a dropout's draws) is replayed.
  if (node == nullptr && !reads_the_tape && op_kind(op) != OpKind::Source) return;
  const Node& made = result.value()->node;
  entry.op = op;
  entry.attrs = made.attrs;
  entry.where = made.where;
  entry.dtype = made.dtype;
  entry.shape = made.shape;
  entry.device = made.device;
  const int index = static_cast<int>(tape.entries.size());
  tape.entries.push_back(std::move(entry));
  tape.sources[result.value().get()] = {CheckpointTape::Source::Entry, index, nullptr};
  tape.seen.push_back(result.value());
  if (node == nullptr) return;
  tape.nodes.push_back(meta->grad_fn);
  ++tape.unreleased;
  node->tape = tape.shared_from_this();
  node->tape_entry = index;
}

TapeReplay replay_tape(const CheckpointTape& tape, const Tensor& gradient) {
  if (tape.released)
    throw GradError(absl::StrCat(
        "Trying to backward through the graph a second time: the checkpointed function made at ",
        tape.where.str(),
        " was freed by the first backward. Specify retain_graph=True if you need to backward "
        "through the graph a second time."));
  NoGradGuard no_grad;
  AutocastGuard no_cpu_autocast(kCPU, std::nullopt, false);
  AutocastGuard no_cuda_autocast(kCUDA, std::nullopt, false);
  const Loc here = Loc::current();
  TapeReplay replay;
  const Tensor ready = gradient.numel() > 0 ? ready_signal(gradient) : Tensor();
  for (const LazyRef& input : tape.inputs) {
    // Every input of an empty gradient is read as it is (there is no element to wait for).
    if (input == nullptr || !ready.defined()) {
      replay.inputs.push_back(input);
      continue;
    }
    const Device device = input->node.device;
    const Tensor ready_there = ready.device() == device ? ready : ready.to(device);
    replay.inputs.push_back(make_op(Op::After, {Tensor(input), ready_there}, {}, here).value());
  }
  for (const CheckpointTape::Entry& entry : tape.entries) {
    std::vector<Tensor> operands;
    for (const CheckpointTape::Source& source : entry.operands) {
      switch (source.kind) {
        case CheckpointTape::Source::Input:
          operands.emplace_back(replay.inputs[source.index]);
          break;
        case CheckpointTape::Source::Entry:
          operands.emplace_back(replay.entries[source.index]);
          break;
        case CheckpointTape::Source::Outside:
          operands.emplace_back(source.outside);
          break;
      }
    }
    // A replayed input is dense where the forward's may have been a view, so a reshape the
    // forward took as a view may need a copy now: reshape() decides again.
    Tensor result = entry.op == Op::Reshape ? operands[0].reshape(entry.shape)
                                            : make_op(entry.op, operands, entry.attrs, here,
                                                      entry.shape, entry.dtype, entry.device);
    result.value()->node.where = entry.where;
    replay.entries.push_back(result.value());
  }
  return replay;
}

LazyRef replayed_operand(const GradNode& node, size_t i, const TapeReplay& replay) {
  const CheckpointTape::Source& source = node.tape->entries[node.tape_entry].operands[i];
  switch (source.kind) {
    case CheckpointTape::Source::Input:
      return replay.inputs[source.index];
    case CheckpointTape::Source::Entry:
      return replay.entries[source.index];
    case CheckpointTape::Source::Outside:
      break;
  }
  return source.outside;
}

LazyRef replayed_result(const GradNode& node, const TapeReplay& replay) {
  return replay.entries[node.tape_entry];
}

void release_tape(CheckpointTape& tape) {
  // Freed once every node is: a backward through one output of the function leaves the others'
  // replay possible. Never while the function runs (a backward inside it).
  if (--tape.unreleased > 0 || recording == &tape) return;
  tape.released = true;
  tape.inputs.clear();
  for (CheckpointTape::Entry& entry : tape.entries)
    for (CheckpointTape::Source& source : entry.operands) source.outside = nullptr;
}

}  // namespace detail
}  // namespace lazyfuse
