// Generating CUDA source for fused elementwise steps.
#include "lazyfuse/codegen/cuda/cuda_codegen.h"

#include <algorithm>
#include <bit>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "lazyfuse/codegen/cuda/cuda_emit.h"
#include "lazyfuse/codegen/dtype_dispatch.h"
#include "lazyfuse/codegen/gpu_dialect.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"
#include "lazyfuse/ir/stable_hash.h"

namespace lazyfuse {
namespace {

const char* storage_type(DType dtype) {
  switch (dtype) {
    case DType::Bool:
      return "bool";
    case DType::Int32:
      return "int32_t";
    case DType::Int64:
      return "int64_t";
    case DType::Float16:
      return "lf_f16";
    case DType::BFloat16:
      return "lf_bf16";
    case DType::Float32:
      return "float";
    case DType::Float64:
      return "double";
  }
  return "?";
}
const char* compute_type(DType dtype) { return storage_type(compute_dtype(dtype)); }

const char* cuda_expression(Op op) {
  switch (op) {
#define LF_ELEMENTWISE(Name, mnemonic, arity, dtype_rule, bool_ok, expression) \
  case Op::Name:                                                               \
    return #expression;
#include "lazyfuse/ir/ops.def"
    default:
      break;
  }
  throw VerifierError(absl::StrCat(op_name(op), " is not an elementwise op"));
}

// A literal of `dtype`'s compute type that reads back exactly.
std::string literal(const AttrValue& value, DType dtype) {
  DType compute = compute_dtype(dtype);
  double d = 0;
  if (const auto* i = std::get_if<int64_t>(&value)) {
    if (compute == DType::Int32 || compute == DType::Int64)
      return absl::StrCat("((", compute_type(dtype), ")", *i, "LL)");
    if (compute == DType::Bool) return *i ? "true" : "false";
    d = static_cast<double>(*i);
  } else if (const auto* b = std::get_if<bool>(&value)) {
    d = *b ? 1.0 : 0.0;
  } else if (const auto* f = std::get_if<double>(&value)) {
    d = *f;
  }
  switch (compute) {
    case DType::Bool:
      return d != 0 ? "true" : "false";
    case DType::Int32:
    case DType::Int64:
      return absl::StrCat("((", compute_type(dtype), ")", float_constant_as_integer(d, compute),
                          "LL)");
    case DType::Float32: {
      float f = static_cast<float>(d);
      if (f != f || f == std::numeric_limits<float>::infinity() ||
          f == -std::numeric_limits<float>::infinity())
        return absl::StrCat("__int_as_float(", static_cast<int32_t>(std::bit_cast<uint32_t>(f)),
                            ")");
      char buffer[64];
      std::snprintf(buffer, sizeof(buffer), "%af", static_cast<double>(f));
      return buffer;
    }
    default: {
      if (d != d || d == std::numeric_limits<double>::infinity() ||
          d == -std::numeric_limits<double>::infinity())
        return absl::StrCat("__longlong_as_double(",
                            static_cast<int64_t>(std::bit_cast<uint64_t>(d)), "LL)");
      char buffer[64];
      std::snprintf(buffer, sizeof(buffer), "%a", d);
      return buffer;
    }
  }
}

std::string hex_double(double d) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%a", d);
  return buffer;
}

}  // namespace

