// Compiling an elementwise step into a CPU program, and running it over blocks.
#include "lazyfuse/codegen/cpu/cpu_program.h"

#include <emmintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lazyfuse/codegen/cpu/cpu_jit.h"
#include "lazyfuse/codegen/kernel_plan.h"
#include "lazyfuse/codegen/philox.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {

CpuOperand make_cpu_operand(const void* data, DType dtype, const Shape& shape,
                            const Strides& strides, const Shape& space) {
  IterationSpace own = merge_dims(space, {broadcast_strides(shape, strides, space)});
  return CpuOperand{data, dtype, std::move(own.sizes), std::move(own.strides[0])};
}

namespace {

template <typename S, typename R>
void gather(const CpuOperand& operand, int64_t start, int64_t n, R* out) {
  // Nothing to read; a zero-size dim must not be divided by below.
  if (n <= 0) return;
  const S* base = static_cast<const S*>(operand.data);
  const int rank = static_cast<int>(operand.shape.size());
  if (rank == 0 || (rank == 1 && operand.strides[0] == 0)) {
    std::fill(out, out + n, convert_value<R>(base[0]));
    return;
  }
  if (rank == 1 && operand.strides[0] == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = convert_value<R>(base[start + i]);
    return;
  }
  StridedCursor cursor(operand.shape, operand.strides, start);
  const int64_t inner_stride = cursor.inner_stride();
  for (int64_t i = 0; i < n;) {
    const int64_t run = std::min(n - i, cursor.run_left());
    const S* at = base + cursor.offset();
    // The common runs as loops the compiler vectorizes: a value broadcast along the run (a row's
    // maximum over the row), and a dense run.
    if (inner_stride == 0) {
      std::fill_n(out + i, run, convert_value<R>(at[0]));
    } else if (inner_stride == 1) {
      for (int64_t j = 0; j < run; ++j) out[i + j] = convert_value<R>(at[j]);
    } else {
      for (int64_t j = 0; j < run; ++j) out[i + j] = convert_value<R>(at[j * inner_stride]);
    }
    i += run;
    cursor.advance(run);
  }
}

// Where elements [start, start + n) of `operand` lie in memory, when they lie in order one after
// another (a contiguous operand, or a block within one row of a dense inner dim, such as a bias
// broadcast over rows); null otherwise.
const std::byte* dense_block(const CpuOperand& operand, int64_t start, int64_t n) {
  const int rank = static_cast<int>(operand.shape.size());
  if (rank == 0 || operand.strides[rank - 1] != 1) return nullptr;
  if (rank == 1)  // the common case, without a division
    return static_cast<const std::byte*>(operand.data) +
           static_cast<size_t>(start) * dtype_size(operand.dtype);
  const int64_t row = operand.shape[rank - 1];
  if (start % row + n > row) return nullptr;
  int64_t offset = start % row;
  for (int64_t d = rank - 2, rest = start / row; d >= 0 && rest > 0; --d) {
    offset += rest % operand.shape[d] * operand.strides[d];
    rest /= operand.shape[d];
  }
  return static_cast<const std::byte*>(operand.data) +
         static_cast<size_t>(offset) * dtype_size(operand.dtype);
}

template <typename R, typename F>
void generate(int64_t start, int64_t n, R* out, F&& value_at) {
  for (int64_t i = 0; i < n; ++i) out[i] = convert_value<R>(value_at(start + i));
}

}  // namespace

void cpu_gather(const CpuOperand& operand, DType to, int64_t start, int64_t n, void* out) {
  dispatch_storage(operand.dtype, [&]<typename S>() {
    dispatch_storage(to,
                     [&]<typename R>() { gather<S, R>(operand, start, n, static_cast<R*>(out)); });
  });
}

// Note [The CPU JIT]
// A program the JIT can compile (jit_compilable) runs as one loop over vectors whose values stay
// in registers from op to op (codegen/cpu/cpu_jit.cc), rather than op by op over blocks in the L1
// cache. Its code depends on how each operand lies over the step's space, which the program
// learns only when it runs: dense, one value for all (a 0-d tensor), a run of a row read by
// every row (a bias, a norm's weight), or one value a row (a row's mean over its elements). So
// each layout gets its own compiled loop, found by a key of the layouts. Other layouts, the
// elements past the last whole vector and every program while the JIT has not compiled it run
// in the interpreter: its kernels and the JIT's op functions are the same source, so the bits
// do not depend on which ran.
struct CpuProgram::JitState {
  bool double_precision = false;
  bool half_types = false;            // a load or store converts to or from a half type
  std::atomic<int32_t> lanes{-1};     // the JIT's lanes for the dtype, -1 until asked
  std::atomic<int64_t> processed{0};  // elements computed, for CpuJitMode::Hot
  std::atomic<bool> hot{false};       // processed has passed one evaluation's worth
  // The compiled loop of each layout key (null where compiling failed: not tried again). Entries
  // are never removed or changed, so the one used last is read without the lock: ranges come
  // from every thread, as short as a row, and what both cores write on every call costs (a
  // shared run counter showed in a sum of squares' profile: docs/benchmarks.md, "The CPU JIT").
  struct Entry {
    std::vector<int64_t> key;
    CpuJitKernel compiled;
  };
  std::mutex mutex;
  std::vector<std::unique_ptr<const Entry>> kernels;
  // Note [Compiled or interpreted from memory]: -1 while measuring, else 1 for the compiled
  // loop, 0 for the interpreter; under the mutex, each path's runs and least time per element.
  std::atomic<int> from_memory{-1};
  int from_memory_runs[2] = {0, 0};
  double from_memory_best[2] = {0, 0};
  std::atomic<const Entry*> last{nullptr};

