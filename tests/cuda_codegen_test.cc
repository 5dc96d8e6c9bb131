// Generated CUDA source: it compiles with NVRTC for sm_90 (no GPU needed), is deterministic,
// and is specialised on layout but not on sizes.
#include <gtest/gtest.h>

#include <bit>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/codegen/cuda/nvrtc.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/lazyfuse.h"

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

// Softmax over rows of 1024 from primitive ops: one row step.
const char* kSoftmax = R"(graph @softmax(%0: f32[8,1024] @cuda:0) {
  %1 = max %0 {dims = [1], keepdim = true} : f32[8,1] @cuda:0
  %2 = sub %0, %1 : f32[8,1024] @cuda:0
  %3 = exp %2 : f32[8,1024] @cuda:0
  %4 = sum %3 {dims = [1], keepdim = true} : f32[8,1] @cuda:0
  %5 = div %3, %4 : f32[8,1024] @cuda:0
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

namespace lazyfuse {
namespace {

// Every step of a lowered graph as CUDA source, with operand layouts chosen by `strided`.
// The variant each step gets for operands at one address, contiguous or reversed.
CudaElementwiseLaunch plan_step(const Schedule& schedule, const Step& step, bool strided) {
  std::vector<OperandLayout> layouts;
  for (ValueId v : step.inputs) {
    const Node& node = schedule.graph.nodes[v];
    Strides strides = contiguous_strides(node.shape);
    if (strided) std::reverse(strides.begin(), strides.end());
    layouts.push_back({4096, dtype_size(node.dtype), node.shape, strides});
  }
  std::vector<uint64_t> outputs(step.outputs.size(), 8192);
  std::vector<int64_t> sizes(step.outputs.size(), 8);
  return plan_cuda_elementwise(step, layouts, outputs, sizes);
}

std::vector<CudaSource> generate_all(const Schedule& schedule, bool strided) {
  std::vector<CudaSource> sources;
  for (const Step& step : schedule.steps) {
    if (step.kind == StepKind::Group) {
      // Each member as a kernel of its own (a launch that holds one), and all in one; a
      // reduction member by rows and by columns.
      std::vector<CudaGroupMember> members;
      for (const Step& member : step.members) {
        CudaGroupMember m{&member, plan_step(schedule, member, strided).spec, strided};
        if (member.kind == StepKind::Elementwise)
          sources.push_back(generate_cuda_elementwise(schedule.graph, member, m.spec));
        members.push_back(m);
      }
      sources.push_back(generate_cuda_group(schedule.graph, members));
      continue;
    }
    if (step.kind != StepKind::Elementwise && !is_reduction_kind(step.kind)) continue;
    CudaElementwiseLaunch plan = plan_step(schedule, step, strided);
    const bool vectorized = plan.spec.vectorized;
    if (is_reduction_kind(step.kind)) plan.spec.vectorized = false;
    sources.push_back(generate_cuda_step(schedule.graph, step, plan.spec));
    // A reduction with fused work over rows also comes reading its operands in vectors.
    if (step.kind == StepKind::Reduction && vectorized && !reduction_parts(step).prologue.empty() &&
        plan.spec.rank == 1) {
      plan.spec.vectorized = true;
      sources.push_back(generate_cuda_step(schedule.graph, step, plan.spec));
      EXPECT_NE(sources.back().source.find("vector_end"), std::string::npos);
      plan.spec.vectorized = false;
    }
    // A row step also comes with its row held in registers, read one and four at a time.
    if (step.kind == StepKind::Row) {
      plan.spec.row_in_registers = true;
      sources.push_back(generate_cuda_step(schedule.graph, step, plan.spec));
      EXPECT_NE(sources.back().source.find("row0[t]"), std::string::npos);
      if (vectorized) {
        plan.spec.vectorized = true;
        sources.push_back(generate_cuda_step(schedule.graph, step, plan.spec));
        EXPECT_NE(sources.back().source.find("lf_vec<"), std::string::npos);
      }
    }
  }
  return sources;
}

// Every op in every dtype it takes, as one graph per dtype, plus reductions fused with their
// producers: everything the GPU tests generate has a kernel of this shape.
std::string all_ops_graph(const char* t, const char* f) {
  return absl::StrCat(R"(graph @ops(%0: )", t, R"([64,33] @cuda:0, %1: )", t,
                      R"([33] @cuda:0, %2: bool[64,33] @cuda:0) {
  %3 = add %0, %1 : )",
                      t, R"([64,33] @cuda:0
  %4 = mul %3, %0 : )",
                      t, R"([64,33] @cuda:0
  %5 = exp %4 : )",
                      f, R"([64,33] @cuda:0
  %6 = log %5 : )",
                      f, R"([64,33] @cuda:0
  %7 = tanh %6 : )",
                      f, R"([64,33] @cuda:0
  %8 = sigmoid %7 : )",
                      f, R"([64,33] @cuda:0
  %9 = where %2, %8, %7 : )",
                      f, R"([64,33] @cuda:0
  %10 = maximum %9, %5 : )",
                      f, R"([64,33] @cuda:0
  %11 = lt %10, %6 : bool[64,33] @cuda:0
  %12 = cast %11 : )",
                      t, R"([64,33] @cuda:0
  %13 = abs %12 : )",
                      t, R"([64,33] @cuda:0
  %14 = sum %13 {dims = [1], keepdim = false} : )",
                      std::string_view(t) == "f32" || std::string_view(t) == "f64" ||
                              std::string_view(t) == "f16" || std::string_view(t) == "bf16"
                          ? t
                          : "i64",
                      R"([64] @cuda:0
  %15 = max %10 {dims = [0, 1], keepdim = false} : )",
                      f, R"([] @cuda:0
  %16 = rand {offset = 0, seed = 1} : )",
                      f, R"([64,33] @cuda:0
  %17 = randn {offset = 0, seed = 1} : )",
                      f, R"([64,33] @cuda:0
  %18 = arange {start = 0.0, step = 1.0} : )",
                      f, R"([33] @cuda:0
  %19 = add %16, %17 : )",
                      f, R"([64,33] @cuda:0
  %20 = add %19, %18 : )",
                      f, R"([64,33] @cuda:0
  %21 = sqrt %20 : )",
                      f, R"([64,33] @cuda:0
  %22 = pow %21, %5 : )",
                      f, R"([64,33] @cuda:0
  %23 = sin %22 : )",
                      f, R"([64,33] @cuda:0
  %24 = cos %23 : )",
                      f, R"([64,33] @cuda:0
  %25 = rsqrt %24 : )",
                      f, R"([64,33] @cuda:0
  %26 = clamp %25, %5, %6 : )",
                      f, R"([64,33] @cuda:0
  %27 = neg %26 : )",
                      f, R"([64,33] @cuda:0
  %28 = relu %27 : )",
                      f, R"([64,33] @cuda:0
  %29 = mean %28 {dims = [1], keepdim = true} : )",
                      f, R"([64,1] @cuda:0
  return %14, %15, %29, %10
})");
}

TEST(CudaCodegen, EveryKernelCompilesForSm90) {
  if (!nvrtc_available()) GTEST_SKIP() << nvrtc_unavailable_reason();
  std::vector<std::string> graphs = {kSeed, R"(graph @softmax(%0: f16[8,1024] @cuda:0) {
  %1 = max %0 {dims = [1], keepdim = true} : f16[8,1] @cuda:0
  %2 = sub %0, %1 : f16[8,1024] @cuda:0
  %3 = exp %2 : f16[8,1024] @cuda:0
  %4 = sum %3 {dims = [1], keepdim = true} : f16[8,1] @cuda:0
  %5 = div %3, %4 : f16[8,1024] @cuda:0
  return %5, %4
})"};
  for (auto [t, f] : std::vector<std::pair<const char*, const char*>>{{"f32", "f32"},
                                                                      {"f64", "f64"},
                                                                      {"f16", "f16"},
                                                                      {"bf16", "bf16"},
                                                                      {"i32", "f32"},
                                                                      {"i64", "f32"}})
    graphs.push_back(all_ops_graph(t, f));
  int compiled = 0;
  for (const std::string& text : graphs) {
    Schedule schedule = lower(text);
    for (bool strided : {false, true}) {
      for (const CudaSource& source : generate_all(schedule, strided)) {
        SCOPED_TRACE(source.kernel_name);
        CompiledKernel kernel = nvrtc_compile(source.source, source.kernel_name, 9, 0);
        EXPECT_TRUE(kernel.is_cubin);
        ++compiled;
      }
    }
  }
  EXPECT_GE(compiled, 20);
}