namespace cuda_emit {

const char* storage_type_name(DType dtype) { return storage_type(dtype); }

std::string emit_members(const Graph& graph, const std::vector<ValueId>& inputs,
                         const std::vector<ValueId>& nodes, const std::vector<std::string>& load,
                         const std::string& indent, bool round_each_op,
                         const Reciprocals& reciprocals) {
  const size_t num_inputs = inputs.size();
  std::string b;
  auto v = [](ValueId id) { return absl::StrCat("v", id); };
  auto rounded = [](const std::string& value, DType dtype) {
    return dtype == DType::Float16    ? absl::StrCat("lf_round_f16(", value, ")")
           : dtype == DType::BFloat16 ? absl::StrCat("lf_round_bf16(", value, ")")
                                      : value;
  };
  auto round = [&](ValueId id, DType dtype) {
    if (is_half(dtype)) absl::StrAppend(&b, indent, v(id), " = ", rounded(v(id), dtype), ";\n");
  };
  for (size_t k = 0; k < num_inputs; ++k) {
    const Node& node = graph.nodes[inputs[k]];
    absl::StrAppend(&b, indent, "const ", compute_type(node.dtype), " ", v(inputs[k]),
                    " = lf_load(", load[k], ");\n");
  }
  for (ValueId id : nodes) {
    const Node& node = graph.nodes[id];
    const char* type = compute_type(node.dtype);
    switch (node.op) {
      case Op::Const:
        absl::StrAppend(&b, indent, type, " ", v(id), " = ",
                        literal(node.attrs.get("value"), node.dtype), ";\n");
        break;
      case Op::Arange:
        absl::StrAppend(&b, indent, type, " ", v(id), " = (", type, ")(",
                        hex_double(node.attrs.get_float("start")), " + (double)",
                        node.attrs.has("period")
                            ? absl::StrCat("((long long)i % ", node.attrs.get_int("period"), "LL)")
                            : "i",
                        " * ", hex_double(node.attrs.get_float("step")), ");\n");
        break;
      case Op::Rand:
      case Op::Randn:
        absl::StrAppend(
            &b, indent, type, " ", v(id), " = (", type,
            ")lazyfuse::", node.op == Op::Rand ? "philox_uniform" : "philox_normal", "(",
            static_cast<uint64_t>(node.attrs.get_int("offset")), "ULL + (uint64_t)i, ",
            static_cast<uint64_t>(node.attrs.get_int("seed")), "ULL",
            node.op == Op::Rand ? absl::StrCat(", ", uniform_bits(node.dtype)) : "", ");\n");
        break;
      case Op::Copy:
        absl::StrAppend(&b, indent, type, " ", v(id), " = ", v(node.inputs[0]), ";\n");
        if (!round_each_op) continue;  // the operand's value, as the CPU's copy keeps it
        break;
      case Op::Cast: {
        const DType from = graph.nodes[node.inputs[0]].dtype;
        // A half-type value kept in float32 is read as its dtype holds it: what a cast of the
        // stored value would read.
        const std::string operand =
            round_each_op ? v(node.inputs[0]) : rounded(v(node.inputs[0]), from);
        if (is_floating(from) && is_integral(node.dtype))
          absl::StrAppend(&b, indent, type, " ", v(id), " = lf_float_to_int<", type, ">(", operand,
                          ");\n");
        else
          absl::StrAppend(&b, indent, type, " ", v(id), " = (", type, ")", operand, ";\n");
        if (from == node.dtype) continue;
        break;
      }
      default: {
        std::vector<DType> input_dtypes;
        for (ValueId in : node.inputs) input_dtypes.push_back(graph.nodes[in].dtype);
        const DType operand_dtype = op_input_compute_dtype(node.op, input_dtypes, node.dtype);
        // Note [Integer wrap-around]: signed overflow is undefined in C++ and NVRTC has no
        // -fwrapv (the CPU kernels are built with it), so the optimizer may assume it never
        // happens (x * x * x * x >= 0, and relu of it vanishes). Integer add, sub, mul and neg
        // compute on the unsigned type of the same width, which wraps as PyTorch's integers do;
        // the result converts back modulo 2^width.
        const bool wraps =
            (operand_dtype == DType::Int32 || operand_dtype == DType::Int64) &&
            (node.op == Op::Add || node.op == Op::Sub || node.op == Op::Mul || node.op == Op::Neg);
        const char* operand = wraps ? (operand_dtype == DType::Int32 ? "uint32_t" : "uint64_t")
                                    : storage_type(operand_dtype);
        const char* names[3] = {"a", "b", "c"};
        absl::StrAppend(&b, indent, type, " ", v(id), ";\n", indent, "{\n");
        for (size_t k = 0; k < node.inputs.size(); ++k) {
          // A half value kept in float32 that this op reads into another dtype (a comparison,
          // a promotion) is read as its dtype holds it.
          const DType in_dtype = graph.nodes[node.inputs[k]].dtype;
          const bool as_stored = !round_each_op && in_dtype != node.dtype;
          absl::StrAppend(&b, indent, "  const ", operand, " ", names[k], " = (", operand, ")",
                          as_stored ? rounded(v(node.inputs[k]), in_dtype) : v(node.inputs[k]),
                          ";\n");
        }
        // 1 / b is a correctly rounded reciprocal: the same bits as the division, in a third of
        // its instructions (the sigmoid-like chains that divide 1 by something).
        const Node& numerator = graph.nodes[node.inputs[0]];
        bool reciprocal =
            node.op == Op::Div && numerator.op == Op::Const &&
            (std::string_view(operand) == "float" || std::string_view(operand) == "double");
        if (reciprocal) {
          const AttrValue& value = numerator.attrs.get("value");
          const double* d = std::get_if<double>(&value);
          const int64_t* i = std::get_if<int64_t>(&value);
          reciprocal = (d != nullptr && *d == 1.0) || (i != nullptr && *i == 1);
        }
        std::string expression =
            reciprocal ? (std::string_view(operand) == "float" ? "__frcp_rn(b)" : "__drcp_rn(b)")
                       : cuda_expression(node.op);
        for (const auto& [division, name] : reciprocals)
          if (division == id) expression = absl::StrCat("a * ", name);
        absl::StrAppend(&b, indent, "  ", v(id), " = (", type, ")(", expression, ");  // ",
                        op_name(node.op), "\n", indent, "}\n");
        if (!round_each_op) continue;  // rounded where stored or cast
      }
    }
    round(id, node.dtype);
  }
  return b;
}

std::vector<std::string> strided_loads(const CudaElementwiseSpec& spec) {
  std::vector<std::string> load(spec.inputs.size());
  for (size_t k = 0; k < spec.inputs.size(); ++k) {
    switch (spec.inputs[k]) {
      case OperandAccess::Broadcast:
        load[k] = absl::StrCat("in", k, "[0]");
        break;
      case OperandAccess::Contiguous:
        load[k] = absl::StrCat("in", k, "[i]");
        break;
      case OperandAccess::Repeated:
        load[k] = absl::StrCat("in", k, "[i % (IDX)args.stride[", k, "][0]]");
        break;
      case OperandAccess::Strided: {
        std::string offset;
        for (int d = 0; d < spec.rank; ++d)
          absl::StrAppend(&offset, d ? " + " : "", "c", d, " * (IDX)args.stride[", k, "][", d, "]");
        load[k] = absl::StrCat("in", k, "[", offset, "]");
      }
    }
  }
  return load;
}

std::string emit_coordinates(int rank, const std::string& indent) {
  if (rank <= 1) return absl::StrCat(indent, "const IDX c0 = i;\n", indent, "(void)c0;\n");
  std::string s = absl::StrCat(indent, "IDX rest = i;\n");
  for (int d = rank - 1; d > 0; --d)
    absl::StrAppend(&s, indent, "const IDX c", d, " = rest % (IDX)args.size[", d, "];\n", indent,
                    "rest /= (IDX)args.size[", d, "];\n");
  absl::StrAppend(&s, indent, "const IDX c0 = rest;\n");
  return s;
}

std::string emit_input_pointers(const Graph& graph, const std::vector<ValueId>& inputs) {
  std::string s;
  for (size_t k = 0; k < inputs.size(); ++k)
    absl::StrAppend(&s, "  const ", storage_type(graph.nodes[inputs[k]].dtype), "* __restrict__ in",
                    k, " = (const ", storage_type(graph.nodes[inputs[k]].dtype), "*)args.in[", k,
                    "];\n");
  return s;
}

}  // namespace cuda_emit

