// The pipeline fuzzer's property (ir_pipeline_check.h).
#include "tests/fuzz/ir_pipeline_check.h"

#include "lazyfuse/codegen/cpu/cpu_program.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/graph.h"
#include "lazyfuse/ir/passes/passes.h"
#include "tests/fuzz/ir_text_check.h"

namespace lazyfuse::fuzz {

std::string check_ir_pipeline(std::string_view text) {
  std::optional<Graph> parsed = parsed_and_verified(text);
  if (!parsed) return "";  // the IR text fuzzer's ground
  const Graph& graph = *parsed;
  Schedule schedule;
  try {
    schedule = run_pipeline(graph, {});
  } catch (const Error&) {
    return "";  // a typed rejection, such as operands on two devices
  }
  for (const Step& step : schedule.steps) {
    if (step.kind != StepKind::Elementwise && !is_reduction_kind(step.kind) &&
        step.kind != StepKind::Group)
      continue;
    try {
      const CudaSource source = cuda_source_for_fresh_operands(schedule.graph, step);
      if (source.kernel_name.empty() || source.source.find(source.kernel_name) == std::string::npos)
        return "a generated kernel does not define the name it is launched by: " +
               source.kernel_name;
    } catch (const Error&) {
    }
    try {
      cpu_step_listing(schedule.graph, step);
    } catch (const Error&) {
    }
  }
  return "";
}

}  // namespace lazyfuse::fuzz