// A bias broadcast over rows is read at i % period, four at a time when the period allows;
// one transposed operand makes every operand strided.
TEST(CudaCodegen, RowBroadcastIsReadByPeriodNotByCoordinates) {
  auto plan = [](int64_t columns, bool transposed) {
    const std::string c = std::to_string(columns);
    Schedule schedule =
        lower("graph @bias(%0: f32[64," + c + "] @cuda:0, %1: f32[" + c +
              "] @cuda:0) {\n  %2 = add %0, %1 : f32[64," + c + "] @cuda:0\n  return %2\n}");
    const Step& step = schedule.steps.at(0);
    std::vector<OperandLayout> layouts = contiguous_layouts(schedule, step);
    if (transposed) layouts[0].strides = {1, 64};
    return std::make_pair(plan_cuda_elementwise(step, layouts, std::vector<uint64_t>{8192}, {4}),
                          schedule);
  };
  auto [rows32, schedule32] = plan(32, false);
  EXPECT_EQ(rows32.spec.code(), "r1v4_cr");
  EXPECT_EQ(rows32.strides.at(1), Strides{32});  // the period
  auto [rows33, schedule33] = plan(33, false);
  EXPECT_EQ(rows33.spec.code(), "r1_cr") << "a period of 33 cannot be read four at a time";
  auto [transposed, schedule_t] = plan(32, true);
  EXPECT_EQ(transposed.spec.code(), "r2_ss");
  if (!nvrtc_available()) GTEST_SKIP() << nvrtc_unavailable_reason();
  for (auto* p : {&rows32, &rows33}) {
    const Schedule& schedule = p == &rows32 ? schedule32 : schedule33;
    CudaSource source = generate_cuda_elementwise(schedule.graph, schedule.steps[0], p->spec);
    EXPECT_NE(source.source.find("% (IDX)args.stride[1][0]"), std::string::npos);
    EXPECT_TRUE(nvrtc_compile(source.source, source.kernel_name, 9, 0).is_cubin);
  }
}

// A thread moves 16 bytes of its narrowest operand: eight elements where one is 2 bytes (a
// bfloat16 result of float32 inputs too), four otherwise.
TEST(CudaCodegen, VectorWidthIsSixteenBytesOfTheNarrowestOperand) {
  auto plan = [](const std::string& in, const std::string& out) {
    Schedule schedule =
        lower("graph @g(%0: " + in + "[4096] @cuda:0, %1: " + in +
              "[4096] @cuda:0) {\n  %2 = mul %0, %1 : " + in +
              "[4096] @cuda:0\n  %3 = cast %2 : " + out + "[4096] @cuda:0\n  return %3\n}");
    const Step& step = schedule.steps.at(0);
    CudaElementwiseLaunch launch =
        plan_cuda_elementwise(step, contiguous_layouts(schedule, step), std::vector<uint64_t>{8192},
                              {dtype_size(schedule.graph.nodes[step.outputs[0]].dtype)});
    return std::make_pair(launch, schedule);
  };
  EXPECT_EQ(plan("f32", "f32").first.spec.code(), "r1v4_cc");
  EXPECT_EQ(plan("bf16", "bf16").first.spec.code(), "r1v8_cc");
  EXPECT_EQ(plan("f32", "bf16").first.spec.code(), "r1v8_cc");
  EXPECT_EQ(plan("f16", "f32").first.spec.code(), "r1v8_cc");
  if (!nvrtc_available()) GTEST_SKIP() << nvrtc_unavailable_reason();
  for (auto [in, out] :
       std::vector<std::pair<const char*, const char*>>{{"bf16", "bf16"}, {"f32", "bf16"}}) {
    auto [launch, schedule] = plan(in, out);
    CudaSource source = generate_cuda_elementwise(schedule.graph, schedule.steps[0], launch.spec);
    EXPECT_NE(source.source.find(", 8> x0 = *(const lf_vec<"), std::string::npos);
    EXPECT_TRUE(nvrtc_compile(source.source, source.kernel_name, 9, 0).is_cubin);
  }
}

// The attention kernels (codegen/cuda/cuda_attention.cc) compile for every dtype, head dims
// from 1 to 256, each modifier and each kernel; their tiles keep the shared arrays within what
// a block declares.
TEST(CudaCodegen, AttentionKernelsCompileForSm90) {
  std::vector<CudaAttentionSpec> specs;
  for (auto [dtype, e, ev] :
       std::vector<std::tuple<DType, int64_t, int64_t>>{{DType::Float32, 64, 64},
                                                        {DType::BFloat16, 128, 128},
                                                        {DType::Float16, 80, 48},
                                                        {DType::Float64, 256, 256},
                                                        {DType::Float32, 1, 3}}) {
    CudaAttentionSpec spec;
    spec.dtype = dtype;
    spec.head_dim = e;
    spec.value_dim = ev;
    spec.lead = e == 1 ? 1 : 3;
    spec.causal = dtype != DType::Float16;
    spec.mask = dtype == DType::Float16 || dtype == DType::Float64;
    spec.bias = dtype == DType::BFloat16 || dtype == DType::Float64;
    spec.softcap = dtype == DType::Float32;
    spec.dropout = dtype == DType::BFloat16 || e == 1;
    specs.push_back(spec);
    for (CudaAttentionKernel kernel :
         {CudaAttentionKernel::Forward, CudaAttentionKernel::QueryGradient,
          CudaAttentionKernel::KeyGradients}) {
      const int tile = cuda_attention_key_tile(spec, kernel);
      EXPECT_GE(tile, 1);
      EXPECT_LE(tile, 32);
    }
  }
  EXPECT_EQ(cuda_attention_key_tile(specs[0], CudaAttentionKernel::Forward), 32);
  if (!nvrtc_available()) GTEST_SKIP() << nvrtc_unavailable_reason();
  for (const CudaAttentionSpec& spec : specs)
    for (CudaAttentionKernel kernel :
         {CudaAttentionKernel::Forward, CudaAttentionKernel::QueryGradient,
          CudaAttentionKernel::KeyGradients, CudaAttentionKernel::Delta}) {
      const CudaSource source = generate_cuda_attention(spec, kernel);
      SCOPED_TRACE(source.kernel_name);
      EXPECT_TRUE(nvrtc_compile(source.source, source.kernel_name, 9, 0).is_cubin);
    }
}

// The kernels on tensor cores take float16 and bfloat16 head dims that are multiples of 16 up to
// 128, and compile for sm_80 and sm_90 with every score modifier; a block is four warps, 64 query
// rows (forward, dq) or keys (dk and dv), smaller tiles past head dims of 64.
TEST(CudaCodegen, TensorCoreAttentionCompilesForSm80AndSm90) {
  EXPECT_TRUE(cuda_attention_fits_tensor_cores(DType::BFloat16, 64, 64));
  EXPECT_TRUE(cuda_attention_fits_tensor_cores(DType::Float16, 128, 16));
  EXPECT_FALSE(cuda_attention_fits_tensor_cores(DType::Float32, 64, 64)) << "no TF32";
  EXPECT_FALSE(cuda_attention_fits_tensor_cores(DType::BFloat16, 72, 64));
  EXPECT_FALSE(cuda_attention_fits_tensor_cores(DType::BFloat16, 64, 256));
  std::vector<CudaAttentionSpec> specs;
  for (auto [dtype, e, ev] : std::vector<std::tuple<DType, int64_t, int64_t>>{
           {DType::BFloat16, 128, 128}, {DType::Float16, 64, 64}, {DType::BFloat16, 16, 32}}) {
    CudaAttentionSpec spec;
    spec.dtype = dtype;
    spec.head_dim = e;
    spec.value_dim = ev;
    spec.lead = e == 16 ? 1 : 2;
    spec.causal = e != 64;
    spec.mask = e == 64;
    spec.bias = e == 128;
    spec.softcap = e == 64;
    spec.dropout = e == 16;
    spec.tensor_cores = true;
    specs.push_back(spec);
  }
  for (CudaAttentionKernel kernel :
       {CudaAttentionKernel::Forward, CudaAttentionKernel::QueryGradient,
        CudaAttentionKernel::KeyGradients}) {
    EXPECT_EQ(cuda_attention_rows_per_block(specs[1], kernel), 64);
    EXPECT_EQ(cuda_attention_key_tile(specs[1], kernel), 64);
    EXPECT_EQ(cuda_attention_threads(specs[1], kernel), 128);
  }
  // The delta kernel the gradients read D_i from: a warp a row, whatever the kernels' tiles; one
  // text under one name, whatever the modifiers and head dim its name leaves out.
  EXPECT_EQ(cuda_attention_rows_per_block(specs[1], CudaAttentionKernel::Delta), 4);
  CudaAttentionSpec other = specs[1];
  other.head_dim = 32;
  other.causal = !other.causal;
  other.mask = !other.mask;
  other.softcap = !other.softcap;
  other.dropout = !other.dropout;
  other.tensor_cores = false;
  const CudaSource delta = generate_cuda_attention(specs[1], CudaAttentionKernel::Delta);
  const CudaSource other_delta = generate_cuda_attention(other, CudaAttentionKernel::Delta);
  EXPECT_EQ(other_delta.kernel_name, delta.kernel_name);
  EXPECT_EQ(other_delta.source, delta.source);
  EXPECT_EQ(cuda_attention_key_tile(specs[0], CudaAttentionKernel::QueryGradient), 32);
  EXPECT_EQ(cuda_attention_mma_query_tile(specs[0]), 16);
  EXPECT_EQ(cuda_attention_mma_query_tile(specs[1]), 64);
  if (!nvrtc_available()) GTEST_SKIP() << nvrtc_unavailable_reason();
  for (const CudaAttentionSpec& spec : specs)
    for (CudaAttentionKernel kernel :
         {CudaAttentionKernel::Forward, CudaAttentionKernel::QueryGradient,
          CudaAttentionKernel::KeyGradients}) {
      const CudaSource source = generate_cuda_attention(spec, kernel);
      SCOPED_TRACE(source.kernel_name);
      EXPECT_NE(source.kernel_name.find("_mma"), std::string::npos);
      EXPECT_NE(source.source.find("mma.sync.aligned.m16n8k16"), std::string::npos);
      EXPECT_TRUE(nvrtc_compile(source.source, source.kernel_name, 9, 0).is_cubin);
      // sm_80's mma, ldmatrix and cp.async are sm_90's: one kernel of each kind is enough there.
      if (&spec == &specs[0])
        EXPECT_TRUE(nvrtc_compile(source.source, source.kernel_name, 8, 0).is_cubin);
    }
}