using namespace cuda_emit;

std::string CudaElementwiseSpec::code() const {
  std::string access;
  for (OperandAccess a : inputs) access += "cbrs"[static_cast<int>(a)];
  return absl::StrCat(
      "r", rank, vectorized ? absl::StrCat("v", vector_width) : "", index64 ? "i64" : "",
      row_in_registers
          ? absl::StrCat("rr",
                         row_registers == kCudaRowRegisters ? "" : absl::StrCat(row_registers))
          : "",
      row_warps == 1 ? "" : absl::StrCat("w", row_warps), periods_are_rows ? "p" : "",
      access.empty() ? "" : "_", access);
}

CudaElementwiseLaunch plan_cuda_elementwise(const Step& step,
                                            const std::vector<OperandLayout>& inputs,
                                            std::span<const uint64_t> output_addresses,
                                            const std::vector<int64_t>& output_element_sizes) {
  CudaElementwiseLaunch launch;
  OperandStrides full;
  for (const OperandLayout& in : inputs)
    full.push_back(broadcast_strides(in.shape, in.strides, step.shape));
  IterationSpace merged = merge_dims(step.shape, full);
  launch.numel = merged.numel;
  Shape& sizes = merged.sizes;
  OperandStrides& strides = merged.strides;
  CudaElementwiseSpec& spec = launch.spec;
  std::vector<int64_t> periods(inputs.size(), 0);
  bool any_strided = false;
  int64_t max_offset = launch.numel;
  for (size_t k = 0; k < inputs.size(); ++k) {
    OperandAccess access = classify_access(sizes, strides[k], &periods[k]);
    // One element: an operand of the step's own shape reads it as it would read any other
    // number of elements, contiguously, not as a value broadcast; the kernel is the one of every
    // other size.
    if (access == OperandAccess::Broadcast && launch.numel == 1 && inputs[k].shape == step.shape)
      access = OperandAccess::Contiguous;
    any_strided |= access == OperandAccess::Strided;
    spec.inputs.push_back(access);
    int64_t reach = 0;
    for (size_t d = 0; d < sizes.size(); ++d) reach += (sizes[d] - 1) * strides[k][d];
    max_offset = std::max(max_offset, reach + 1);
  }
  // With a strided operand the kernel walks coordinates and the stride arguments are strides,
  // so a repeated operand is read through its strides too.
  if (any_strided) {
    for (OperandAccess& access : spec.inputs)
      if (access == OperandAccess::Repeated) access = OperandAccess::Strided;
  }
  spec.rank = any_strided ? static_cast<int>(sizes.size()) : 1;
  spec.index64 = max_offset >= (int64_t{1} << 31);
  // Several elements at a time, 16 bytes of the narrowest operand: every vector read lies in
  // one period of a repeated operand, and every vector access is aligned to its size.
  int64_t narrowest = 8;
  for (size_t k = 0; k < inputs.size(); ++k)
    if (spec.inputs[k] != OperandAccess::Broadcast)
      narrowest = std::min(narrowest, inputs[k].element_size);
  for (int64_t size : output_element_sizes) narrowest = std::min(narrowest, size);
  const int width = narrowest <= 2 ? 8 : 4;
  // However few the elements: the vectorized kernel's scalar loop takes what its vectors leave,
  // all of them when there are fewer than a vector, so a tensor of 1, 2 or 3 elements runs the
  // kernel that 10^6 do rather than compiling a variant of its own.
  bool aligned = !any_strided;
  for (size_t k = 0; aligned && k < inputs.size(); ++k) {
    if (spec.inputs[k] == OperandAccess::Repeated) aligned = periods[k] % width == 0;
    if (spec.inputs[k] != OperandAccess::Broadcast)
      aligned = aligned && inputs[k].address % (width * inputs[k].element_size) == 0;
  }
  for (size_t k = 0; aligned && k < output_addresses.size(); ++k)
    aligned = output_addresses[k] % (width * output_element_sizes[k]) == 0;
  spec.vectorized = aligned;
  spec.vector_width = width;
  if (!any_strided) {
    sizes = {launch.numel};
    for (size_t k = 0; k < inputs.size(); ++k) {
      const OperandAccess access = spec.inputs[k];
      strides[k] = {access == OperandAccess::Broadcast  ? 0
                    : access == OperandAccess::Repeated ? periods[k]
                                                        : 1};
    }
  }
  launch.sizes = std::move(sizes);
  launch.strides = std::move(strides);
  return launch;
}