  JitState() = default;
  JitState(const JitState&) = delete;
  JitState& operator=(const JitState&) = delete;
  // The program is gone, and no one runs its loops: their code is freed (a process that
  // evaluates ever new shapes would otherwise keep every loop it ever compiled).
  ~JitState() {
    for (const auto& entry : kernels) cpu_jit_release(entry->compiled);
  }

  // A program of float32 or float64 registers whose every op has a vector form; a float32
  // program's operands and results may be half types (converted as loaded, rounded as stored),
  // its registers rounded to one and copied (so that a rounded reader leaves the others alone).
  static std::shared_ptr<JitState> for_program(const std::vector<Instr>& code) {
    std::optional<DType> dtype;
    bool half_types = false;
    for (const Instr& instr : code) {
      bool fits = false;
      DType registers = instr.dtype;
      switch (instr.kind) {
        case Kind::Load:
          fits =
              instr.from == instr.dtype || (is_half(instr.from) && instr.dtype == DType::Float32);
          break;
        case Kind::Store:
          registers = instr.from;
          fits =
              instr.from == instr.dtype || (is_half(instr.dtype) && instr.from == DType::Float32);
          break;
        case Kind::Convert:
          fits = instr.from == instr.dtype;  // a copy
          break;
        case Kind::Round:
          registers = DType::Float32;
          fits = is_half(instr.dtype);
          break;
        case Kind::Const:
          fits = true;
          break;
        case Kind::Apply:
          fits = instr.apply_stream != nullptr;  // the op has a vector form
          break;
        default:
          fits = false;
      }
      if (!fits || (registers != DType::Float32 && registers != DType::Float64)) return nullptr;
      if (dtype && *dtype != registers) return nullptr;
      dtype = registers;
      half_types |= (instr.kind == Kind::Load && is_half(instr.from)) ||
                    (instr.kind == Kind::Store && is_half(instr.dtype));
    }
    if (!dtype) return nullptr;
    // The state of an equal program that is still alive, else a new one (Note [Programs that
    // share their compiled loops]).
    const std::vector<int64_t> key = code_key(code);
    static std::mutex registry_mutex;
    static auto* registry = new absl::flat_hash_map<std::vector<int64_t>, std::weak_ptr<JitState>>;
    static size_t swept_at = 0;
    std::lock_guard<std::mutex> lock(registry_mutex);
    std::weak_ptr<JitState>& entry = (*registry)[key];
    if (std::shared_ptr<JitState> alive = entry.lock()) return alive;
    auto state = std::make_shared<JitState>();
    state->double_precision = *dtype == DType::Float64;
    state->half_types = half_types;
    entry = state;
    // The entries of programs gone, dropped once they could be half the registry.
    if (registry->size() >= 2 * swept_at + 64) {
      absl::erase_if(*registry, [](const auto& kept) { return kept.second.expired(); });
      swept_at = registry->size();
    }
    return state;
  }

  // Everything about a program's instructions that its compiled loops depend on.
  static std::vector<int64_t> code_key(const std::vector<Instr>& code) {
    std::vector<int64_t> key;
    key.reserve(code.size() * 20);
    for (const Instr& instr : code) {
      int64_t value_bits = 0, step_bits = 0;
      std::memcpy(&value_bits, &instr.value, sizeof(double));
      std::memcpy(&step_bits, &instr.step, sizeof(double));
      key.insert(key.end(), {static_cast<int64_t>(instr.kind),
                             instr.dst,
                             instr.src[0],
                             instr.src[1],
                             instr.src[2],
                             instr.slot,
                             static_cast<int64_t>(instr.dtype),
                             static_cast<int64_t>(instr.from),
                             static_cast<int64_t>(instr.op),
                             value_bits,
                             step_bits,
                             instr.period,
                             instr.int_value,
                             static_cast<int64_t>(instr.seed),
                             static_cast<int64_t>(instr.offset),
                             instr.bits,
                             instr.once,
                             instr.store_slot,
                             instr.stored_directly,
                             instr.read_only_by_store});
    }
    return key;
  }
};

// Note [Programs that share their compiled loops]
// A model repeats its programs: each layer's LayerNorm backward is the same code over buffers of
// its own, and a schedule built again (a new batch size) compiles the same steps. What the JIT
// keeps for a program (its compiled loop for each layout, and the work counted towards
// compiling it) belongs to its code, not to each copy: programs of equal instructions share one
// JitState while any of them lives. So the layers together earn one compile and all run the loop
// it made, where each copy used to interpret until it had done a compile's work on its own and
// then compile the same loop again.

// The step's nodes as instructions over virtual registers, one per value: each op reads its
// operands converted to its compute dtype, and half results are rounded where the step's
// policy says (Note [Half precision in fused kernels]).
class CpuProgram::Lowering {
 public:
  Lowering(const Graph& graph, const Step& step, std::vector<Instr>& code)
      : table_(cpu_kernel_table()), graph_(graph), step_(step), code_(code) {}

