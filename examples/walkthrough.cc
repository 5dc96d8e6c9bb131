// The walkthrough: what the textbook section "computing on the GPU" shows in PyTorch, done with
// lazyfuse. Each step names the step of the section. Without a GPU (or a second one) a step says
// so and the walkthrough goes on with the CPU.
#include <iostream>

#include <lazyfuse/lazyfuse.h>

namespace lf = lazyfuse;

namespace {

void heading(const char* text) { std::cout << "\n== " << text << " ==\n"; }

}  // namespace

int main() {
  heading("1. The devices (nvidia-smi)");
  std::cout << lf::format_device_report(lf::device_report());

  heading("2-3. cpu, cuda, cuda:i and the device count");
  const int gpus = lf::cuda::device_count();
  std::cout << lf::Device("cpu") << " " << lf::Device("cuda") << " " << lf::Device("cuda:1")
            << "\n";
  std::cout << "cuda::device_count() = " << gpus << "\n";
  // The device the GPU steps use: the first GPU, or the CPU when there is none.
  const lf::Device gpu0 = gpus > 0 ? lf::Device("cuda:0") : lf::Device("cpu");
  const lf::Device gpu1 = gpus > 1 ? lf::Device("cuda:1") : gpu0;
  if (gpus == 0) std::cout << "No GPU here: the GPU steps below run on the CPU.\n";
  try {
    lf::Tensor missing = lf::ones({1}, lf::Device("cuda:" + std::to_string(gpus)));
  } catch (const lf::DeviceIndexError& e) {
    std::cout << "asking for cuda:" << gpus << ": " << e.what() << "\n";
  }

  heading("4. A tensor on the CPU");
  lf::Tensor x = lf::tensor({1., 2., 3.});
  std::cout << "x = " << x << "\nx.device() = " << x.device() << "\n";

  heading("5. To the GPU");
  lf::Tensor x_gpu = x.to(gpu0);
  std::cout << "x.to(" << gpu0 << ") = " << x_gpu << "\n";
  std::cout << "memory in use on " << gpu0 << ": " << lf::memory_stats(gpu0).allocated_bytes
            << " bytes\n";

  heading("6. Random numbers made on the second GPU");
  if (gpus < 2) std::cout << "(no second GPU: made on " << gpu1 << ")\n";
  lf::manual_seed(0);
  std::cout << "rand({2, 3}, " << gpu1 << ") = " << lf::rand({2, 3}, gpu1) << "\n";

  heading("7-8. Copies, and .to() to the same device");
  lf::Tensor y = x.to(gpu0);
  lf::Tensor z = x.to(gpu0);
  std::cout << "y.to(" << gpu0 << ").is_same(y) = " << std::boolalpha << y.to(gpu0).is_same(y)
            << "\n";

  heading("9. (z + 2).exp() * y: one fused kernel where the data is");
  lf::Tensor result = (z + 2).exp() * y;
  std::cout << "pending IR:\n" << result.ir();
  std::cout << "after the passes:\n" << result.fused_ir();
  lf::reset_eval_stats();
  std::cout << "result = " << result << "\n";
  std::cout << "computed by " << lf::eval_stats().kernels << " kernel"
            << (lf::eval_stats().kernels == 1 ? "" : "s")
            << (gpus > 0 ? ", generated as CUDA source and compiled by NVRTC"
                         : ", a fused CPU program")
            << "\n";

  heading("10. Mixing devices is an error");
  lf::Tensor on_cpu = lf::tensor({1., 2., 3.});
  lf::Tensor on_gpu = on_cpu.to(gpu0);
  if (gpus == 0) {
    std::cout << "(no GPU: both operands are on the CPU, so nothing to reject)\n";
  } else {
    lf::Tensor mixed = on_cpu + on_gpu;  // builds the node; the placement pass rejects it
    try {
      std::cout << mixed << "\n";
    } catch (const lf::DeviceMismatchError& e) {
      std::cout << "DeviceMismatchError: " << e.what() << "\n";
    }
  }

  heading("11. A model moved to the GPU");
  lf::manual_seed(0);
  lf::nn::Sequential net(lf::nn::Linear(3, 1));
  net.to(gpu0);
  std::cout << net << "\n";

  heading("12. The forward pass runs where the parameters are");
  std::cout << "net(y) = " << net(y) << "\n";
  auto linear = net.at<lf::nn::Linear>(0);
  std::cout << "net[0].weight = " << linear->weight()
            << "\nnet[0].weight.device() = " << linear->weight().device() << std::endl;
  return 0;
}