std::string cuda_kernel_cache_key(const Step& step, const CudaElementwiseSpec& spec,
                                  bool fast_math) {
  return absl::StrCat(absl::Hex(step.kernel_key, absl::kZeroPad16), ".", spec.code(),
                      fast_math ? ".fast" : "");
}

namespace {

CudaElementwiseSpec spec_for_fresh_operands(const Graph& graph, const Step& step) {
  std::vector<OperandLayout> layouts;
  uint64_t address = 1 << 20;
  for (ValueId v : step.inputs) {
    const Node& node = graph.nodes[v];
    layouts.push_back(
        {address, dtype_size(node.dtype), node.shape, contiguous_strides(node.shape)});
    address += 1 << 20;
  }
  std::vector<uint64_t> outputs;
  std::vector<int64_t> sizes;
  for (ValueId v : step.outputs) {
    outputs.push_back(address += 1 << 20);
    sizes.push_back(dtype_size(graph.nodes[v].dtype));
  }
  if (!is_reduction_kind(step.kind))
    return plan_cuda_elementwise(step, layouts, outputs, sizes).spec;
  CudaElementwiseLaunch plan = plan_cuda_elementwise(step, layouts, {}, {});
  const ReductionParts parts = reduction_parts(step);
  const int64_t rows = numel(graph.nodes[parts.reduction].shape);
  const int64_t columns = rows == 0 ? 0 : plan.numel / rows;
  if (step.kind == StepKind::Row) {
    choose_cuda_row_layout(plan, columns, step.inputs.size(), /*outputs_aligned=*/true);
    return plan.spec;
  }
  if (is_column_row_step(step)) {
    choose_cuda_column_layout(plan);
    return plan.spec;
  }
  choose_cuda_fused_reduction_layout(plan, step.kind == StepKind::Column,
                                     cuda_reduction_order_shows(graph, step), columns,
                                     cuda_reduce_chunk(rows, columns));
  return plan.spec;
}

}  // namespace