  // The compute dtype of each virtual register.
  const std::vector<DType>& register_types() const { return vtype_; }

  void load_inputs() {
    for (size_t k = 0; k < step_.inputs.size(); ++k) {
      const Node& input = graph_.nodes[step_.inputs[k]];
      Instr instr{Kind::Load};
      instr.slot = static_cast<int>(k);
      instr.from = input.dtype;
      instr.dtype = compute_dtype(input.dtype);
      instr.dst = new_vreg(instr.dtype);
      instr.text = absl::StrCat("load %", step_.inputs[k], " ", dtype_ir_name(input.dtype));
      code_.push_back(instr);
      reg_of_[step_.inputs[k]] = instr.dst;
    }
  }

  // Member `v`'s instructions, and its store where the step stores it.
  void lower(ValueId v) {
    const Node& node = graph_.nodes[v];
    int result = -1;
    switch (node.op) {
      case Op::Const:
      case Op::Arange:
      case Op::Rand:
      case Op::Randn:
        result = lower_generator(node);
        break;
      case Op::Copy:
        result = reg_of_.at(node.inputs[0]);
        break;
      case Op::Cast:
        result = lower_cast(node);
        break;
      default:
        result = lower_apply(node);
        break;
    }
    reg_of_[v] = result;
    auto out = std::find(step_.outputs.begin(), step_.outputs.end(), v);
    if (out != step_.outputs.end()) {
      Instr instr{Kind::Store};
      instr.src[0] = result;
      instr.slot = static_cast<int>(out - step_.outputs.begin());
      instr.from = vtype_[result];
      instr.dtype = node.dtype;
      instr.text = absl::StrCat("store %", v, " ", dtype_ir_name(node.dtype));
      code_.push_back(instr);
    }
  }

 private:
  int new_vreg(DType dtype) {
    vtype_.push_back(dtype);
    return static_cast<int>(vtype_.size() - 1);
  }

  // `fresh`: always a new register, even when no conversion is needed (for a result that is
  // then rounded in place, which must not touch the operand's register).
  int convert_to(int src, DType dtype, bool fresh = false) {
    if (vtype_[src] == dtype && !fresh) return src;
    Instr instr{Kind::Convert};
    instr.src[0] = src;
    instr.from = vtype_[src];
    instr.dtype = dtype;
    instr.dst = new_vreg(dtype);
    instr.convert = table_.convert[compute_slot(instr.from)][compute_slot(dtype)];
    instr.text = absl::StrCat("convert ", dtype_ir_name(instr.from), " -> ", dtype_ir_name(dtype));
    code_.push_back(instr);
    return instr.dst;
  }

  void round_if_half(int reg, DType dtype) {
    if (!is_half(dtype)) return;
    Instr instr{Kind::Round};
    instr.src[0] = reg;
    instr.dst = reg;
    instr.dtype = dtype;
    instr.text = absl::StrCat("round to ", dtype_ir_name(dtype));
    code_.push_back(instr);
  }

  // A half value kept in float32 (Note [Half precision in fused kernels]) as its dtype holds
  // it: a rounded copy, so the register's other readers keep the unrounded value.
  int as_stored(int reg, DType dtype) {
    if (!is_half(dtype)) return reg;
    const int copy = convert_to(reg, vtype_[reg], /*fresh=*/true);
    round_if_half(copy, dtype);
    return copy;
  }

  // A constant, arange or random generator: its values from the element index alone.
  int lower_generator(const Node& node) {
    const DType dtype = compute_dtype(node.dtype);
    Instr instr{node.op == Op::Const    ? Kind::Const
                : node.op == Op::Arange ? Kind::Arange
                : node.op == Op::Rand   ? Kind::Rand
                                        : Kind::Randn};
    instr.dtype = dtype;
    if (node.op == Op::Const) {
      instr.value = node.attrs.get_float("value");
      if (const auto* i = std::get_if<int64_t>(&node.attrs.get("value")))
        instr.int_value = *i;
      else
        instr.int_value = float_constant_as_integer(instr.value, dtype);
    } else if (node.op == Op::Arange) {
      instr.value = node.attrs.get_float("start");
      instr.step = node.attrs.get_float("step");
      if (node.attrs.has("period")) instr.period = node.attrs.get_int("period");
    } else {
      instr.seed = static_cast<uint64_t>(node.attrs.get_int("seed"));
      instr.bits = uniform_bits(node.dtype);
      instr.offset = static_cast<uint64_t>(node.attrs.get_int("offset"));
    }
    const int result = instr.dst = new_vreg(dtype);
    instr.text = absl::StrCat(op_name(node.op), " ", dtype_ir_name(dtype));
    code_.push_back(instr);
    round_if_half(result, node.dtype);
    return result;
  }

  // A cast to a half type rounds its register in place; other users of the operand (in the
  // same fused kernel) must keep reading the unrounded value. A half-type operand kept in
  // float32 is read as stored.
  int lower_cast(const Node& node) {
    const DType from = graph_.nodes[node.inputs[0]].dtype;
    int operand = reg_of_.at(node.inputs[0]);
    if (!step_.round_each_op) operand = as_stored(operand, from);
    const bool rounds = from != node.dtype && is_half(node.dtype);
    const int result = convert_to(operand, compute_dtype(node.dtype), rounds);
    if (rounds) round_if_half(result, node.dtype);
    return result;
  }