// The attention kernels' words sit where their layout says.
TEST(CudaCodegen, AttentionWordsFollowTheirLayout) {
  AttentionWords w;
  w.heads = 12;
  w.key_heads = 4;
  w.queries = 100;
  w.keys = 200;
  w.scale = 0.125;
  w.softcap = 30;
  w.keep_scale = 1.25;
  w.offset = 77;
  w.q = 0x1000;
  w.bias = 0x5000;
  w.result2 = 0xa000;
  w.delta = 0xb000;
  w.bias_column = 7;
  w.lead = {8, 12};
  w.q_lead = {1, 2};
  w.k_lead = w.v_lead = w.out_lead = w.grad_lead = w.mask_lead = {0, 0};
  w.bias_lead = {3, 4};
  const ArgLayout layout = attention_arg_layout(2);
  const KernelArgs words = pack_attention_args(w);
  ASSERT_EQ(static_cast<int>(words.size()), layout.words());
  EXPECT_EQ(words[layout.offset("key_heads")], 4u);
  EXPECT_EQ(words[layout.offset("keys")], 200u);
  EXPECT_EQ(std::bit_cast<double>(words[layout.offset("scale")]), 0.125);
  EXPECT_EQ(std::bit_cast<double>(words[layout.offset("softcap")]), 30.0);
  EXPECT_EQ(std::bit_cast<double>(words[layout.offset("keep_scale")]), 1.25);
  EXPECT_EQ(words[layout.offset("offset")], 77u);
  EXPECT_EQ(words[layout.offset("q")], 0x1000u);
  EXPECT_EQ(words[layout.offset("bias")], 0x5000u);
  EXPECT_EQ(words[layout.offset("result2")], 0xa000u);
  EXPECT_EQ(words[layout.offset("delta")], 0xb000u);
  EXPECT_EQ(words[layout.offset("bias_column")], 7u);
  EXPECT_EQ(words[layout.offset("lead") + 1], 12u);
  EXPECT_EQ(words[layout.offset("q_lead") + 1], 2u);
  EXPECT_EQ(words[layout.offset("bias_lead")], 3u);
  EXPECT_EQ(words[layout.offset("bias_lead") + 1], 4u);
}

TEST(CudaCodegen, KernelCacheKeyNamesTheStructureTheVariantAndFastMath) {
  Step step;
  step.kernel_key = 0x3f9a1c0bULL;
  CudaElementwiseSpec spec;
  spec.vectorized = true;
  spec.inputs = {OperandAccess::Contiguous};
  EXPECT_EQ(cuda_kernel_cache_key(step, spec, false), "000000003f9a1c0b." + spec.code());
  EXPECT_EQ(cuda_kernel_cache_key(step, spec, true), "000000003f9a1c0b." + spec.code() + ".fast");
  step.kernel_key = ~0ULL;
  EXPECT_EQ(cuda_kernel_cache_key(step, spec, false).substr(0, 17), "ffffffffffffffff.");
}

// The same graph at 1, 2, 3 and 10^6 elements names one kernel (no GPU needed): fewer
// elements than a vector run the vectorized kernel's scalar loop alone.
TEST(CudaCodegen, TinySizesShareTheKernelOfAnySize) {
  std::set<std::string> keys;
  for (int64_t n : {1, 2, 3, 4, 5, 1000000}) {
    const std::string shape = "f32[" + std::to_string(n) + "]";
    Schedule schedule =
        lower("graph @main(%0: " + shape + " @cuda:0, %1: " + shape +
              " @cuda:0) {\n  %2 = const {value = 2.0} : f32[] @cuda:0\n"
              "  %3 = add %0, %2 : " +
              shape + " @cuda:0\n  %4 = exp %3 : " + shape +
              " @cuda:0\n  %5 = mul %4, %1 : " + shape + " @cuda:0\n  return %5\n}");
    ASSERT_EQ(schedule.steps.size(), 1u);
    const Step& step = schedule.steps[0];
    const std::vector<uint64_t> outputs = {8192};
    const std::vector<int64_t> sizes = {4};
    const CudaElementwiseLaunch launch =
        plan_cuda_elementwise(step, contiguous_layouts(schedule, step), outputs, sizes);
    EXPECT_TRUE(launch.spec.vectorized) << n << " elements";
    keys.insert(cuda_kernel_cache_key(step, launch.spec, false));
    if (n < 4) {
      const std::string source =
          generate_cuda_elementwise(schedule.graph, step, launch.spec).source;
      EXPECT_NE(source.find("for (IDX i = nv * 4 + tid; i < n; i += step)"), std::string::npos)
          << "the scalar loop that takes the elements a vector cannot";
    }
  }
  EXPECT_EQ(keys.size(), 1u) << "one kernel for every size: " << absl::StrJoin(keys, ", ");
}

// Softmax with its rows in registers: the row is read once, and the exponentials of the sum's
// pass are kept for the normalisation instead of computed again.
TEST(CudaCodegen, SoftmaxInRegistersComputesEachExponentialOnce) {
  Schedule schedule = lower(kSoftmax);
  ASSERT_EQ(schedule.steps.size(), 1u);
  const Step& step = schedule.steps[0];
  CudaElementwiseLaunch plan =
      plan_cuda_elementwise(step, contiguous_layouts(schedule, step), {}, {});
  plan.spec.vectorized = false;
  plan.spec.row_in_registers = true;
  const std::string source =
      generate_cuda_step(schedule.graph, step, plan.spec).source.substr(cuda_prologue().size());
  EXPECT_NE(source.find("kept3[t] = v3;"), std::string::npos) << source;
  size_t exps = 0;
  for (size_t at = source.find("lf_exp("); at != std::string::npos;
       at = source.find("lf_exp(", at + 1))
    ++exps;
  EXPECT_EQ(exps, 1u) << source;
  EXPECT_EQ(source.find("in0[i]"), source.rfind("in0[i]")) << "the row is read once";
  // Four at a time: one 16-byte read and one 16-byte write per group of four elements.
  plan.spec.vectorized = true;
  const std::string vectorized =
      generate_cuda_step(schedule.graph, step, plan.spec).source.substr(cuda_prologue().size());
  EXPECT_NE(vectorized.find("const lf_vec<float, 4> x0 = *(const lf_vec<float, 4>*)(in0 + i);"),
            std::string::npos)
      << vectorized;
  EXPECT_NE(
      vectorized.find("if (t % 4 == 3) *(lf_vec<float, 4>*)((float*)args.out[0] + i - 3) = y0;"),
      std::string::npos)
      << vectorized;
  EXPECT_EQ(vectorized.find("in0[i]"), std::string::npos) << vectorized;
  if (!nvrtc_available()) GTEST_SKIP() << nvrtc_unavailable_reason();
  EXPECT_TRUE(nvrtc_compile(cuda_prologue() + source, "k", 9, 0).is_cubin);
  EXPECT_TRUE(nvrtc_compile(cuda_prologue() + vectorized, "k", 9, 0).is_cubin);
}