CudaSource cuda_source_for_fresh_operands(const Graph& graph, const Step& step) {
  if (step.kind != StepKind::Group)
    return generate_cuda_step(graph, step, spec_for_fresh_operands(graph, step));
  // Fresh operands are contiguous: a reduction over trailing dims reads rows, any other one
  // reads columns where its kept dims lie after its reduced ones.
  std::vector<CudaGroupMember> members;
  for (const Step& member : step.members) {
    CudaGroupMember m{&member, {}, false};
    if (member.kind == StepKind::Elementwise || member.nodes.size() > 1) {
      m.spec = spec_for_fresh_operands(graph, member);
      // A group's reduction with fused work reads element by element (the runtime's run_group).
      if (is_reduction_kind(member.kind)) m.spec.vectorized = false;
    } else {
      const Node& node = graph.nodes[member.nodes.back()];
      const int64_t rank = static_cast<int64_t>(graph.nodes[node.inputs[0]].shape.size());
      const std::vector<int64_t> dims = reduction_dims(node.attrs, rank);
      m.columns = !dims.empty() && dims.back() != rank - 1;
    }
    members.push_back(m);
  }
  return generate_cuda_group(graph, members);
}

namespace {

// An elementwise step's struct of arguments and the statements of its body, which walk the
// step's space with the threads of blocks [block, block + blocks) of a grid as `block` and
// `blocks` name them: a kernel of its own passes blockIdx.x and gridDim.x, a group's member its
// share of the group's blocks.
struct ElementwiseParts {
  std::string declaration;  // "struct Args_<name> {...};"
  std::string body;
};

ElementwiseParts elementwise_parts(const Graph& graph, const Step& step,
                                   const CudaElementwiseSpec& spec, const std::string& name,
                                   const std::string& block, const std::string& blocks) {
  const int rank = spec.rank;
  const size_t num_inputs = step.inputs.size();
  ElementwiseParts parts;
  parts.declaration = elementwise_arg_layout(spec, static_cast<int>(num_inputs),
                                             static_cast<int>(step.outputs.size()))
                          .declare(absl::StrCat("Args_", name));
  std::string& s = parts.body;
  absl::StrAppend(&s, "  typedef ", spec.index64 ? "long long" : "unsigned int", " IDX;\n");
  s += emit_input_pointers(graph, step.inputs);
  for (size_t k = 0; k < step.outputs.size(); ++k)
    absl::StrAppend(&s, "  ", storage_type(graph.nodes[step.outputs[k]].dtype),
                    "* __restrict__ out", k, " = (",
                    storage_type(graph.nodes[step.outputs[k]].dtype), "*)args.out[", k, "];\n");
  absl::StrAppend(&s, "  const IDX n = (IDX)args.n;\n  const IDX tid = (IDX)", block,
                  " * blockDim.x + threadIdx.x;\n  const IDX step = (IDX)", blocks,
                  " * blockDim.x;\n");
  // The body for one element `i`, given how each input element is read and how each result is
  // written.
  auto body = [&](const std::vector<std::string>& load, const std::vector<std::string>& store,
                  const std::string& indent) {
    std::string b = emit_members(graph, step.inputs, step.nodes, load, indent, step.round_each_op);
    for (size_t k = 0; k < step.outputs.size(); ++k) {
      const Node& node = graph.nodes[step.outputs[k]];
      absl::StrAppend(&b, indent, store[k], " = lf_store<", storage_type(node.dtype), ">(v",
                      step.outputs[k], ");\n");
    }
    return b;
  };

  std::vector<std::string> load(num_inputs), store(step.outputs.size());
  std::string start = "tid";
  if (spec.vectorized) {
    for (size_t k = 0; k < num_inputs; ++k)
      load[k] = spec.inputs[k] == OperandAccess::Broadcast ? absl::StrCat("in", k, "[0]")
                                                           : absl::StrCat("x", k, ".v[l]");
    for (size_t k = 0; k < step.outputs.size(); ++k) store[k] = absl::StrCat("y", k, ".v[l]");
    const int width = spec.vector_width;
    absl::StrAppend(&s, "  const IDX nv = n / ", width,
                    ";\n  for (IDX v = tid; v < nv; v += step) {\n    const IDX i0 = v * ", width,
                    ";\n");
    for (size_t k = 0; k < num_inputs; ++k) {
      if (spec.inputs[k] == OperandAccess::Broadcast) continue;
      const char* type = storage_type(graph.nodes[step.inputs[k]].dtype);
      const std::string at = spec.inputs[k] == OperandAccess::Repeated
                                 ? absl::StrCat("i0 % (IDX)args.stride[", k, "][0]")
                                 : "i0";
      absl::StrAppend(&s, "    const lf_vec<", type, ", ", width, "> x", k, " = *(const lf_vec<",
                      type, ", ", width, ">*)(in", k, " + ", at, ");\n");
    }
    for (size_t k = 0; k < step.outputs.size(); ++k)
      absl::StrAppend(&s, "    lf_vec<", storage_type(graph.nodes[step.outputs[k]].dtype), ", ",
                      width, "> y", k, ";\n");
    absl::StrAppend(&s, "#pragma unroll\n    for (int l = 0; l < ", width,
                    "; ++l) {\n      const IDX i = i0 + l;\n      (void)i;\n");
    s += body(load, store, "      ");
    s += "    }\n";
    for (size_t k = 0; k < step.outputs.size(); ++k)
      absl::StrAppend(&s, "    *(lf_vec<", storage_type(graph.nodes[step.outputs[k]].dtype), ", ",
                      width, ">*)(out", k, " + i0) = y", k, ";\n");
    s += "  }\n";
    start = absl::StrCat("nv * ", width, " + tid");
  }
  // The scalar loop: everything in the strided variant, the tail in the vectorized one.
  load = strided_loads(spec);
  for (size_t k = 0; k < step.outputs.size(); ++k) store[k] = absl::StrCat("out", k, "[i]");
  absl::StrAppend(&s, "  for (IDX i = ", start, "; i < n; i += step) {\n");
  s += emit_coordinates(rank, "    ");
  s += body(load, store, "    ");
  s += "  }\n";
  return parts;
}

}  // namespace