  // An elementwise op of the table, over its operands converted to the op's compute dtype.
  int lower_apply(const Node& node) {
    std::vector<DType> input_dtypes;
    for (ValueId in : node.inputs) input_dtypes.push_back(graph_.nodes[in].dtype);
    const DType operand_dtype = op_input_compute_dtype(node.op, input_dtypes, node.dtype);
    Instr instr{Kind::Apply};
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      int operand = reg_of_.at(node.inputs[k]);
      // A half value kept in float32 that this op reads into another dtype (a comparison, a
      // promotion) is read as stored.
      const DType in_dtype = graph_.nodes[node.inputs[k]].dtype;
      if (!step_.round_each_op && in_dtype != node.dtype) operand = as_stored(operand, in_dtype);
      instr.src[k] = convert_to(operand, operand_dtype);
    }
    instr.op = node.op;
    instr.apply = table_.apply[static_cast<int>(node.op)][compute_slot(operand_dtype)];
    instr.apply_stream =
        table_.apply_stream[static_cast<int>(node.op)][compute_slot(operand_dtype)];
    if (instr.apply == nullptr)
      throw DTypeError(absl::StrCat(op_name(node.op), " has no CPU kernel for ",
                                    dtype_torch_name(operand_dtype)));
    instr.dtype = op_dtype_rule(node.op) == DTypeRule::Compare ? DType::Bool : operand_dtype;
    const int applied = instr.dst = new_vreg(instr.dtype);
    instr.text = absl::StrCat(op_name(node.op), " ", dtype_ir_name(operand_dtype));
    code_.push_back(instr);
    const int result = convert_to(applied, compute_dtype(node.dtype));
    if (step_.round_each_op) round_if_half(result, node.dtype);  // else where stored or cast
    return result;
  }

  const CpuKernelTable& table_;
  const Graph& graph_;
  const Step& step_;
  std::vector<Instr>& code_;
  std::vector<DType> vtype_;
  absl::flat_hash_map<ValueId, int> reg_of_;
};

// Constants are the same in every block: computed once per run() into registers of their own.
std::vector<bool> CpuProgram::mark_constants(std::vector<Instr>& code, size_t virtual_registers) {
  std::vector<bool> constant(virtual_registers, false);
  for (Instr& instr : code) {
    if (instr.kind == Kind::Const || (instr.kind == Kind::Round && constant[instr.dst])) {
      instr.once = true;
      constant[instr.dst] = true;
    }
  }
  return constant;
}

// Virtual registers mapped to as few physical ones as their lifetimes allow; returns how many.
int CpuProgram::allocate_registers(std::vector<Instr>& code, const std::vector<bool>& constant) {
  const size_t virtual_registers = constant.size();
  std::vector<int> last_use(virtual_registers, -1);
  for (size_t i = 0; i < code.size(); ++i) {
    for (int s : code[i].src)
      if (s >= 0) last_use[s] = static_cast<int>(i);
    if (code[i].dst >= 0)
      last_use[code[i].dst] = std::max(last_use[code[i].dst], static_cast<int>(i));
  }
  for (size_t v = 0; v < virtual_registers; ++v)
    if (constant[v]) last_use[v] = static_cast<int>(code.size());  // never given back
  std::vector<int> physical(virtual_registers, -1);
  std::vector<int> free_list;
  int registers = 0;
  for (size_t i = 0; i < code.size(); ++i) {
    Instr& instr = code[i];
    const int virtual_dst = instr.dst;
    instr.read_only_by_store = virtual_dst >= 0 && last_use[virtual_dst] == static_cast<int>(i) + 1;
    int virtual_src[3] = {instr.src[0], instr.src[1], instr.src[2]};
    for (int& s : instr.src)
      if (s >= 0) s = physical[s];
    // The result takes a register before the operands give theirs back: a conversion between
    // types of different widths cannot run in place.
    if (virtual_dst >= 0) {
      if (physical[virtual_dst] < 0) {
        if (free_list.empty() || constant[virtual_dst]) {
          physical[virtual_dst] = registers++;
        } else {
          physical[virtual_dst] = free_list.back();
          free_list.pop_back();
        }
      }
      instr.dst = physical[virtual_dst];
    }
    for (int k = 0; k < 3; ++k) {
      int v = virtual_src[k];
      bool repeated = (k > 0 && virtual_src[0] == v) || (k > 1 && virtual_src[1] == v);
      if (v >= 0 && v != virtual_dst && !repeated && last_use[v] == static_cast<int>(i))
        free_list.push_back(physical[v]);
    }
    if (virtual_dst >= 0 && last_use[virtual_dst] == static_cast<int>(i))
      free_list.push_back(physical[virtual_dst]);
  }
  return registers;
}

// An op's result stored as computed, in its own type: written where it is stored.
void CpuProgram::store_where_computed(std::vector<Instr>& code) {
  for (size_t i = 1; i < code.size(); ++i) {
    Instr& store = code[i];
    Instr& producer = code[i - 1];
    if (store.kind == Kind::Store && store.from == store.dtype && !is_half(store.dtype) &&
        (producer.kind == Kind::Apply || producer.kind == Kind::Convert) &&
        producer.dst == store.src[0] && producer.dtype == store.dtype) {
      producer.store_slot = store.slot;
      store.stored_directly = true;
    }
  }
}

