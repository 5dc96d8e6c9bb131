// Generated CUDA source: it compiles with NVRTC for sm_90 (no GPU needed), is deterministic,
// and is specialised on layout but not on sizes.
#include <gtest/gtest.h>

#include "codegen/cuda_codegen.h"
#include "codegen/nvrtc.h"
#include "ir/passes/passes.h"

namespace lazyfuse {
namespace {

Schedule lower(const std::string& text) { return run_pipeline(parse_graph(text), {}); }

std::vector<OperandLayout> contiguous_layouts(const Schedule& schedule, const Step& step) {
  std::vector<OperandLayout> layouts;
  for (ValueId v : step.inputs) {
    const Node& node = schedule.graph.nodes[v];
    layouts.push_back({4096, dtype_size(node.dtype), node.shape, contiguous_strides(node.shape)});
  }
  return layouts;
}

CudaSource generate_first(const Schedule& schedule, const std::vector<OperandLayout>& layouts) {
  const Step& step = schedule.steps.at(0);
  std::vector<uint64_t> outputs(step.outputs.size(), 8192);
  std::vector<int64_t> sizes;
  for (ValueId v : step.outputs) sizes.push_back(dtype_size(schedule.graph.nodes[v].dtype));
  CudaElementwiseLaunch launch = plan_cuda_elementwise(step, layouts, outputs, sizes);
  return generate_cuda_elementwise(schedule.graph, step, launch.spec);
}

const char* kSeed = R"(graph @main(%0: f32[1000] @cuda:0, %1: f32[1000] @cuda:0) {
  %2 = const {value = 2.0} : f32[] @cuda:0
  %3 = add %0, %2 : f32[1000] @cuda:0
  %4 = exp %3 : f32[1000] @cuda:0
  %5 = mul %4, %1 : f32[1000] @cuda:0
  return %5
})";

TEST(CudaCodegen, SeedCompilesWithNvrtc) {
  if (!nvrtc_available()) GTEST_SKIP() << nvrtc_unavailable_reason();
  Schedule schedule = lower(kSeed);
  CudaSource source = generate_first(schedule, contiguous_layouts(schedule, schedule.steps[0]));
  EXPECT_NE(source.source.find("lf_exp"), std::string::npos);
  EXPECT_NE(source.kernel_name.find("v4"), std::string::npos) << "aligned contiguous: vector path";
  CompiledKernel kernel = nvrtc_compile(source.source, source.kernel_name, 9, 0);
  EXPECT_TRUE(kernel.is_cubin);
  EXPECT_GT(kernel.image.size(), 0u);
}

}  // namespace
}  // namespace lazyfuse