// Dividing 1 by something is a correctly rounded reciprocal in the generated source.
TEST(CudaCodegen, OneOverXIsAReciprocal) {
  Schedule schedule = lower(R"(graph @main(%0: f32[64] @cuda:0) {
  %1 = const {value = 1.0} : f32[] @cuda:0
  %2 = div %1, %0 : f32[64] @cuda:0
  %3 = div %0, %2 : f32[64] @cuda:0
  return %3
})");
  const std::string source =
      generate_first(schedule, contiguous_layouts(schedule, schedule.steps[0])).source;
  EXPECT_NE(source.find("__frcp_rn(b)"), std::string::npos);
  EXPECT_NE(source.find("(a / b)"), std::string::npos) << "x / y stays a division";
}

// Note [Integer wrap-around]: integer add, sub, mul and neg compute on the unsigned type of
// their width (NVRTC has no -fwrapv); other integer ops and float ops keep their own types. The
// kernel compiles.
TEST(CudaCodegen, IntegerArithmeticWrapsThroughUnsignedTypes) {
  Schedule schedule = lower(R"(graph @main(%0: i32[64] @cuda:0, %1: i64[64] @cuda:0) {
  %2 = mul %0, %0 : i32[64] @cuda:0
  %3 = neg %2 : i32[64] @cuda:0
  %4 = maximum %3, %0 : i32[64] @cuda:0
  %5 = add %4, %1 : i64[64] @cuda:0
  return %5
})");
  ASSERT_EQ(schedule.num_kernels(), 1);
  const CudaSource source =
      generate_first(schedule, contiguous_layouts(schedule, schedule.steps[0]));
  EXPECT_NE(source.source.find("const uint32_t a = (uint32_t)v0;"), std::string::npos);
  EXPECT_NE(source.source.find("const uint32_t a = (uint32_t)v2;"), std::string::npos);
  EXPECT_NE(source.source.find("const uint64_t b = (uint64_t)v1;"), std::string::npos);
  EXPECT_NE(source.source.find("const int32_t b = (int32_t)v0;"), std::string::npos)
      << "maximum keeps its signed operands";
  EXPECT_TRUE(nvrtc_compile(source.source, source.kernel_name, 9, 0).is_cubin);
}

TEST(CudaCodegen, SoftmaxAndSumOfSquaresFuseTheirProducers) {
  Schedule softmax = lower(kSoftmax);
  EXPECT_EQ(softmax.num_kernels(), 1);
  Schedule squares = lower(R"(graph @squares(%0: f32[4096] @cuda:0) {
  %1 = mul %0, %0 : f32[4096] @cuda:0
  %2 = sum %1 : f32[] @cuda:0
  return %2
})");
  EXPECT_EQ(squares.num_kernels(), 1);
}

// Note [Horizontal fusion]: independent kernels of different spaces share a launch. The group
// kernel defines one function per distinct member kernel (two members of one structure call the
// same one), hands each member its range of blocks, and compiles, vectorized or strided.
TEST(CudaCodegen, GroupKernelSplitsItsBlocksAmongItsMembers) {
  Schedule schedule = lower(
      R"(graph @updates(%0: f32[64,32] @cuda:0, %1: f32[64,32] @cuda:0, %2: f32[16] @cuda:0, %3: f32[16] @cuda:0, %4: f32[7] @cuda:0, %5: f32[7] @cuda:0) {
  %6 = const {value = 0.1} : f32[] @cuda:0
  %7 = mul %1, %6 : f32[64,32] @cuda:0
  %8 = sub %0, %7 : f32[64,32] @cuda:0
  %9 = mul %3, %6 : f32[16] @cuda:0
  %10 = sub %2, %9 : f32[16] @cuda:0
  %11 = mul %5, %6 : f32[7] @cuda:0
  %12 = sub %4, %11 : f32[7] @cuda:0
  return %8, %10, %12
})");
  ASSERT_EQ(schedule.steps.size(), 1u);
  const Step& group = schedule.steps[0];
  ASSERT_EQ(group.kind, StepKind::Group);
  ASSERT_EQ(group.members.size(), 3u);
  EXPECT_EQ(schedule.num_kernels(), 1);
  for (bool strided : {false, true}) {
    std::vector<CudaGroupMember> members;
    std::vector<CudaElementwiseSpec> specs;
    for (const Step& member : group.members) {
      specs.push_back(plan_step(schedule, member, strided).spec);
      members.push_back({&member, specs.back(), false});
    }
    const CudaSource source = generate_cuda_group(schedule.graph, members);
    EXPECT_EQ(source.kernel_name.substr(0, 2), "g_");
    // The [16] and [7] updates have one structure: with the same variant, one function.
    const std::string member_function = absl::StrCat("static __device__ __forceinline__ void ",
                                                     group.members[1].kernel_name(), "_");
    size_t definitions = 0;
    for (size_t at = source.source.find(member_function); at != std::string::npos;
         at = source.source.find(member_function, at + 1))
      ++definitions;
    EXPECT_EQ(definitions, specs[1].code() == specs[2].code() ? 1u : 2u) << source.source;
    EXPECT_NE(source.source.find("long long start[4];"), std::string::npos);
    EXPECT_NE(source.source.find("else if (b < (unsigned int)args.start[3])"), std::string::npos);
    if (!nvrtc_available()) continue;
    SCOPED_TRACE(source.source);
    EXPECT_TRUE(nvrtc_compile(source.source, source.kernel_name, 9, 0).is_cubin);
  }
}

// Reductions of stored values join a group beside elementwise kernels: the bias gradients of a
// training step (sums over the batch, by columns) with the bias corrections of its updates. Each
// reduction's combination is its own function's, so a sum and a max do not collide.
TEST(CudaCodegen, GroupKernelTakesReductionsByRowsAndByColumns) {
  Schedule schedule = lower(
      R"(graph @grads(%0: f32[32,64] @cuda:0, %1: f32[32,16] @cuda:0, %2: f64[] @cuda:0, %3: bf16[8,300] @cuda:0) {
  %4 = sum %0 {dims = [0], keepdim = false} : f32[64] @cuda:0
  %5 = max %1 {dims = [0], keepdim = false} : f32[16] @cuda:0
  %6 = const {value = 0.9} : f64[] @cuda:0
  %7 = pow %6, %2 : f64[] @cuda:0
  %8 = sum %3 {dims = [1], keepdim = false} : bf16[8] @cuda:0
  return %4, %5, %7, %8
})");
  ASSERT_EQ(schedule.steps.size(), 1u);
  const Step& group = schedule.steps[0];
  ASSERT_EQ(group.kind, StepKind::Group);
  ASSERT_EQ(group.members.size(), 4u);
  std::vector<CudaGroupMember> members;
  for (const Step& member : group.members) {
    CudaGroupMember m{&member, plan_step(schedule, member, false).spec, false};
    // The sums over dim 0 read columns; the row sum of the bfloat16 operand reads rows.
    if (is_reduction_kind(member.kind))
      m.columns = schedule.graph.nodes[member.nodes[0]].shape != Shape{8};
    members.push_back(m);
  }
  const CudaSource source = generate_cuda_group(schedule.graph, members);
  EXPECT_NE(source.source.find("c_sum_f32_f32(const ColumnReduceArgs& args"), std::string::npos);
  EXPECT_NE(source.source.find("c_max_f32_f32(const ColumnReduceArgs& args"), std::string::npos);
  // The bfloat16 sum rounds at stores (the default policy), so it adds in float32.
  EXPECT_NE(source.source.find("r_sum_bf16_bf16_af32(const ReduceArgs& args"), std::string::npos);
  EXPECT_NE(source.source.find("const auto lf_combine = [](float x, float y) -> float { return "
                               "x + y; };"),
            std::string::npos);
  EXPECT_NE(source.source.find("const auto lf_combine = [](float x, float y) -> float { return "
                               "lf_max(x, y); };"),
            std::string::npos);
  if (!nvrtc_available()) GTEST_SKIP() << nvrtc_unavailable_reason();
  SCOPED_TRACE(source.source);
  EXPECT_TRUE(nvrtc_compile(source.source, source.kernel_name, 9, 0).is_cubin);
}