CpuProgram CpuProgram::compile(const Graph& graph, const Step& step) {
  CpuProgram program;
  program.numel_ = lazyfuse::numel(step.shape);
  Lowering lowering(graph, step, program.code_);
  lowering.load_inputs();
  for (ValueId v : step.nodes) lowering.lower(v);
  const std::vector<bool> constant =
      mark_constants(program.code_, lowering.register_types().size());
  program.num_registers_ = allocate_registers(program.code_, constant);
  store_where_computed(program.code_);
  program.jit_ = JitState::for_program(program.code_);
  return program;
}

int64_t CpuProgram::jit_lanes() const {
  if (jit_ == nullptr) return 0;
  int64_t lanes = jit_->lanes.load(std::memory_order_relaxed);
  if (lanes < 0) {
    lanes = cpu_jit_lanes(jit_->double_precision);  // every thread finds the same
    jit_->lanes.store(static_cast<int32_t>(lanes), std::memory_order_relaxed);
  }
  return std::max<int64_t>(lanes, 0);
}

bool CpuProgram::double_precision() const { return jit_ != nullptr && jit_->double_precision; }
bool CpuProgram::jit_keeps_half_types() const { return jit_ != nullptr && jit_->half_types; }

bool CpuProgram::jit_layouts(std::span<const CpuOperand> operands,
                             std::span<const CpuResult> results, int64_t lanes,
                             JitLayouts* layouts) const {
  if (jit_ == nullptr || lanes <= 0) return false;
  for (const Instr& instr : code_) {
    if (instr.kind == Kind::Load) {
      const CpuOperand& operand = operands[instr.slot];
      if (operand.dtype != instr.from) return false;
      const size_t rank = operand.shape.size();
      const bool scalar = std::all_of(operand.strides.begin(), operand.strides.end(),
                                      [](int64_t s) { return s == 0; });
      if (scalar) {
        layouts->push_back({kLfJitLoadScalar});
      } else if (rank == 1 && operand.strides[0] == 1) {
        layouts->push_back({kLfJitLoadDense});
      } else if (rank == 2 && operand.shape[1] % lanes == 0 &&
                 (operand.strides[1] == 0 ||
                  (operand.strides[0] == 0 && operand.strides[1] == 1))) {
        const bool value = operand.strides[1] == 0;
        layouts->push_back({value ? kLfJitLoadRowValue : kLfJitLoadRowRun, operand.shape[1],
                            value ? operand.strides[0] : 0});
      } else {
        return false;
      }
    } else if (instr.kind == Kind::Store) {
      // Streamed where the result is 64-byte aligned; run_bound checks each range's start.
      const CpuResult& result = results[instr.slot];
      const bool stream = result.stream && reinterpret_cast<uintptr_t>(result.data) % 64 == 0;
      layouts->push_back({stream ? kLfJitStoreStream : kLfJitStore});
    }
  }
  return true;
}

std::vector<LfJitInstr> CpuProgram::jit_instrs(std::span<const JitLayout> layouts,
                                               int32_t operand_base, int32_t result_base) const {
  std::vector<LfJitInstr> instrs;
  size_t at = 0;  // in layouts
  for (const Instr& instr : code_) {
    LfJitInstr out{};
    out.dst = instr.dst;
    std::copy(std::begin(instr.src), std::end(instr.src), std::begin(out.src));
    out.slot = instr.slot;
    switch (instr.kind) {
      case Kind::Load:
      case Kind::Store: {
        const JitLayout& layout = layouts[at++];
        out.kind = layout.kind;
        const DType memory = instr.kind == Kind::Load ? instr.from : instr.dtype;
        out.memory = memory == DType::BFloat16  ? kLfJitMemoryBFloat16
                     : memory == DType::Float16 ? kLfJitMemoryHalf
                                                : kLfJitMemoryAsRegisters;
        out.row = layout.row;
        out.row_stride = layout.row_stride;
        out.slot += instr.kind == Kind::Load ? operand_base : result_base;
        break;
      }
      case Kind::Const:
        out.kind = kLfJitConst;
        out.value = jit_->double_precision ? instr.value
                                           : static_cast<double>(convert_value<float>(instr.value));
        break;
      case Kind::Convert:  // a copy (JitState::for_program)
        out.kind = kLfJitApply;
        out.function = "lf_jit_copy_f32";
        break;
      case Kind::Round:  // in place, as the interpreter rounds
        out.kind = kLfJitApply;
        out.src[0] = instr.dst;
        out.function =
            instr.dtype == DType::Float16 ? "lf_jit_round_f16_f32" : "lf_jit_round_bf16_f32";
        break;
      default:  // Apply
        out.kind = kLfJitApply;
        out.function = cpu_jit_function(instr.op, jit_->double_precision);
    }
    instrs.push_back(out);
  }
  return instrs;
}

// A compiled loop reading at most kPrefetchedStreams operands densely asks, for each vector it
// loads, for the line kStreamPrefetchBytes on: the hardware's prefetchers do not cross a 4 KiB
// page, and a loop of one or two streams waited on memory where it could have asked sooner.
// With more streams (Adam's four) the requests slowed the loop, and 16 KiB measured no better
// than 8 (docs/benchmarks.md, "The CPU JIT").
constexpr int kPrefetchedStreams = 2;
constexpr int64_t kStreamPrefetchBytes = 8 * 1024;