CudaSource generate_cuda_elementwise(const Graph& graph, const Step& step,
                                     const CudaElementwiseSpec& spec, bool fast_math) {
  CudaSource out;
  out.kernel_name =
      absl::StrReplaceAll(absl::StrCat(step.kernel_name(), "_", spec.code()), {{".", "_"}});
  const ElementwiseParts parts =
      elementwise_parts(graph, step, spec, out.kernel_name, "blockIdx.x", "gridDim.x");
  std::string& s = out.source;
  if (fast_math) s += "#define LF_FAST_MATH 1\n";
  s += gpu_dialect().prologue();
  absl::StrAppend(&s, "\n// ", step.nodes.size(), " fused nodes\n", parts.declaration, "\n");
  absl::StrAppend(&s, gpu_dialect().kernel(out.kernel_name, 256), "(const Args_", out.kernel_name,
                  " args) {\n", parts.body, "}\n");
  return out;
}

std::string cuda_group_kernel_name(std::span<const std::string> member_keys) {
  StableHash h;
  for (const std::string& key : member_keys) h.add(key);
  return absl::StrFormat("g_%016x", h.value());
}

std::string cuda_group_member_key(const Graph& graph, const CudaGroupMember& member,
                                  bool fast_math) {
  const Step& step = *member.step;
  if (step.kind == StepKind::Elementwise || step.nodes.size() > 1)
    return cuda_kernel_cache_key(step, member.spec, fast_math);
  const Node& node = graph.nodes[step.nodes.back()];
  const DType in = graph.nodes[node.inputs[0]].dtype;
  const DType acc = step_accumulator(graph, step, node);
  return member.columns ? cuda_column_reduction_kernel_name(node.op, in, node.dtype, acc)
                        : cuda_reduction_kernel_name(node.op, in, node.dtype, acc);
}