// Reductions with fused work join groups too: each its own function over its space, with its
// own argument struct, beside an elementwise member.
TEST(CudaCodegen, GroupKernelTakesReductionsWithFusedWork) {
  Schedule schedule =
      lower(R"(graph @norms(%0: f32[64,32] @cuda:0, %1: bf16[300] @cuda:0, %2: f32[7] @cuda:0) {
  %3 = mul %0, %0 : f32[64,32] @cuda:0
  %4 = sum %3 : f32[] @cuda:0
  %5 = abs %1 : bf16[300] @cuda:0
  %6 = max %5 : bf16[] @cuda:0
  %7 = exp %2 : f32[7] @cuda:0
  return %4, %6, %7
})");
  ASSERT_EQ(schedule.steps.size(), 1u);
  const Step& group = schedule.steps[0];
  ASSERT_EQ(group.kind, StepKind::Group);
  ASSERT_EQ(group.members.size(), 3u);
  std::vector<CudaGroupMember> members;
  for (bool strided : {false, true}) {
    members.clear();
    for (const Step& member : group.members) {
      CudaGroupMember m{&member, plan_step(schedule, member, strided).spec, false};
      if (is_reduction_kind(member.kind)) m.spec.vectorized = false;
      members.push_back(m);
    }
    const CudaSource source = generate_cuda_group(schedule.graph, members);
    size_t fused = 0;
    for (size_t at = source.source.find("fused nodes\nstruct Args_"); at != std::string::npos;
         at = source.source.find("fused nodes\nstruct Args_", at + 1))
      ++fused;
    EXPECT_EQ(fused, 3u) << source.source;  // two reductions and the elementwise kernel
    if (!nvrtc_available()) continue;
    SCOPED_TRACE(source.source);
    EXPECT_TRUE(nvrtc_compile(source.source, source.kernel_name, 9, 0).is_cubin);
  }
}

TEST(CudaCodegen, CompileErrorCarriesTheLogAndTheSource) {
  if (!nvrtc_available()) GTEST_SKIP() << nvrtc_unavailable_reason();
  try {
    nvrtc_compile("extern \"C\" __global__ void broken() { undeclared_name = 1; }", "broken", 9, 0);
    FAIL() << "expected CompileError";
  } catch (const CompileError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("undeclared_name"), std::string::npos) << message;
    EXPECT_NE(message.find("broken.cu"), std::string::npos) << message;
  }
}

// A reduction's chunk depends on its sizes alone: a power of two, at least the minimum, that
// leaves at most kCudaReduceBlocks blocks (rows x chunks) and more than a quarter of that,
// unless the minimum chunk or one chunk per row decides.
TEST(CudaCodegen, ReductionChunkLeavesAboutOneWaveOfBlocks) {
  for (int64_t rows : std::initializer_list<int64_t>{1, 3, 37, 1024, 100000}) {
    for (int64_t columns :
         std::initializer_list<int64_t>{1, 1000, 70001, 1 << 20, 1 << 26, 1 << 28}) {
      SCOPED_TRACE(testing::Message() << rows << " x " << columns);
      const int64_t chunk = cuda_reduce_chunk(rows, columns);
      EXPECT_EQ(chunk & (chunk - 1), 0);
      EXPECT_GE(chunk, kCudaReduceMinChunk);
      const int64_t blocks = rows * ((columns + chunk - 1) / chunk);
      if (chunk > kCudaReduceMinChunk && rows <= kCudaReduceBlocks) {
        EXPECT_LE(blocks, kCudaReduceBlocks);
        EXPECT_GT(blocks, kCudaReduceBlocks / 4);
      }
    }
  }
  EXPECT_EQ(cuda_reduce_chunk(1, int64_t{1} << 26), 65536);  // measured best at 2^26
  EXPECT_EQ(cuda_reduce_chunk(37, 70001), 4096);
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

// Note [Kernel calling convention]: every kind of kernel's words, packed by the runtime's
// functions, hold each field at the offset the struct the generator declares gives it, and no
// more words than the struct has. Distinct values per word show a field out of place.
TEST(CudaKernelArgs, PackedWordsMatchTheDeclaredLayoutOfEveryKind) {
  for (int rank : {1, 3}) {
    for (int inputs : {0, 1, 4}) {
      for (int outputs : {1, 3}) {
        SCOPED_TRACE(::testing::Message()
                     << "rank " << rank << ", " << inputs << " inputs, " << outputs << " outputs");
        CudaElementwiseLaunch launch;
        launch.spec.rank = rank;
        launch.numel = 1000;
        for (int d = 0; d < rank; ++d) launch.sizes.push_back(10 + d);
        std::vector<uint64_t> in, out;
        for (int k = 0; k < inputs; ++k) {
          in.push_back(0x1000 + k);
          Strides strides;
          for (int d = 0; d < rank; ++d) strides.push_back(100 * k + d);
          launch.strides.push_back(strides);
        }
        for (int k = 0; k < outputs; ++k) out.push_back(0x2000 + k);

        // Elementwise.
        const ArgLayout layout = elementwise_arg_layout(launch.spec, inputs, outputs);
        const KernelArgs words = pack_elementwise_args(launch, in, out);
        ASSERT_EQ(static_cast<int>(words.size()), layout.words());
        EXPECT_EQ(words[layout.offset("n")], 1000u);
        for (int d = 0; d < rank; ++d)
          EXPECT_EQ(words[layout.offset("size") + d], static_cast<uint64_t>(10 + d));
        for (int k = 0; k < inputs; ++k) {
          EXPECT_EQ(words[layout.offset("in") + k], 0x1000u + k);
          for (int d = 0; d < rank; ++d)
            EXPECT_EQ(words[layout.offset("stride") + k * rank + d],
                      static_cast<uint64_t>(100 * k + d));
        }
        for (int k = 0; k < outputs; ++k) EXPECT_EQ(words[layout.offset("out") + k], 0x2000u + k);

        // A fused reduction: the space, then the reduction's words.
        ArgLayout reduction;
        add_space_fields(reduction, launch.spec, inputs);
        add_reduction_fields(reduction);
        KernelArgs reduction_words;
        append_space_args(launch, in, reduction_words);
        ReductionWords r{0x3000, 7, 11, 13, 17, 19.5, 0x4000, 0x5000};
        append_reduction_args(r, reduction_words);
        ASSERT_EQ(static_cast<int>(reduction_words.size()), reduction.words());
        EXPECT_EQ(reduction_words[reduction.offset("out")], 0x3000u);
        EXPECT_EQ(reduction_words[reduction.offset("rows")], 7u);
        EXPECT_EQ(reduction_words[reduction.offset("columns")], 11u);
        EXPECT_EQ(reduction_words[reduction.offset("chunk")], 13u);
        EXPECT_EQ(reduction_words[reduction.offset("chunks")], 17u);
        EXPECT_EQ(std::bit_cast<double>(reduction_words[reduction.offset("divisor")]), 19.5);
        EXPECT_EQ(reduction_words[reduction.offset("partial")], 0x4000u);
        EXPECT_EQ(reduction_words[reduction.offset("counters")], 0x5000u);

        // A row kernel: the space, then its outputs and sizes.
        ArgLayout row;
        add_space_fields(row, launch.spec, inputs);
        add_row_fields(row, outputs);
        KernelArgs row_words;
        append_space_args(launch, in, row_words);
        append_row_args(out, 5, 9, row_words);
        ASSERT_EQ(static_cast<int>(row_words.size()), row.words());
        for (int k = 0; k < outputs; ++k) EXPECT_EQ(row_words[row.offset("out") + k], 0x2000u + k);
        EXPECT_EQ(row_words[row.offset("rows")], 5u);
        EXPECT_EQ(row_words[row.offset("columns")], 9u);
        EXPECT_EQ(std::bit_cast<double>(row_words[row.offset("divisor")]), 9.0);
      }
    }
  }
  // A plain reduction: its dense operand, then the reduction's words.
  const ArgLayout plain = plain_reduction_arg_layout();
  KernelArgs words = {0x6000};
  append_reduction_args(ReductionWords{0x3000, 2, 3, 4, 1, 3.0, 0, 0}, words);
  ASSERT_EQ(static_cast<int>(words.size()), plain.words());
  EXPECT_EQ(words[plain.offset("in")], 0x6000u);
  EXPECT_EQ(words[plain.offset("out")], 0x3000u);
  EXPECT_EQ(words[plain.offset("counters")], 0u);
  // A column reduction: its operand and the stride between reduced elements, then the same.
  const ArgLayout column = column_reduction_arg_layout();
  const KernelArgs column_words =
      pack_column_reduction_args(0x7000, 1024, ReductionWords{0x3000, 2, 3, 4, 1, 3.0, 0, 0});
  ASSERT_EQ(static_cast<int>(column_words.size()), column.words());
  EXPECT_EQ(column_words[column.offset("in")], 0x7000u);
  EXPECT_EQ(column_words[column.offset("stride")], 1024u);
  EXPECT_EQ(column_words[column.offset("out")], 0x3000u);
  EXPECT_EQ(column_words[column.offset("chunks")], 1u);
}

// Every reduction over every dtype as a column reduction compiles; the chunking leaves about a
// wave of blocks and never fewer than kCudaColumnMinChunk elements to a chunk.
TEST(CudaCodegen, ColumnReductionsCompileAndChunkBySizeAlone) {
  EXPECT_EQ(cuda_column_chunk(1024, 32), kCudaColumnMinChunk);
  EXPECT_EQ(cuda_column_chunk(1024, 1024), kCudaColumnMinChunk);  // 32 tiles, 16 chunks each
  EXPECT_EQ(cuda_column_chunk(32, 1 << 20), 1024);                // one tile, 1024 chunks
  EXPECT_EQ(cuda_column_chunk(1 << 20, 1 << 20), kCudaColumnMinChunk << 14);  // one chunk
  if (!nvrtc_available()) GTEST_SKIP() << nvrtc_unavailable_reason();
  for (Op op : {Op::Sum, Op::Mean, Op::Max, Op::Min}) {
    for (DType dtype : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                        DType::Int32, DType::Int64, DType::Bool}) {
      if (op == Op::Mean && !is_floating(dtype)) continue;
      const DType out = op == Op::Sum && !is_floating(dtype) ? DType::Int64 : dtype;
      // Under each half rounding policy: half sums at stores add in float32.
      for (bool round_each_op : {true, false}) {
        const CudaSource source = generate_cuda_column_reduction(
            op, dtype, out, cuda_reduction_accumulator(op, dtype, round_each_op));
        SCOPED_TRACE(source.kernel_name);
        EXPECT_TRUE(nvrtc_compile(source.source, source.kernel_name, 9, 0).is_cubin);
      }
    }
  }
}