CpuProgram::Bound CpuProgram::bind(std::span<const CpuOperand> operands,
                                   std::span<const CpuResult> results, int64_t elements) const {
  if (jit_ == nullptr) return {};
  const CpuJitMode mode = cpu_jit_mode();
  if (mode == CpuJitMode::Off) return {};
  JitState& state = *jit_;
  if (mode == CpuJitMode::Hot) {
    if (numel_ < kCpuJitMinElements) return {};
    // Compiled once the interpreter has computed one evaluation's elements and a compile's
    // worth (a compile took about as long as the interpreter spends on 4M elements of the
    // benchmark's programs): a large program from its second evaluation, one of 4096 elements
    // from its 1025th. Until then the interpreter is no slower than a compile would have been
    // in all (a ski rental's rule); compiled, programs of 1024 to 16384 elements ran faster
    // (docs/benchmarks.md, "The CPU JIT").
    if (!state.hot.load(std::memory_order_relaxed)) {
      if (state.processed.fetch_add(elements, std::memory_order_relaxed) <
          std::max(numel_, kCpuJitWorkElements))
        return {};
      state.hot.store(true, std::memory_order_relaxed);
    }
  }
  const int64_t lanes = jit_lanes();
  if (lanes <= 0) return {};
  for (const CpuResult& result : results)
    if (result.data == nullptr) return {};  // kept for a fused reduction: the interpreter's
  // The key: each load's layout and each store's streaming.
  JitLayouts layouts;
  if (!jit_layouts(operands, results, lanes, &layouts)) return {};
  absl::InlinedVector<int64_t, 36> key;  // three entries a layout
  bool reads_rows = false, streams = false;
  int dense_loads = 0;
  for (const JitLayout& layout : layouts) {
    dense_loads += layout.kind == kLfJitLoadDense;
    key.insert(key.end(), {layout.kind, layout.row, layout.row_stride});
    reads_rows |= layout.kind == kLfJitLoadRowRun || layout.kind == kLfJitLoadRowValue;
    streams |= layout.kind == kLfJitStoreStream;
  }
  LfJitKernel kernel = nullptr;
  {
    auto matches = [&](const JitState::Entry* entry) {
      return entry != nullptr &&
             std::equal(entry->key.begin(), entry->key.end(), key.begin(), key.end());
    };
    const JitState::Entry* last = state.last.load(std::memory_order_acquire);
    std::unique_lock<std::mutex> lock(state.mutex, std::defer_lock);
    if (!matches(last)) lock.lock();
    const JitState::Entry* found = matches(last) ? last : nullptr;
    for (size_t k = 0; found == nullptr && k < state.kernels.size(); ++k)
      if (matches(state.kernels[k].get())) found = state.kernels[k].get();
    if (found != nullptr) {
      kernel = found->compiled.kernel;
      if (found != last) state.last.store(found, std::memory_order_release);
    } else {
      const std::vector<LfJitInstr> instrs = jit_instrs(layouts, 0, 0);
      LfJitProgram program{};
      program.double_precision = state.double_precision ? 1 : 0;
      program.isa = cpu_jit_isa();
      program.num_registers = num_registers_;
      program.num_instrs = static_cast<int32_t>(instrs.size());
      program.instrs = instrs.data();
      program.prefetch_bytes = dense_loads <= kPrefetchedStreams ? kStreamPrefetchBytes : 0;
      const CpuJitKernel compiled = cpu_jit_compile(program);
      kernel = compiled.kernel;
      state.kernels.push_back(std::make_unique<const JitState::Entry>(
          JitState::Entry{std::vector<int64_t>(key.begin(), key.end()), compiled}));
      state.last.store(state.kernels.back().get(), std::memory_order_release);
    }
  }
  if (kernel == nullptr) return {};
  Bound bound;
  bound.kernel = kernel;
  bound.lanes = lanes;
  bound.reads_rows = reads_rows;
  bound.streams = streams;
  for (const CpuOperand& operand : operands) bound.operands.push_back(operand.data);
  return bound;
}

// Note [Compiled or interpreted from memory]
// A fused reduction whose operand is read from memory (worth_streaming) computes it a chunk at a
// time, either through the compiled loop (2048 elements into a buffer, then reduced) or the
// interpreter (256 elements in its registers, reduced where they lie). Which is faster depends on
// the machine: the sum of squares of 2^24 floats ran faster interpreted on the 2-core AMD EPYC
// machine and compiled on the 2-core Intel Xeon (docs/benchmarks.md, "The CPU JIT"). Both
// compute the same bits, so the program measures: its first runs from memory alternate, the
// interpreter first, and from the third of each on, the path with the least time per element
// runs. A run that asked for the compiled loop but was interpreted (the JIT not yet hot, or
// unavailable) counts as the interpreter's.
constexpr int kFromMemoryTrials = 3;

bool CpuProgram::compiled_from_memory_next() const {
  if (jit_ == nullptr) return false;
  const int decided = jit_->from_memory.load(std::memory_order_relaxed);
  if (decided >= 0) return decided == 1;
  std::lock_guard<std::mutex> lock(jit_->mutex);
  return jit_->from_memory_runs[1] < jit_->from_memory_runs[0];
}

