// lazyfuse codegen and lazyfuse compile: the source of each kernel of a graph, and its NVRTC
// compilation (no GPU needed).
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "lazyfuse/codegen/cpu/cpu_program.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/codegen/cuda/nvrtc.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/passes/passes.h"
#include "tools/commands.h"

namespace lazyfuse::tools {
namespace {

bool has_generated_kernel(const Step& step) {
  return step.kind == StepKind::Elementwise || is_reduction_kind(step.kind) ||
         step.kind == StepKind::Group || step.kind == StepKind::Attention;
}

// The CUDA sources of a step: one kernel, or an attention step's (its forward, or dq and dk
// with dv).
std::vector<CudaSource> cuda_sources(const Graph& graph, const Step& step) {
  if (step.kind != StepKind::Attention) return {cuda_source_for_fresh_operands(graph, step)};
  std::vector<CudaSource> sources;
  for (CudaAttentionKernel kernel : cuda_attention_kernels(graph, step))
    sources.push_back(generate_cuda_attention(cuda_attention_spec(graph, step), kernel));
  return sources;
}

}  // namespace

int codegen(const std::string& path, const std::string& target, bool with_prologue) {
  if (target != "cuda" && target != "cpu")
    throw Error("--target must be cuda or cpu, not '" + target + "'");
  Schedule schedule = run_pipeline(load_graph(path), {});
  for (const Step& step : schedule.steps) {
    if (!has_generated_kernel(step)) {
      std::cout << "// " << print_node(schedule.graph, step.nodes.back())
                << "  (no generated code)\n\n";
      continue;
    }
    if (target == "cuda") {
      for (const CudaSource& source : cuda_sources(schedule.graph, step)) {
        std::string text = source.source;
        if (!with_prologue) text = text.substr(cuda_prologue().size());
        std::cout << "// ----- " << source.kernel_name << " -----"
                  << (with_prologue ? "\n" : " (prologue left out: --with-prologue)\n") << text
                  << "\n";
      }
    } else if (step.kind == StepKind::Attention) {
      std::cout << "// " << print_node(schedule.graph, step.nodes.back())
                << "  (a library step on the CPU: runtime/cpu/cpu_attention.cc)\n\n";
    } else {
      std::cout << "// ----- " << step.kernel_name() << " (CPU block program) -----\n"
                << cpu_step_listing(schedule.graph, step) << "\n";
    }
  }
  return 0;
}

int compile(const std::string& path, const std::string& arch) {
  int major = 0, minor = 0;
  if (std::sscanf(arch.c_str(), "sm_%1d%1d", &major, &minor) != 2)
    throw Error("--arch must look like sm_90, not '" + arch + "'");
  if (!nvrtc_available()) throw UnsupportedError(nvrtc_unavailable_reason());
  Schedule schedule = run_pipeline(load_graph(path), {});
  std::cout << "NVRTC " << nvrtc_version() << ", " << arch << "\n";
  for (const Step& step : schedule.steps) {
    if (!has_generated_kernel(step)) continue;
    for (const CudaSource& source : cuda_sources(schedule.graph, step)) {
      CompiledKernel kernel = nvrtc_compile(source.source, source.kernel_name, major, minor);
      std::printf("%-40s %8.1f ms  %s %zu bytes\n", source.kernel_name.c_str(), kernel.compile_ms,
                  kernel.is_cubin ? "cubin" : "ptx", kernel.image.size());
    }
  }
  return 0;
}

}  // namespace lazyfuse::tools
