// The typed errors: each raised where the docs say, of its own type, with a message that says
// what was wrong and where (PyTorch's wording where PyTorch has one, and the file:line of the
// user's call). Also: a failed evaluation leaves every tensor as it was, undefined tensors are
// rejected, and the verifier rejects malformed graphs.
#include <atomic>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/ir/verifier.h"
#include "lazyfuse/lazyfuse.h"
#include "lazyfuse/runtime/cpu/openmp.h"

namespace lazyfuse {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Runs `body`, which must throw exactly `E`, and returns the message for matchers.
template <typename E, typename F>
std::string message_of(F&& body) {
  try {
    body();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "threw nothing";
  return "";
}

// "errors_test.cc:LINE": what the messages name as the place of the call. The cases below set
// `line` in the same expression as the call, so that formatting cannot move them apart.
std::string here(int line) { return "errors_test.cc:" + std::to_string(line); }

TEST(Errors, AllErrorsAreLazyfuseErrors) {
  // Callers may catch every deliberate failure as lazyfuse::Error.
  EXPECT_THROW(Device("tpu"), Error);
  EXPECT_THROW(tensor({1, 2, 3}) + tensor({1, 2}), Error);
  EXPECT_THROW(-tensor({1}, kBool), Error);
}

TEST(Errors, DeviceStringError) {
  EXPECT_THAT(message_of<DeviceStringError>([] { Device("cuda:x"); }),
              HasSubstr("Invalid device string: 'cuda:x'"));
  EXPECT_THAT(message_of<DeviceStringError>([] { Device("tpu"); }),
              HasSubstr("Invalid device string: 'tpu' (unknown device type"));
  EXPECT_THAT(message_of<DeviceStringError>([] { Device("cuda:-1"); }),
              HasSubstr("the index is not a non-negative integer"));
  EXPECT_THAT(message_of<DeviceStringError>([] { Device("cuda:"); }),
              HasSubstr("Invalid device string: 'cuda:'"));
  EXPECT_THAT(message_of<DeviceStringError>([] { Device("cuda:1x"); }),
              HasSubstr("Invalid device string: 'cuda:1x'"));
  EXPECT_THAT(message_of<DeviceStringError>([] { Device("cpu:1"); }),
              HasSubstr("cpu takes no index but 0"));
  // What the accepted strings are.
  EXPECT_THAT(message_of<DeviceStringError>([] { Device("tpu"); }),
              HasSubstr("expected \"cpu\", \"cuda\" or \"cuda:N\""));
}

TEST(Errors, DeviceIndexErrorWithoutAGpu) {
  if (cuda::device_count() > 0)
    GTEST_SKIP() << "a GPU is present (Cuda.DeviceBeyondTheCountIsAnError covers it)";
  Tensor x = tensor({1, 2, 3});
  int line = 0;
  std::string to_cuda =
      message_of<DeviceIndexError>([&] { (void)(line = __LINE__, x.to("cuda")); });
  EXPECT_THAT(to_cuda, HasSubstr("Device cuda requested, but no CUDA GPUs are available"));
  EXPECT_THAT(to_cuda, HasSubstr(here(line)));

  std::string ones_on_1 =
      message_of<DeviceIndexError>([&] { (void)(line = __LINE__, ones({2}, Device("cuda:1"))); });
  EXPECT_THAT(ones_on_1, HasSubstr("Device cuda:1 requested, but no CUDA GPUs are available"));
  EXPECT_THAT(ones_on_1, HasSubstr(here(line)));

  // Every way of asking for a GPU says so, generators and data alike.
  EXPECT_THROW(rand({2}, Device("cuda:0")), DeviceIndexError);
  EXPECT_THROW(arange(3, Device("cuda")), DeviceIndexError);
  EXPECT_THROW(tensor({1, 2}, Device("cuda:0")), DeviceIndexError);
  EXPECT_THROW(x.to(Device(DeviceType::CUDA, 3)), DeviceIndexError);
  // x is untouched by the failed move.
  EXPECT_EQ(x.device(), Device::cpu());
}

TEST(Errors, ShapeErrorForBroadcastingUsesPyTorchWordingAndTheCallSite) {
  Tensor a = tensor({1, 2, 3});
  Tensor b = tensor({1, 2, 3, 4});
  int line = 0;
  std::string message = message_of<ShapeError>([&] { return (line = __LINE__, a + b); });
  EXPECT_THAT(message, HasSubstr("The size of tensor a (3) must match the size of tensor b (4) at "
                                 "non-singleton dimension 0"));
  EXPECT_THAT(message, HasSubstr(here(line)));
  // Dimensions are counted from the front of the broadcast shape, as PyTorch does.
  EXPECT_THAT(message_of<ShapeError>([] {
                return zeros({2, 3}) * zeros({2, 4});
              }),
              HasSubstr("The size of tensor a (3) must match the size of tensor b (4) at "
                        "non-singleton dimension 1"));
  // Scalars and size-1 dims broadcast: no error.
  EXPECT_NO_THROW(zeros({2, 3}) + zeros({1, 3}) + 1);
  // Three operands merge left to right; the failing dim is counted in the broadcast of those
  // merged so far with the failing one, not in that of all three.
  EXPECT_THAT(message_of<ShapeError>([] {
                return where(zeros({3}) > 0, zeros({4}), zeros({1, 1, 1}));
              }),
              HasSubstr("The size of tensor a (3) must match the size of tensor b (4) at "
                        "non-singleton dimension 0"));
  EXPECT_THAT(message_of<ShapeError>([] {
                return where(zeros({4, 3}) > 0, zeros({1, 3}), zeros({2, 5, 3}));
              }),
              HasSubstr("The size of tensor a (4) must match the size of tensor b (5) at "
                        "non-singleton dimension 1"));
  EXPECT_EQ(where(zeros({3}) > 0, zeros({2, 1}), zeros({4, 1, 1})).sizes(), (Shape{4, 2, 3}));
}

TEST(Errors, ShapeErrorForMatmul) {
  int line = 0;
  std::string message = message_of<ShapeError>([&] {
    return (line = __LINE__, matmul(zeros({2, 3}), zeros({2, 3})));
  });
  EXPECT_THAT(message, HasSubstr("mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)"));
  EXPECT_THAT(message, HasSubstr(here(line)));
  EXPECT_THAT(message_of<ShapeError>([] {
                return zeros({4, 5}).matmul(zeros({4}));
              }),
              HasSubstr("mat1 and mat2 shapes cannot be multiplied"));
}

TEST(Errors, ShapeErrorForBadReshape) {
  Tensor x = zeros({2, 3});
  EXPECT_THAT(message_of<ShapeError>([&] { return x.reshape({5}); }),
              HasSubstr("shape '[5]' is invalid for input of size 6"));
  EXPECT_THAT(message_of<ShapeError>([&] {
                return x.reshape({-1, 4});
              }),
              HasSubstr("shape '[-1, 4]' is invalid for input of size 6"));
  EXPECT_THAT(message_of<ShapeError>([&] {
                return x.view({-1, -1});
              }),
              HasSubstr("only one dimension can be inferred"));
  // A view of a transposed tensor that strides cannot express; reshape copies instead.
  Tensor transposed = tensor({{1, 2, 3}, {4, 5, 6}}).t();
  int line = 0;
  std::string message =
      message_of<ShapeError>([&] { return (line = __LINE__, transposed.view({6})); });
  EXPECT_THAT(message,
              HasSubstr("view size is not compatible with input tensor's size and stride"));
  EXPECT_THAT(message, HasSubstr(here(line)));
  EXPECT_EQ(transposed.reshape({6}).to_vector<float>(), std::vector<float>({1, 4, 2, 5, 3, 6}));
}

TEST(Errors, ShapeErrorForBadNarrow) {
  Tensor x = zeros({3, 4});
  int line = 0;
  std::string message =
      message_of<ShapeError>([&] { return (line = __LINE__, x.narrow(0, 2, 5)); });
  EXPECT_THAT(message, HasSubstr("start (2) + length (5) exceeds dimension size (3)."));
  EXPECT_THAT(message, HasSubstr(here(line)));
  EXPECT_THAT(message_of<ShapeError>([&] { return x.narrow(1, 3, 2); }),
              HasSubstr("start (3) + length (2) exceeds dimension size (4)."));
  EXPECT_THAT(message_of<ShapeError>([&] { return x.narrow(2, 0, 1); }),
              HasSubstr("Dimension out of range (expected to be in range of [-2, 1], but got 2)"));
  EXPECT_THROW(x.narrow(0, 0, -1), ShapeError);
}

TEST(Errors, DTypeErrors) {
  Tensor mask = tensor({1, 0, 1}, kBool);
  int line = 0;
  std::string negate = message_of<DTypeError>([&] { return (line = __LINE__, -mask); });
  EXPECT_THAT(negate, HasSubstr("neg: not supported for bool tensors (operands: torch.bool)"));
  EXPECT_THAT(negate, HasSubstr(here(line)));

  EXPECT_THAT(message_of<DTypeError>([&] { return mask - mask; }),
              HasSubstr("sub: not supported for bool tensors (operands: torch.bool, torch.bool)"));

  EXPECT_THAT(message_of<DTypeError>([] { return arange(4).mean(); }),
              HasSubstr("mean: could not infer output dtype. Input dtype must be either a "
                        "floating point or complex dtype"));

  Tensor values = tensor({1., 2., 3.});
  EXPECT_THAT(message_of<DTypeError>([&] { return where(values, values, values); }),
              HasSubstr("where: the condition must be a bool tensor (operands: torch.float32"));

  EXPECT_THAT(message_of<DTypeError>([] {
                return matmul(zeros({2, 2}), zeros({2, 2}, kFloat64));
              }),
              HasSubstr("matmul: expected both operands to have the same dtype (operands: "
                        "torch.float32, torch.float64)"));

  EXPECT_THAT(message_of<DTypeError>([] { return rand({2}, kInt64); }),
              HasSubstr("rand: expected a floating dtype, got torch.int64"));
  // What PyTorch allows stays allowed: bool + bool, where on a real condition, int sums.
  EXPECT_NO_THROW(mask + mask);
  EXPECT_NO_THROW(where(values > 1, values, values));
  EXPECT_EQ(arange(4).sum().item<int64_t>(), 6);
}

TEST(Errors, DeviceMismatchErrorFromThePlacementPass) {
  // Without a GPU the frontend cannot make a CUDA tensor, so the pass gets IR text directly.
  constexpr char kMixed[] =
      "graph @main(%0: f32[3] @cuda:0, %1: f32[3] @cpu) {\n"
      "  %2 = add %0, %1 : f32[3] @cuda:0\n"
      "  return %2\n"
      "}\n";
  Graph graph = parse_graph(kMixed);
  std::string message = message_of<DeviceMismatchError>([&] { run_placement(graph); });
  EXPECT_THAT(message, StartsWith("Expected all tensors to be on the same device, but found at "
                                  "least two devices, cuda:0 and cpu!"));
  EXPECT_THAT(message, HasSubstr("In add "));
  EXPECT_THAT(message, HasSubstr("operand 1 (%1: f32[3] @cpu)"));
  // The pipeline runs placement before anything else can go wrong.
  std::string piped =
      message_of<DeviceMismatchError>([&] { run_pipeline(parse_graph(kMixed), {}); });
  EXPECT_THAT(piped, StartsWith("Expected all tensors to be on the same device, but found at "
                                "least two devices, cuda:0 and cpu!"));

  // The first operand's device is named first, as in PyTorch.
  EXPECT_THAT(message_of<DeviceMismatchError>([] {
                Graph g = parse_graph(
                    "graph @main(%0: f32[3] @cpu, %1: f32[3] @cuda:1) {\n"
                    "  %2 = mul %0, %1 : f32[3] @cpu\n"
                    "  return %2\n"
                    "}\n");
                run_placement(g);
              }),
              StartsWith("Expected all tensors to be on the same device, but found at least two "
                         "devices, cpu and cuda:1!"));
}

TEST(Errors, PlacementMovesScalarConstantsToTheirUser) {
  Graph graph = parse_graph(
      "graph @main(%0: f32[3] @cuda:0, %1: f32[3] @cpu) {\n"
      "  %2 = const {value = 2.0} : f32[] @cpu\n"
      "  %3 = add %0, %2 : f32[3] @cuda:0\n"
      "  %4 = mul %1, %2 : f32[3] @cpu\n"
      "  return %3, %4\n"
      "}\n");
  ASSERT_NO_THROW(run_placement(graph));
  verify(graph, {.placed = true});
  // One copy of the constant per device that uses it, each next to its user.
  const Node& cuda_add = graph.nodes[graph.outputs[0]];
  const Node& cpu_mul = graph.nodes[graph.outputs[1]];
  ASSERT_EQ(cuda_add.op, Op::Add);
  ASSERT_EQ(cpu_mul.op, Op::Mul);
  const Node& cuda_const = graph.nodes[cuda_add.inputs[1]];
  const Node& cpu_const = graph.nodes[cpu_mul.inputs[1]];
  EXPECT_EQ(cuda_const.op, Op::Const);
  EXPECT_EQ(cuda_const.device, Device("cuda:0"));
  EXPECT_EQ(cpu_const.op, Op::Const);
  EXPECT_EQ(cpu_const.device, Device::cpu());

  // A constant that is not a scalar is a tensor like any other: no silent move.
  Graph big = parse_graph(
      "graph @main(%0: f32[3] @cuda:0) {\n"
      "  %1 = const {value = 2.0} : f32[3] @cpu\n"
      "  %2 = add %0, %1 : f32[3] @cuda:0\n"
      "  return %2\n"
      "}\n");
  EXPECT_THROW(run_placement(big), DeviceMismatchError);
}

TEST(Errors, TransferAcrossDevicesIsAccepted) {
  Graph graph = parse_graph(
      "graph @main(%0: f32[3] @cpu) {\n"
      "  %1 = to %0 : f32[3] @cuda:0\n"
      "  %2 = exp %1 : f32[3] @cuda:0\n"
      "  %3 = to %2 : f32[3] @cpu\n"
      "  return %3\n"
      "}\n");
  Schedule schedule;
  ASSERT_NO_THROW(schedule = run_pipeline(graph, {}));
  int transfers = 0, kernels = 0;
  for (const Step& step : schedule.steps) {
    transfers += step.kind == StepKind::Transfer;
    kernels += step.kind == StepKind::Elementwise;
  }
  EXPECT_EQ(transfers, 2);
  EXPECT_EQ(kernels, 1);                 // the exp, on cuda:0
  EXPECT_EQ(schedule.num_kernels(), 1);  // transfers are copies, not kernels
  EXPECT_EQ(schedule.steps[1].device, Device("cuda:0"));
}

// A pending `x * 2 + 1` and the tensors involved, to check that a failure loses nothing.
struct Pending {
  Tensor x = tensor({1., 2., 3.});
  Tensor doubled = x * 2;
  Tensor result = doubled + 1;

  void expect_intact() const {
    EXPECT_TRUE(x.is_computed());
    EXPECT_FALSE(doubled.is_computed());
    EXPECT_FALSE(result.is_computed());
    ASSERT_EQ(result.value()->inputs.size(), 2u);
    EXPECT_EQ(result.value()->inputs[0], doubled.value());
    ASSERT_EQ(doubled.value()->inputs.size(), 2u);
    EXPECT_EQ(doubled.value()->inputs[0], x.value());
  }
};

TEST(Errors, ExceptionInAParallelRegionReachesTheCaller) {
  // The CPU executor's threads allocate their registers and blocks inside OpenMP regions; an
  // allocation that fails there must reach the caller as its own type, not end the process.
  ParallelFailure failure;
  std::atomic<int> finished{0};
#pragma omp parallel for num_threads(4) schedule(dynamic, 1)
  for (int item = 0; item < 64; ++item) {
    if (failure.stopped()) continue;
    try {
      if (item == 5) throw OutOfMemoryError("out of host memory in item 5");
      finished.fetch_add(1);
    } catch (...) {
      failure.capture();
    }
  }
  try {
    failure.rethrow_if_any();
    ADD_FAILURE() << "the exception thrown in the region was lost";
  } catch (const OutOfMemoryError& e) {
    EXPECT_STREQ(e.what(), "out of host memory in item 5");
  }
  EXPECT_LT(finished.load(), 64);

  ParallelFailure none;
#pragma omp parallel for num_threads(4)
  for (int item = 0; item < 64; ++item) {
    if (none.stopped()) continue;
    finished.fetch_add(1);
  }
  EXPECT_FALSE(none.stopped());
  EXPECT_NO_THROW(none.rethrow_if_any());
}

TEST(Errors, FailedEvaluationLosesNothing) {
  // A real failure through the public API: a tensor far larger than the address space, whose
  // allocation fails while its graph runs together with a correct one.
  Pending p;
  const Tensor huge = zeros({int64_t{1} << 50});  // 4 PiB of float32
  const int64_t memory_before = memory_stats(Device::cpu()).allocated_bytes;
  const int64_t evaluations_before = eval_stats().evaluations;
  EXPECT_THROW(eval({p.result, huge}), OutOfMemoryError);
  p.expect_intact();
  EXPECT_FALSE(huge.is_computed());
  EXPECT_EQ(huge.value()->node.op, Op::Const);
  EXPECT_EQ(eval_stats().evaluations, evaluations_before);
  // Whatever the failed run computed before failing was freed.
  EXPECT_EQ(memory_stats(Device::cpu()).allocated_bytes, memory_before);

  // Without the failing tensor the same pending graph evaluates correctly.
  EXPECT_EQ(p.result.to_vector<float>(), std::vector<float>({3, 5, 7}));
  EXPECT_FALSE(p.doubled.is_computed());
  EXPECT_EQ(p.doubled.to_vector<float>(), std::vector<float>({2, 4, 6}));
}

TEST(Errors, FailedPlacementInEvaluationLosesNothing) {
  // The runtime-level case the frontend cannot build without a GPU: a pending node on cuda:0
  // that reads a CPU value, evaluated together with a correct graph.
  Pending p;
  Node bad;
  bad.op = Op::Add;
  bad.dtype = DType::Float32;
  bad.shape = {3};
  bad.device = Device(DeviceType::CUDA, 0);
  LazyRef mixed = make_pending(bad, {p.x.value(), p.doubled.value()}, {1});
  const int64_t evaluations_before = eval_stats().evaluations;
  std::vector<LazyRef> outputs = {p.result.value(), mixed};
  try {
    evaluate(outputs);
    ADD_FAILURE() << "evaluation of a cuda:0 add of cpu values succeeded";
  } catch (const DeviceMismatchError& e) {
    EXPECT_THAT(std::string(e.what()),
                StartsWith("Expected all tensors to be on the same device, but found at least "
                           "two devices, cpu and cuda:0!"));
    EXPECT_THAT(std::string(e.what()), HasSubstr("In add "));
  }
  p.expect_intact();
  EXPECT_FALSE(mixed->computed());
  ASSERT_EQ(mixed->inputs.size(), 2u);
  EXPECT_EQ(mixed->inputs[0], p.x.value());
  EXPECT_EQ(mixed->inputs[1], p.doubled.value());
  EXPECT_EQ(eval_stats().evaluations, evaluations_before);

  // Fixed: the same leaves and pending values, with the add on the CPU.
  Tensor fixed = p.x + p.doubled;
  eval({p.result, fixed});
  EXPECT_EQ(p.result.to_vector<float>(), std::vector<float>({3, 5, 7}));
  EXPECT_EQ(fixed.to_vector<float>(), std::vector<float>({3, 6, 9}));
  EXPECT_EQ(p.x.to_vector<float>(), std::vector<float>({1, 2, 3}));
}

TEST(Errors, UnrunnableDeviceInEvaluationLosesNothing) {
  // A transfer to a GPU past the last one places fine, but cannot run. Which error says so is
  // the executor's business; that nothing is lost is what matters here.
  Pending p;
  Node on_gpu;
  on_gpu.op = Op::To;
  on_gpu.dtype = DType::Float32;
  on_gpu.shape = {3};
  on_gpu.device = Device(DeviceType::CUDA, cuda::device_count());
  LazyRef moved = make_pending(on_gpu, {p.doubled.value()}, {1});
  std::vector<LazyRef> outputs = {p.result.value(), moved};
  EXPECT_THROW(evaluate(outputs), Error);
  p.expect_intact();
  EXPECT_FALSE(moved->computed());
  EXPECT_EQ(p.result.to_vector<float>(), std::vector<float>({3, 5, 7}));
}

TEST(Errors, UndefinedTensorUseThrows) {
  Tensor undefined;
  EXPECT_FALSE(undefined.defined());
  EXPECT_THAT(message_of<Error>([&] { undefined.dtype(); }),
              HasSubstr("use of an undefined Tensor"));
  EXPECT_THROW(undefined.sizes(), Error);
  EXPECT_THROW(undefined.exp(), Error);
  EXPECT_THROW(undefined + 1, Error);
  EXPECT_THROW(tensor({1}) + undefined, Error);
  EXPECT_THROW(eval(undefined), Error);
  EXPECT_THROW(undefined.str(), Error);
  EXPECT_THROW(undefined.item<float>(), Error);
  EXPECT_THROW(undefined.is_computed(), Error);
  EXPECT_FALSE(undefined.is_same(tensor({1})));
}

TEST(Errors, VerifierRejectsMalformedGraphs) {
  auto verify_text = [](std::string_view text) { verify(parse_graph(text)); };
  // A result dtype its operands do not give.
  EXPECT_THAT(message_of<VerifierError>([&] {
                verify_text(
                    "graph @main(%0: f32[3] @cpu) {\n"
                    "  %1 = exp %0 : i64[3] @cpu\n"
                    "  return %1\n"
                    "}\n");
              }),
              HasSubstr("%1 = exp (made at <unknown>): result dtype should be f32, is i64"));
  // A result shape its operands do not give.
  EXPECT_THAT(message_of<VerifierError>([&] {
                verify_text(
                    "graph @main(%0: f32[3] @cpu, %1: f32[3] @cpu) {\n"
                    "  %2 = add %0, %1 : f32[4] @cpu\n"
                    "  return %2\n"
                    "}\n");
              }),
              HasSubstr("result shape should be [3], is [4]"));
  // Operands that do not broadcast.
  EXPECT_THAT(message_of<VerifierError>([&] {
                verify_text(
                    "graph @main(%0: f32[3] @cpu, %1: f32[4] @cpu) {\n"
                    "  %2 = add %0, %1 : f32[3] @cpu\n"
                    "  return %2\n"
                    "}\n");
              }),
              HasSubstr("The size of tensor a (3) must match the size of tensor b (4)"));
  // Wrong arity.
  EXPECT_THAT(message_of<VerifierError>([&] {
                verify_text(
                    "graph @main(%0: f32[3] @cpu) {\n"
                    "  %1 = add %0 : f32[3] @cpu\n"
                    "  return %1\n"
                    "}\n");
              }),
              HasSubstr("takes 2 operands, has 1"));
  // A missing attribute.
  EXPECT_THAT(message_of<VerifierError>([&] {
                verify_text(
                    "graph @main() {\n"
                    "  %0 = const : f32[] @cpu\n"
                    "  return %0\n"
                    "}\n");
              }),
              HasSubstr("const needs the attribute 'value'"));

  // Use before definition: the text cannot name a later value, a Graph built in code can.
  Graph graph;
  Node param;
  param.shape = {3};
  graph.add(param);
  Node exp_node;
  exp_node.op = Op::Exp;
  exp_node.shape = {3};
  exp_node.inputs = {2};
  graph.add(exp_node);
  Node neg_node;
  neg_node.op = Op::Neg;
  neg_node.shape = {3};
  neg_node.inputs = {0};
  graph.add(neg_node);
  graph.outputs = {1};
  EXPECT_THAT(message_of<VerifierError>([&] { verify(graph); }),
              HasSubstr("%1 = exp (made at <unknown>): operand %2 is not defined before its use"));
  // The pipeline verifies its input first.
  EXPECT_THROW(run_pipeline(graph, {}), VerifierError);

  // Params after other nodes, and an undefined output.
  Graph late_param;
  late_param.add(neg_node);  // reads %0, itself: also a use before definition
  late_param.nodes[0].inputs = {};
  late_param.nodes[0].op = Op::Arange;
  late_param.nodes[0].dtype = DType::Int64;
  late_param.nodes[0].attrs.set("start", int64_t{0});
  late_param.nodes[0].attrs.set("step", int64_t{1});
  late_param.add(param);
  EXPECT_THAT(message_of<VerifierError>([&] { verify(late_param); }),
              HasSubstr("params must come before every other node"));
  Graph bad_output;
  bad_output.add(param);
  bad_output.outputs = {5};
  EXPECT_THAT(message_of<VerifierError>([&] { verify(bad_output); }),
              HasSubstr("return names %5, which is not defined"));

  // After placement, devices must agree.
  EXPECT_THAT(message_of<VerifierError>([&] {
                verify(parse_graph("graph @main(%0: f32[3] @cuda:0) {\n"
                                   "  %1 = exp %0 : f32[3] @cpu\n"
                                   "  return %1\n"
                                   "}\n"),
                       {.placed = true});
              }),
              HasSubstr("operand %0 is on cuda:0, the node on cpu"));
}

// Sizes that multiply past int64 are a ShapeError, never an overflow: in a reshape (with and
// without an inferred dim), a factory and an expand.
TEST(Errors, ShapesPastInt64AreShapeErrors) {
  const int64_t big = int64_t{1} << 40;
  Tensor x = zeros({2, 3});
  EXPECT_THROW(x.reshape({big, big, 0}), ShapeError);
  EXPECT_THROW(x.reshape({big, big, -1}), ShapeError);
  EXPECT_THROW(zeros({big, big}), ShapeError);
  EXPECT_THROW(zeros({1}).expand({big, big}), ShapeError);
  // No elements, but contiguous strides of 2^80 (the evaluation fuzzer's finding).
  EXPECT_THROW(zeros({big, 0, big}), ShapeError);
  EXPECT_EQ(zeros({big, 0}).numel(), 0);
  // The tensor is still usable.
  EXPECT_EQ(x.reshape({3, 2}).sizes(), (Shape{3, 2}));
}

}  // namespace
}  // namespace lazyfuse