void CpuProgram::record_from_memory(bool compiled, double seconds_per_element) const {
  if (jit_ == nullptr || jit_->from_memory.load(std::memory_order_relaxed) >= 0) return;
  std::lock_guard<std::mutex> lock(jit_->mutex);
  const int path = compiled ? 1 : 0;
  int& runs = jit_->from_memory_runs[path];
  double& best = jit_->from_memory_best[path];
  best = runs == 0 ? seconds_per_element : std::min(best, seconds_per_element);
  ++runs;
  if (jit_->from_memory_runs[0] >= kFromMemoryTrials &&
      jit_->from_memory_runs[1] >= kFromMemoryTrials)
    jit_->from_memory.store(jit_->from_memory_best[1] < jit_->from_memory_best[0] ? 1 : 0,
                            std::memory_order_relaxed);
}

int64_t CpuProgram::run_bound(const Bound& bound, std::span<const CpuResult> results, int64_t begin,
                              int64_t end, int64_t result_base) {
  const int64_t lanes = bound.lanes;
  if (bound.kernel == nullptr || end - begin < lanes) return begin;
  if ((bound.reads_rows && begin % lanes != 0) ||
      (bound.streams && (begin - result_base) % lanes != 0))
    return begin;
  // The kernel stores element i at index i of its result: each result's address of index 0.
  absl::InlinedVector<void*, 4> at_zero;
  for (const CpuResult& result : results)
    at_zero.push_back(reinterpret_cast<void*>(
        reinterpret_cast<uintptr_t>(result.data) -
        static_cast<uintptr_t>(result_base) * static_cast<uintptr_t>(dtype_size(result.dtype))));
  const int64_t whole_end = begin + (end - begin) / lanes * lanes;
  bound.kernel(bound.operands.data(), at_zero.data(), begin, whole_end);
  // Non-temporal stores are weakly ordered: make them visible before the caller goes on.
  if (bound.streams) _mm_sfence();
  count_cpu_jit_run();
  return whole_end;
}

void CpuProgram::clear_scratch(std::byte* scratch, int64_t elements) const {
  // Vectors are at most 64 bytes; 64 elements of 8 bytes round the block up past any of them.
  const int64_t reach = std::min(kCpuBlock, (std::max<int64_t>(elements, 1) + 63) / 64 * 64);
  const size_t bytes = std::min(kRegisterBytes, static_cast<size_t>(reach) * 8);
  for (int r = 0; r < num_registers_; ++r)
    std::fill_n(scratch + static_cast<size_t>(r) * kRegisterStride, bytes, std::byte{0});
}