// The struct the generators declare is the layout's: a field per line, arrays of no elements
// left out.
TEST(CudaKernelArgs, DeclaredStructFollowsTheLayout) {
  CudaElementwiseSpec spec;
  spec.rank = 2;
  EXPECT_EQ(elementwise_arg_layout(spec, 0, 1).declare("Args_k"),
            "struct Args_k {\n  long long n;\n  long long size[2];\n  void* out[1];\n};\n");
  EXPECT_EQ(elementwise_arg_layout(spec, 2, 1).declare("Args_k"),
            "struct Args_k {\n  long long n;\n  long long size[2];\n  const void* in[2];\n"
            "  long long stride[2][2];\n  void* out[1];\n};\n");
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

// A row step's row values (a LayerNorm's rsqrt(var + eps)) are computed once per row between the
// passes, and one that is stored is stored by lane 0; the kernel compiles with the row in
// registers or not, vectorized or not, in float32 and bfloat16.
TEST(CudaCodegen, RowValuesAreComputedOncePerRowBetweenThePasses) {
  for (const char* type : {"f32", "bf16"}) {
    SCOPED_TRACE(type);
    const std::string text = absl::StrCat(
        "graph @layer_norm(%0: ", type, "[8,1024] @cuda:0, %1: ", type,
        "[1024] @cuda:0) {\n  %2 = mean %0 {dims = [1], keepdim = true} : ", type,
        "[8,1] @cuda:0\n  %3 = sub %0, %2 : ", type, "[8,1024] @cuda:0\n  %4 = mul %3, %3 : ", type,
        "[8,1024] @cuda:0\n  %5 = mean %4 {dims = [1], keepdim = true} : ", type,
        "[8,1] @cuda:0\n  %6 = const {value = 1e-05} : ", type,
        "[] @cuda:0\n  %7 = add %5, %6 : ", type, "[8,1] @cuda:0\n  %8 = rsqrt %7 : ", type,
        "[8,1] @cuda:0\n  %9 = mul %3, %8 : ", type,
        "[8,1024] @cuda:0\n  %10 = mul %9, %1 : ", type, "[8,1024] @cuda:0\n  return %10, %8\n}");
    Schedule schedule = lower(text);
    ASSERT_EQ(schedule.steps.size(), 1u) << print_schedule(schedule);
    const Step& step = schedule.steps[0];
    EXPECT_EQ(step.kind, StepKind::Row);
    EXPECT_EQ(reduction_parts(step).row_values, (std::vector<ValueId>{7, 8}));
    CudaElementwiseLaunch plan =
        plan_cuda_elementwise(step, contiguous_layouts(schedule, step), {}, {});
    for (bool in_registers : {false, true}) {
      for (bool vectorized : {false, true}) {
        if (vectorized && !in_registers) continue;
        plan.spec.row_in_registers = in_registers;
        plan.spec.vectorized = vectorized;
        const CudaSource source = generate_cuda_step(schedule.graph, step, plan.spec);
        const std::string body = source.source.substr(cuda_prologue().size());
        // Outside every pass's loop: declared at the kernel's own indentation, once.
        EXPECT_NE(body.find("\n  float v8;"), std::string::npos) << body;
        EXPECT_EQ(body.find("float v8;"), body.rfind("float v8;")) << body;
        const size_t output =
            std::find(step.outputs.begin(), step.outputs.end(), 8) - step.outputs.begin();
        EXPECT_NE(body.find(absl::StrCat("if (lane == 0) ((",
                                         std::string(type) == "f32" ? "float" : "lf_bf16",
                                         "*)args.out[", output, "])[row] = ")),
                  std::string::npos)
            << body;
        if (!nvrtc_available()) continue;
        EXPECT_TRUE(nvrtc_compile(source.source, source.kernel_name, 9, 0).is_cubin);
      }
    }
  }
}

// A fused reduction reads its operands in vectors only where every row and every chunk of a
// row starts aligned, never over columns, and never where the order of its additions shows.
TEST(CudaCodegen, FusedReductionsReadVectorsOnlyWhereRowsAndChunksAreWhole) {
  auto vectorized = [](bool over_columns, int64_t columns, int64_t chunk,
                       bool order_shows = false) {
    CudaElementwiseLaunch plan;
    plan.spec.vectorized = true;
    plan.spec.vector_width = 8;
    choose_cuda_fused_reduction_layout(plan, over_columns, order_shows, columns, chunk);
    return plan.spec.vectorized;
  };
  EXPECT_TRUE(vectorized(false, 1024, 4096));
  EXPECT_FALSE(vectorized(false, 1020, 4096)) << "a row starting mid-vector";
  EXPECT_FALSE(vectorized(false, 1024, 100)) << "a chunk starting mid-vector";
  EXPECT_FALSE(vectorized(true, 1024, 4096)) << "over columns";
  EXPECT_FALSE(vectorized(false, 1024, 4096, true)) << "a float64 sum";
  CudaElementwiseLaunch unaligned;  // the plan found an operand unaligned
  unaligned.spec.vector_width = 8;
  choose_cuda_fused_reduction_layout(unaligned, false, false, 1024, 4096);
  EXPECT_FALSE(unaligned.spec.vectorized);
}

// The order of a reduction's additions shows in its bits only where it accumulates in the
// reduced values' own dtype: a float64 sum or mean (the fuzz found fused float64 sums read in
// vectors a last bit away from the plain kernel's), not a float32 or (rounding after each op) a
// half-type sum, which accumulate in float64, nor a max.
TEST(CudaCodegen, TheOrderOfAReductionShowsOnlyInItsOwnPrecision) {
  auto order_shows = [](const std::string& dtype, const std::string& op) {
    const Schedule schedule = run_pipeline(
        parse_graph(absl::StrCat("graph @main(%0: ", dtype, "[256] @cuda:0) {\n  %1 = exp %0 : ",
                                 dtype, "[256] @cuda:0\n  %2 = ", op, " %1 {dims = [0]} : ", dtype,
                                 "[] @cuda:0\n  return %2\n}")),
        {.fusion = {.half_rounding = HalfRounding::EachOp}});
    for (const Step& step : schedule.steps)
      if (is_reduction_kind(step.kind)) return cuda_reduction_order_shows(schedule.graph, step);
    ADD_FAILURE() << "no reduction step for " << dtype << " " << op;
    return false;
  };
  EXPECT_TRUE(order_shows("f64", "sum"));
  EXPECT_TRUE(order_shows("f64", "mean"));
  EXPECT_FALSE(order_shows("f64", "max"));
  EXPECT_FALSE(order_shows("f32", "sum"));
  EXPECT_FALSE(order_shows("f16", "sum"));
}

// How a row kernel lays out a row by its length and dtype (a warp a row while each lane keeps
// 64 bytes of it or less, a block of warps beyond, in registers while each lane keeps at most 16
// elements, 16 bytes a lane where the row is whole groups of that), and every layout's
// LayerNorm compiles.
TEST(CudaCodegen, RowLayoutsByLengthAndDtype) {
  struct Case {
    const char* type;
    int64_t columns;
    int warps, registers;
    bool in_registers, vectorized;
    int width;
  };
  for (const Case& c :
       {Case{"f32", 40, 1, 2, true, false, 4}, Case{"f32", 1000, 2, 16, true, false, 4},
        Case{"f32", 1024, 2, 16, true, true, 4}, Case{"bf16", 128, 1, 4, true, true, 4},
        Case{"bf16", 1024, 1, 32, true, true, 8}, Case{"f32", 3000, 8, 16, true, false, 4},
        Case{"f32", 4096, 8, 16, true, true, 4}, Case{"bf16", 4096, 8, 16, true, true, 8},
        Case{"f32", 20000, 32, 16, false, false, 4}}) {
    SCOPED_TRACE(absl::StrCat(c.type, " rows of ", c.columns));
    const std::string t = c.type, n = absl::StrCat(c.columns);
    Schedule schedule = lower(absl::StrCat(
        "graph @layer_norm(%0: ", t, "[8,", n, "] @cuda:0, %1: ", t, "[", n,
        "] @cuda:0) {\n  %2 = mean %0 {dims = [1], keepdim = true} : ", t,
        "[8,1] @cuda:0\n  %3 = sub %0, %2 : ", t, "[8,", n, "] @cuda:0\n  %4 = mul %3, %3 : ", t,
        "[8,", n, "] @cuda:0\n  %5 = mean %4 {dims = [1], keepdim = true} : ", t,
        "[8,1] @cuda:0\n  %6 = const {value = 1e-05} : ", t, "[] @cuda:0\n  %7 = add %5, %6 : ", t,
        "[8,1] @cuda:0\n  %8 = rsqrt %7 : ", t, "[8,1] @cuda:0\n  %9 = mul %3, %8 : ", t, "[8,", n,
        "] @cuda:0\n  %10 = mul %9, %1 : ", t, "[8,", n, "] @cuda:0\n  return %10\n}"));
    ASSERT_EQ(schedule.steps.size(), 1u) << print_schedule(schedule);
    const Step& step = schedule.steps[0];
    CudaElementwiseLaunch plan =
        plan_cuda_elementwise(step, contiguous_layouts(schedule, step), {}, {});
    choose_cuda_row_layout(plan, c.columns, step.inputs.size(), /*outputs_aligned=*/true);
    EXPECT_EQ(plan.spec.row_warps, c.warps);
    EXPECT_EQ(plan.spec.row_in_registers, c.in_registers);
    if (c.in_registers) EXPECT_EQ(plan.spec.row_registers, c.registers);
    EXPECT_EQ(plan.spec.vectorized, c.vectorized);
    if (c.vectorized) EXPECT_EQ(plan.spec.vector_width, c.width);
    EXPECT_EQ(cuda_row_threads(plan.spec), c.warps == 1 ? kCudaReduceThreads : 32 * c.warps);
    EXPECT_EQ(cuda_row_blocks(plan.spec, 8), c.warps == 1 ? 1 : 8);
    const CudaSource source = generate_cuda_step(schedule.graph, step, plan.spec);
    EXPECT_NE(
        source.source.find(absl::StrCat("__launch_bounds__(", cuda_row_threads(plan.spec), ")")),
        std::string::npos);
    // A block's warps combine each reduction (mean, then the variance) through shared memory.
    EXPECT_EQ(source.source.find("__syncthreads();") != std::string::npos, c.warps > 1);
    if (!nvrtc_available()) continue;
    EXPECT_TRUE(nvrtc_compile(source.source, source.kernel_name, 9, 0).is_cubin);
  }
  // Five operands are more than the registers keep.
  CudaElementwiseLaunch plan;
  plan.spec.vectorized = true;
  choose_cuda_row_layout(plan, 4096, 5, true);
  EXPECT_FALSE(plan.spec.row_in_registers);
  EXPECT_FALSE(plan.spec.vectorized);
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

// A sum over the batch with the work before it fused (a ReLU's mask of a gradient, stored, and
// its bias's gradient): one kernel, alone or as a group's member, in float32 and bfloat16.
TEST(CudaCodegen, ColumnSumWithFusedWorkCompilesAloneAndInAGroup) {
  for (const char* type : {"f32", "bf16"}) {
    SCOPED_TRACE(type);
    const std::string text = absl::StrCat(
        "graph @bias_gradient(%0: ", type, "[64,1024] @cuda:0, %1: ", type,
        "[64,1024] @cuda:0, %2: ", type, "[300] @cuda:0) {\n  %3 = const {value = 0.0} : ", type,
        "[] @cuda:0\n  %4 = gt %0, %3 : bool[64,1024] @cuda:0\n  %5 = where %4, %1, %3 : ", type,
        "[64,1024] @cuda:0\n  %6 = sum %5 {dims = [0], keepdim = false} : ", type,
        "[1024] @cuda:0\n  %7 = exp %2 : ", type, "[300] @cuda:0\n  return %5, %6, %7\n}");
    Schedule schedule = lower(text);
    ASSERT_EQ(schedule.steps.size(), 1u) << print_schedule(schedule);
    const Step& group = schedule.steps[0];
    ASSERT_EQ(group.kind, StepKind::Group) << print_schedule(schedule);
    std::vector<CudaGroupMember> members;
    for (const Step& member : group.members) {
      CudaElementwiseLaunch plan =
          plan_cuda_elementwise(member, contiguous_layouts(schedule, member), {}, {});
      plan.spec.vectorized = false;
      members.push_back({&member, plan.spec, false});
      if (member.kind == StepKind::Elementwise) continue;
      EXPECT_EQ(member.kind, StepKind::Column);
      const CudaSource alone = generate_cuda_step(schedule.graph, member, plan.spec);
      EXPECT_NE(alone.source.find("const IDX i = (IDX)(j * args.rows + column);"),
                std::string::npos)
          << alone.source;
      if (nvrtc_available()) {
        EXPECT_TRUE(nvrtc_compile(alone.source, alone.kernel_name, 9, 0).is_cubin);
      }
    }
    const CudaSource source = generate_cuda_group(schedule.graph, members);
    if (!nvrtc_available()) continue;
    EXPECT_TRUE(nvrtc_compile(source.source, source.kernel_name, 9, 0).is_cubin);
  }
}

}  // namespace
}  // namespace lazyfuse