CudaSource generate_cuda_group(const Graph& graph, std::span<const CudaGroupMember> members,
                               bool fast_math) {
  std::vector<std::string> keys;
  for (const CudaGroupMember& member : members)
    keys.push_back(cuda_group_member_key(graph, member, fast_math));
  CudaSource out;
  out.kernel_name = cuda_group_kernel_name(keys);
  std::string& s = out.source;
  if (fast_math) s += "#define LF_FAST_MATH 1\n";
  s += gpu_dialect().prologue();
  s += reduction_member_structs();
  // One function per distinct member kernel; members of one kernel call it with their own
  // arguments.
  std::vector<std::string> function_of(members.size()), args_of(members.size());
  std::vector<std::string> defined;
  for (size_t m = 0; m < members.size(); ++m) {
    const Step& step = *members[m].step;
    const bool elementwise = step.kind == StepKind::Elementwise;
    // A reduction with fused work: generated over its space like an elementwise kernel.
    const bool fused = !elementwise && step.nodes.size() > 1;
    const std::string name = absl::StrReplaceAll(
        elementwise || fused ? absl::StrCat(step.kernel_name(), "_", members[m].spec.code())
                             : keys[m],
        {{".", "_"}});
    function_of[m] = name;
    args_of[m] = elementwise || fused ? absl::StrCat("Args_", name)
                 : members[m].columns ? "ColumnReduceArgs"
                                      : "ReduceArgs";
    if (std::find(defined.begin(), defined.end(), name) != defined.end()) continue;
    defined.push_back(name);
    if (fused) {
      s += fused_reduction_member_function(graph, step, members[m].spec, name);
      continue;
    }
    if (!elementwise) {
      const Node& node = graph.nodes[step.nodes.back()];
      absl::StrAppend(
          &s, "\n",
          reduction_member_function(node.op, graph.nodes[node.inputs[0]].dtype, node.dtype,
                                    step_accumulator(graph, step, node), members[m].columns, name));
      continue;
    }
    const ElementwiseParts parts =
        elementwise_parts(graph, step, members[m].spec, name, "block", "blocks");
    absl::StrAppend(&s, "\n// ", step.nodes.size(), " fused nodes\n", parts.declaration, "static ",
                    gpu_dialect().device_function(), " void ", name, "(const ", args_of[m],
                    "& args, unsigned int block, unsigned int blocks) {\n", parts.body, "}\n");
  }
  absl::StrAppend(&s, "\nstruct Args_", out.kernel_name, " {\n");
  for (size_t m = 0; m < members.size(); ++m) absl::StrAppend(&s, "  ", args_of[m], " m", m, ";\n");
  absl::StrAppend(&s, "  long long start[", members.size() + 1, "];\n};\n\n");
  absl::StrAppend(&s, gpu_dialect().kernel(out.kernel_name, 256), "(const Args_", out.kernel_name,
                  " args) {\n", "  const unsigned int b = blockIdx.x;\n");
  for (size_t m = 0; m < members.size(); ++m)
    absl::StrAppend(&s, "  ", m ? "else " : "", "if (b < (unsigned int)args.start[", m + 1, "]) ",
                    function_of[m], "(args.m", m, ", b - (unsigned int)args.start[", m,
                    "], (unsigned int)(args.start[", m + 1, "] - args.start[", m, "]));\n");
  s += "}\n";
  return out;
}

}  // namespace lazyfuse