const std::byte* CpuProgram::run(std::span<const CpuOperand> operands,
                                 std::span<const CpuResult> results, int64_t begin, int64_t end,
                                 std::byte* scratch, int64_t result_base) const {
  if (jit_ != nullptr) {
    // Fewer elements than a vector of any instruction set: nothing to compile for.
    if (end - begin >= kWholeVectorElements)
      begin = run_bound(bind(operands, results, end - begin), results, begin, end, result_base);
    if (begin == end) return nullptr;  // every result was stored: nothing is kept
  }
  auto reg = [&](int r) { return scratch + static_cast<size_t>(r) * kRegisterStride; };
  // Where each register's elements are read from: its scratch, or, for an operand stored
  // contiguously in the register's own type, the operand itself (no copy), or, for a result
  // written where it is stored, the result. Instructions write to scratch otherwise.
  absl::InlinedVector<const std::byte*, 16> view(static_cast<size_t>(num_registers_));
  auto wrote = [&](int r) { view[r] = reg(r); };
  const std::byte* kept = nullptr;  // result 0's elements, when it is not stored
  bool streamed = false;
  for (int64_t start = begin; start < end; start += kCpuBlock) {
    const int64_t n = std::min(kCpuBlock, end - start);
    // Vector kernels read whole vectors, the last one past n into a register's padding; an
    // operand read in place has none, so it is read in place only when no vector crosses n,
    // and a result is written in place only then.
    const bool whole_vectors = n % kWholeVectorElements == 0;
    // Where an op writes: its register, or the result it is stored in.
    auto destination = [&](const Instr& instr) -> std::byte* {
      if (instr.store_slot < 0 || !whole_vectors || results[instr.store_slot].data == nullptr)
        return reg(instr.dst);
      return static_cast<std::byte*>(results[instr.store_slot].data) +
             static_cast<size_t>(start - result_base) * dtype_size(instr.dtype);
    };
    for (const Instr& instr : code_) {
      // A constant's register keeps what the first block computed (the largest block: only the
      // last may be shorter).
      if (instr.once && start != begin) continue;
      switch (instr.kind) {
        case Kind::Load: {
          const CpuOperand& operand = operands[instr.slot];
          if (whole_vectors && instr.from == instr.dtype) {
            if (const std::byte* in_place = dense_block(operand, start, n)) {
              view[instr.dst] = in_place;
              break;
            }
          }
          dispatch_storage(instr.from, [&]<typename S>() {
            dispatch_compute(instr.dtype, [&]<typename R>() {
              gather<S, R>(operand, start, n, reinterpret_cast<R*>(reg(instr.dst)));
            });
          });
          wrote(instr.dst);
          break;
        }
        case Kind::Const:
          dispatch_compute(instr.dtype, [&]<typename R>() {
            R value = std::is_integral_v<R> && !std::is_same_v<R, bool>
                          ? static_cast<R>(instr.int_value)
                          : convert_value<R>(instr.value);
            std::fill_n(reinterpret_cast<R*>(reg(instr.dst)), n, value);
          });
          wrote(instr.dst);
          break;
        case Kind::Arange:
          dispatch_compute(instr.dtype, [&]<typename R>() {
            generate(start, n, reinterpret_cast<R*>(reg(instr.dst)), [&](int64_t i) {
              const int64_t count = instr.period > 0 ? i % instr.period : i;
              return instr.value + static_cast<double>(count) * instr.step;
            });
          });
          wrote(instr.dst);
          break;
        case Kind::Rand:
          dispatch_compute(instr.dtype, [&]<typename R>() {
            generate(start, n, reinterpret_cast<R*>(reg(instr.dst)), [&](int64_t i) {
              return philox_uniform(instr.offset + static_cast<uint64_t>(i), instr.seed,
                                    instr.bits);
            });
          });
          wrote(instr.dst);
          break;
        case Kind::Randn:
          dispatch_compute(instr.dtype, [&]<typename R>() {
            generate(start, n, reinterpret_cast<R*>(reg(instr.dst)), [&](int64_t i) {
              return philox_normal(instr.offset + static_cast<uint64_t>(i), instr.seed);
            });
          });
          wrote(instr.dst);
          break;
        case Kind::Apply: {
          const void* in[3] = {view[instr.src[0]], instr.src[1] >= 0 ? view[instr.src[1]] : nullptr,
                               instr.src[2] >= 0 ? view[instr.src[2]] : nullptr};
          std::byte* out = destination(instr);
          const bool stream = out != reg(instr.dst) && results[instr.store_slot].stream &&
                              instr.read_only_by_store && instr.apply_stream != nullptr &&
                              reinterpret_cast<uintptr_t>(out) % 64 == 0;
          (stream ? instr.apply_stream : instr.apply)(in, out, n);
          streamed |= stream;
          view[instr.dst] = out;
          break;
        }
        case Kind::Convert: {
          std::byte* out = destination(instr);
          instr.convert(view[instr.src[0]], out, n);
          view[instr.dst] = out;
          break;
        }
        case Kind::Round: {
          // In place, on a register an Apply, Convert or generator wrote: never an operand.
          float* values = reinterpret_cast<float*>(reg(instr.dst));
          if (instr.dtype == DType::Float16) {
            for (int64_t i = 0; i < n; ++i) values[i] = round_to_half(values[i]);
          } else {
            for (int64_t i = 0; i < n; ++i) values[i] = round_to_bfloat16(values[i]);
          }
          break;
        }
        case Kind::Store:
          if (results[instr.slot].data == nullptr) {
            if (instr.slot == 0) kept = view[instr.src[0]];
            break;
          }
          if (instr.stored_directly && whole_vectors) break;
          dispatch_storage(instr.dtype, [&]<typename S>() {
            dispatch_compute(instr.from, [&]<typename R>() {
              const R* src = reinterpret_cast<const R*>(view[instr.src[0]]);
              S* dst = static_cast<S*>(results[instr.slot].data) + (start - result_base);
              for (int64_t i = 0; i < n; ++i) dst[i] = convert_value<S>(src[i]);
            });
          });
          break;
      }
    }
  }
  // Non-temporal stores are weakly ordered: make them visible before the caller goes on.
  if (streamed) _mm_sfence();
  return kept;
}

std::string CpuProgram::listing() const {
  std::string out;
  for (const Instr& instr : code_) {
    std::vector<std::string> srcs;
    for (int s : instr.src)
      if (s >= 0) srcs.push_back(absl::StrCat("r", s));
    absl::StrAppend(&out, instr.dst >= 0 ? absl::StrCat("r", instr.dst, " = ") : "", instr.text,
                    srcs.empty() ? "" : " ", absl::StrJoin(srcs, ", "),
                    instr.once ? "  // once per call"
                    : instr.stored_directly
                        ? "  // by the op above where the block is whole vectors"
                        : "",
                    "\n");
  }
  return out;
}

std::string cpu_step_listing(const Graph& graph, const Step& step) {
  if (step.kind == StepKind::Elementwise) return CpuProgram::compile(graph, step).listing();
  if (step.kind == StepKind::Group) {
    std::string out;
    for (const Step& member : step.members)
      absl::StrAppend(&out, "// ", member.kernel_name(), "\n", cpu_step_listing(graph, member));
    return out;
  }
  if (!is_reduction_kind(step.kind))
    return "// (no CPU program: a library call, a view or a transfer)\n";
  std::string out;
  for (const Step& part : split_reduction_step(graph, step)) {
    if (part.kind == StepKind::Elementwise) {
      absl::StrAppend(&out, "// elementwise\n", CpuProgram::compile(graph, part).listing());
      continue;
    }
    const ValueId reduction = part.outputs[0];
    absl::StrAppend(&out, "// reduce: ", print_node(graph, reduction), "\n");
    if (part.nodes.size() == 1) continue;  // the library reduction of a stored value
    Step operand = part;
    operand.kind = StepKind::Elementwise;
    std::erase(operand.nodes, reduction);
    operand.roles.assign(operand.nodes.size(), Role::Work);
    operand.outputs = {graph.nodes[reduction].inputs[0]};
    out += CpuProgram::compile(graph, operand).listing();
  }
  return out;
}

}  // namespace lazyfuse