namespace lazyfuse {
namespace {

// The graphs of normalizations and losses with their gradients, as the frontend builds them on
// the CPU, moved to cuda:0: every step's kernel generates and compiles, with contiguous and
// strided operands (row values, column steps and groups of them among them).
TEST(CudaCodegen, NormalizationsAndLossesWithGradientsCompile) {
  const DType dtype = kFloat32;
  for (const Shape& shape : {Shape{3, 4}, Shape{37, 100}}) {
    SCOPED_TRACE(testing::Message() << dtype_torch_name(dtype) << " " << shape_str(shape));
    const int64_t rows = shape[0], columns = shape[1];
    auto make = [&](int64_t n) {
      std::vector<double> values(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) values[i] = std::sin(0.7 * static_cast<double>(i + 1));
      return from_vector(values, n == columns ? Shape{columns} : shape, dtype).requires_grad_();
    };
    Tensor x = make(rows * columns), w = make(columns), b = make(columns);
    Tensor labels = zeros({rows}, kInt64);
    const std::vector<Tensor> outputs = {
        nn::functional::layer_norm(x, {columns}, w, b),
        nn::functional::rms_norm(x, {columns}, w),
        nn::functional::normalize(x),
        log_softmax(x, 1),
        softmax(x, 1),
        nn::functional::cross_entropy(x, labels).reshape({1, 1}).expand({rows, columns})};
    for (const Tensor& out : outputs) {
      std::vector<Tensor> pieces = {out.reshape({-1})};
      for (const Tensor& g : grad({(out * out).sum()}, {x, w, b}, {}, std::nullopt, false, true))
        if (g.defined()) pieces.push_back(g.reshape({-1}));
      Tensor all = cat(pieces);
      std::string text = all.ir();
      for (size_t at = text.find("@cpu"); at != std::string::npos; at = text.find("@cpu", at))
        text.replace(at, 4, "@cuda:0");
      const Schedule schedule = lower(text);
      // Every value a reduction step stores, its kernel stores (a step that stores its work
      // besides reducing it once ran as a fused reduction, which stores the result alone).
      std::vector<const Step*> steps;
      for (const Step& step : schedule.steps) {
        steps.push_back(&step);
        for (const Step& member : step.members) steps.push_back(&member);
      }
      for (const Step* step : steps) {
        if (!is_reduction_kind(step->kind) || step->outputs.size() < 2) continue;
        CudaElementwiseLaunch plan = plan_step(schedule, *step, false);
        plan.spec.vectorized = false;
        const std::string source = generate_cuda_step(schedule.graph, *step, plan.spec).source;
        for (size_t o = 0; o < step->outputs.size(); ++o)
          EXPECT_NE(source.find(absl::StrCat("args.out[", o, "]")), std::string::npos) << source;
      }
      for (bool strided : {false, true})
        for (const CudaSource& source : generate_all(schedule, strided)) {
          SCOPED_TRACE(source.kernel_name);
          if (nvrtc_available()) {
            EXPECT_TRUE(nvrtc_compile(source.source, source.kernel_name, 9, 0).is_cubin);
          }
        }
    }
  }
}

}  // namespace
// Products of few rows (Note [Products of few rows] in codegen/cuda/cuda_matmul.cc): planned from
// the shape alone, about 128 sums a lane, 16-byte loads; their words read back where the
// layout puts them; every dtype, row count and epilogue compiles for sm_90.
TEST(CudaCodegen, ProductsOfFewRowsArePlannedAndCompile) {
  const std::optional<SkinnyMatmulPlan> linear =
      plan_skinny_matmul(DType::Float32, 32, 1024, 1024, SkinnyEpilogue::BiasRelu);
  ASSERT_TRUE(linear.has_value());
  EXPECT_EQ(linear->cols_per_block, 4);
  EXPECT_EQ(linear->warps, 4);
  EXPECT_EQ(linear->vector, 4);
  EXPECT_EQ(linear->blocks(1024), 256);
  EXPECT_EQ(linear->blocks(10), 3);
  const std::optional<SkinnyMatmulPlan> wide =
      plan_skinny_matmul(DType::BFloat16, 64, 512, 512, SkinnyEpilogue::None);
  ASSERT_TRUE(wide.has_value());
  EXPECT_EQ(wide->vector, 8);
  EXPECT_EQ(wide->rows_per_block, 32);
  EXPECT_EQ(wide->cols_per_block, 4);
  EXPECT_EQ(wide->blocks(512), 256) << "two blocks of rows for each four columns";
  const std::optional<SkinnyMatmulPlan> ragged =
      plan_skinny_matmul(DType::Float32, 63, 64, 8, SkinnyEpilogue::None);
  const std::optional<SkinnyMatmulPlan> halves =
      plan_skinny_matmul(DType::Float32, 40, 64, 8, SkinnyEpilogue::None);
  const std::optional<SkinnyMatmulPlan> one_row =
      plan_skinny_matmul(DType::Float32, 1, 8, 3, SkinnyEpilogue::None);
  ASSERT_TRUE(ragged && halves && one_row);
  EXPECT_EQ(ragged->rows_per_block, 32);
  EXPECT_EQ(halves->rows_per_block, 20);
  EXPECT_EQ(one_row->warps, 1);
  EXPECT_EQ(wide->warps, 2) << "512 bfloat16s are two chunks of 32 lanes";
  EXPECT_FALSE(plan_skinny_matmul(DType::Float32, 65, 1024, 1024, SkinnyEpilogue::None));
  EXPECT_FALSE(plan_skinny_matmul(DType::Float64, 8, 1024, 1024, SkinnyEpilogue::None));
  EXPECT_FALSE(plan_skinny_matmul(DType::Float32, 8, 1022, 1024, SkinnyEpilogue::None))
      << "a row that 16-byte loads do not cover";
  EXPECT_FALSE(plan_skinny_matmul(DType::BFloat16, 8, 1020, 1024, SkinnyEpilogue::None));

  const SkinnyMatmulWords product{0x10, 0x20, 0x30, 0x40, 1028, 1032, 1024, 33};
  const ArgLayout layout = skinny_matmul_arg_layout();
  const KernelArgs words = pack_skinny_matmul_args(product);
  ASSERT_EQ(static_cast<int>(words.size()), layout.words());
  EXPECT_EQ(words[layout.offset("a")], 0x10u);
  EXPECT_EQ(words[layout.offset("b")], 0x20u);
  EXPECT_EQ(words[layout.offset("bias")], 0x30u);
  EXPECT_EQ(words[layout.offset("c")], 0x40u);
  EXPECT_EQ(words[layout.offset("lda")], 1028u);
  EXPECT_EQ(words[layout.offset("ldb")], 1032u);
  EXPECT_EQ(words[layout.offset("inner")], 1024u);
  EXPECT_EQ(words[layout.offset("cols")], 33u);

  if (!nvrtc_available()) GTEST_SKIP() << nvrtc_unavailable_reason();
  struct Kind {
    DType dtype;
    int64_t rows;
    SkinnyEpilogue epilogue;
  };
  for (const Kind& kind : {Kind{DType::Float32, 32, SkinnyEpilogue::BiasRelu},
                           Kind{DType::Float32, 1, SkinnyEpilogue::None},
                           Kind{DType::Float16, 64, SkinnyEpilogue::Bias},
                           Kind{DType::BFloat16, 64, SkinnyEpilogue::BiasRelu},
                           Kind{DType::BFloat16, 5, SkinnyEpilogue::None},
                           Kind{DType::Float32, 63, SkinnyEpilogue::Bias}}) {
    const std::optional<SkinnyMatmulPlan> plan =
        plan_skinny_matmul(kind.dtype, kind.rows, 1024, 1024, kind.epilogue);
    ASSERT_TRUE(plan.has_value());
    const CudaSource source = generate_cuda_skinny_matmul(*plan);
    SCOPED_TRACE(source.kernel_name);
    EXPECT_TRUE(nvrtc_compile(source.source, source.kernel_name, 9, 0).is_cubin);
  }
}

}  // namespace lazyfuse

