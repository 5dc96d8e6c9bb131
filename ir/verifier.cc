// Checks: SSA order, params first, arity, attributes, dtype and shape rules, and, after
// placement, that devices agree.
#include "lazyfuse/ir/verifier.h"

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/attention.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"

namespace lazyfuse {
namespace {

void require_attrs(const Node& node) {
  auto need = [&](std::string_view key) {
    if (!node.attrs.has(key))
      throw VerifierError(
          absl::StrCat(op_name(node.op), " needs the attribute '", std::string(key), "'"));
  };
  switch (node.op) {
    case Op::Const:
      need("value");
      break;
    case Op::Arange:
      need("start");
      need("step");
      break;
    case Op::Rand:
    case Op::Randn:
      need("seed");
      need("offset");
      break;
    case Op::Permute:
      need("dims");
      break;
    case Op::Narrow:
      need("dim");
      need("start");
      break;
    case Op::Attention:
    case Op::AttentionLse:
    case Op::AttentionGradQ:
    case Op::AttentionGradK:
    case Op::AttentionGradV:
      need("scale");
      if (node.attrs.has("dropout")) {
        need("seed");
        need("offset");
        const double p = node.attrs.get_float("dropout");
        if (!(p >= 0 && p < 1))
          throw VerifierError(
              absl::StrCat(op_name(node.op), ": dropout must be in [0, 1), is ", p));
      }
      break;
    case Op::Gather:
    case Op::ScatterAdd:
    case Op::Cat:
      need("dim");
      break;
    default:
      break;
  }
}

}  // namespace

void verify(const Graph& graph, const VerifyOptions& options) {
  int num_params = graph.num_params();
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    auto fail = [&](const std::string& why) {
      return VerifierError(absl::StrCat("%", i, " = ", op_name(node.op), " (made at ",
                                        node.where.str(), "): ", why));
    };
    if (node.op == Op::Param && static_cast<int>(i) >= num_params)
      throw fail("params must come before every other node");
    if (op_arity(node.op) == kVariadic ? node.inputs.empty()
                                       : static_cast<int>(node.inputs.size()) != op_arity(node.op))
      throw fail(absl::StrCat(
          "takes ", op_arity(node.op) == kVariadic ? "at least 1" : absl::StrCat(op_arity(node.op)),
          " operands, has ", node.inputs.size()));
    for (ValueId input : node.inputs) {
      if (input < 0 || input >= static_cast<ValueId>(i))
        throw fail(absl::StrCat("operand %", input, " is not defined before its use"));
    }
    // Shape rules multiply sizes (a reshape compares element counts), so a count past int64
    // must be an error here, before any rule computes it.
    for (int64_t d : node.shape)
      if (d < 0) throw fail("negative size in shape");
    if (checked_numel(node.shape) < 0)
      throw fail(absl::StrCat("the sizes of shape ", shape_str(node.shape),
                              " multiply past what an int64 holds", zeros_as_ones(node.shape)));
    std::vector<DType> input_dtypes;
    std::vector<const Shape*> input_shapes;
    for (ValueId input : node.inputs) {
      input_dtypes.push_back(graph.nodes[input].dtype);
      input_shapes.push_back(&graph.nodes[input].shape);
    }
    try {
      require_attrs(node);
      DType dtype = infer_result_dtype(node.op, input_dtypes, node.dtype);
      if (is_attention(node.op)) check_attention_operand_dtypes(node.op, node.attrs, input_dtypes);
      if (dtype != node.dtype)
        throw fail(absl::StrCat("result dtype should be ", dtype_ir_name(dtype), ", is ",
                                dtype_ir_name(node.dtype)));
      Shape shape = infer_shape(node.op, input_shapes, node.attrs, node.shape);
      if (shape != node.shape)
        throw fail(absl::StrCat("result shape should be ", shape_str(shape), ", is ",
                                shape_str(node.shape)));
    } catch (const VerifierError&) {
      throw;
    } catch (const Error& e) {
      throw fail(e.what());
    }
    // The host is one device; any other in the IR names which of its type.
    if (!node.device.is_cpu() && !node.device.has_index())
      throw fail(absl::StrCat("a ", device_type_name(node.device.type()),
                              " device in the IR must carry its index"));
    if (options.placed && node.op != Op::To) {
      for (ValueId input : node.inputs) {
        if (graph.nodes[input].device != node.device)
          throw fail(absl::StrCat("operand %", input, " is on ", graph.nodes[input].device.str(),
                                  ", the node on ", node.device.str()));
      }
    }
  }
  for (ValueId output : graph.outputs) {
    if (output < 0 || output >= static_cast<ValueId>(graph.nodes.size()))
      throw VerifierError(absl::StrCat("return names %", output, ", which is not defined"));
  }
}

}  // namespace lazyfuse