namespace lazyfuse {
namespace {

// Half-precision rows as each rounding policy generates them (Note [Half precision in fused
// kernels]): rounding at stores, sums add in float32 into independent accumulators, softmax
// multiplies by its row sum's reciprocal, and a LayerNorm's row of three operands takes two
// warps, its weight and bias read at the column; rounding after each op, sums add in float64
// and the division stays, so fused kernels keep the bits of unfused ones.
TEST(CudaCodegen, HalfRowsFollowTheRoundingPolicy) {
  const std::string text =
      R"(graph @rows(%0: bf16[64,1024] @cuda:0, %1: bf16[1024] @cuda:0, %2: bf16[1024] @cuda:0) {
  %3 = max %0 {dims = [1], keepdim = true} : bf16[64,1] @cuda:0
  %4 = sub %0, %3 : bf16[64,1024] @cuda:0
  %5 = exp %4 : bf16[64,1024] @cuda:0
  %6 = sum %5 {dims = [1], keepdim = true} : bf16[64,1] @cuda:0
  %7 = div %5, %6 : bf16[64,1024] @cuda:0
  %8 = mean %0 {dims = [1], keepdim = true} : bf16[64,1] @cuda:0
  %9 = sub %0, %8 : bf16[64,1024] @cuda:0
  %10 = mul %9, %9 : bf16[64,1024] @cuda:0
  %11 = mean %10 {dims = [1], keepdim = true} : bf16[64,1] @cuda:0
  %12 = const {value = 1e-05} : bf16[] @cuda:0
  %13 = add %11, %12 : bf16[64,1] @cuda:0
  %14 = rsqrt %13 : bf16[64,1] @cuda:0
  %15 = mul %9, %14 : bf16[64,1024] @cuda:0
  %16 = mul %15, %1 : bf16[64,1024] @cuda:0
  %17 = add %16, %2 : bf16[64,1024] @cuda:0
  return %7, %17
})";
  for (HalfRounding rounding : {HalfRounding::AtStores, HalfRounding::EachOp}) {
    const bool at_stores = rounding == HalfRounding::AtStores;
    SCOPED_TRACE(at_stores ? "at stores" : "each op");
    PipelineOptions options;
    options.fusion.half_rounding = rounding;
    const Schedule schedule = run_pipeline(parse_graph(text), options);
    int rows_seen = 0;
    for (const Step& step : schedule.steps) {
      if (step.kind != StepKind::Row) continue;
      ++rows_seen;
      CudaElementwiseLaunch plan = plan_step(schedule, step, false);
      choose_cuda_row_layout(plan, 1024, step.inputs.size(), true);
      const CudaSource source = generate_cuda_row_kernel(schedule.graph, step, plan.spec);
      const std::string& s = source.source;
      SCOPED_TRACE(s.substr(cuda_prologue().size()));
      const bool softmax = step.inputs.size() == 1;
      EXPECT_EQ(plan.spec.row_warps, softmax ? 1 : 2);
      EXPECT_EQ(plan.spec.periods_are_rows, !softmax);
      EXPECT_EQ(s.find("double acc") == std::string::npos, at_stores);
      EXPECT_EQ(s.find("float acc1_part[4]") != std::string::npos, at_stores);
      if (softmax) {
        EXPECT_EQ(s.find("= __frcp_rn(v") != std::string::npos, at_stores);
        EXPECT_EQ(s.find("(a / b);  // div") == std::string::npos, at_stores);
      } else {
        EXPECT_EQ(s.find("% (IDX)args.stride"), std::string::npos);
      }
      if (nvrtc_available()) EXPECT_TRUE(nvrtc_compile(s, source.kernel_name, 9, 0).is_cubin);
    }
    EXPECT_EQ(rows_seen, 2);
  }
}

}  // namespace
}  // namespace lazyfuse
