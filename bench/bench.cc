// Measuring: CUDA events around a batch of back-to-back evaluations (wall clock on the CPU),
// the median over batches after warm-up, inputs rotated among sets large enough together that
// the L2 cache cannot serve them.
#include "bench/bench.h"

#include <immintrin.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/launch_floor.h"
#include "bench/workloads.h"
#include "lazyfuse/codegen/cpu/cpu_kernels.h"
#include "lazyfuse/codegen/cpu/cpu_program.h"
#include "lazyfuse/runtime/backend.h"
#include "lazyfuse/runtime/cuda/cuda_driver.h"
#include "lazyfuse/runtime/env.h"
#include "lazyfuse/runtime/kernel_cache.h"

namespace lazyfuse::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Times `body` `count` times back to back; seconds per call.
class Timer {
 public:
  explicit Timer(const Device& device) : device_(device) {
    if (device_.is_cuda()) {
      cuda::activate(device_.index());
      cuda::check(cuda::driver()->cuEventCreate(&start_, 0), "cuEventCreate");
      cuda::check(cuda::driver()->cuEventCreate(&stop_, 0), "cuEventCreate");
    }
  }
  ~Timer() {
    if (device_.is_cuda()) {
      cuda::driver()->cuEventDestroy(start_);
      cuda::driver()->cuEventDestroy(stop_);
    }
  }
  template <typename F>
  double seconds_per_call(int count, F&& body) {
    if (!device_.is_cuda()) {
      auto begin = Clock::now();
      for (int i = 0; i < count; ++i) body(i);
      return std::chrono::duration<double>(Clock::now() - begin).count() / count;
    }
    cuda::check(cuda::driver()->cuEventRecord(start_, nullptr), "cuEventRecord");
    for (int i = 0; i < count; ++i) body(i);
    cuda::check(cuda::driver()->cuEventRecord(stop_, nullptr), "cuEventRecord");
    cuda::check(cuda::driver()->cuEventSynchronize(stop_), "cuEventSynchronize");
    float ms = 0;
    cuda::check(cuda::driver()->cuEventElapsedTime(&ms, start_, stop_), "cuEventElapsedTime");
    return ms * 1e-3 / count;
  }
  void synchronize() { backend_for(device_).synchronize(device_); }

 private:
  Device device_;
  cuda::CUevent start_ = nullptr, stop_ = nullptr;
};

// Whether two results hold the same bytes: each brought to the CPU as stored (a dense copy),
// then compared whole, which at 2^28 elements takes a fraction of converting every element.
// Where they differ, the caller's element-wise comparison says how.
bool same_bytes(const Tensor& a, const Tensor& b) {
  Tensor host_a = a.cpu(), host_b = b.cpu();
  eval({host_a, host_b});
  const BufferView &x = *host_a.value()->buffer, &y = *host_b.value()->buffer;
  if (x.dtype != y.dtype || x.shape != y.shape || !x.is_contiguous() || !y.is_contiguous())
    return false;
  return std::memcmp(x.data(), y.data(),
                     static_cast<size_t>(numel(x.shape) * dtype_size(x.dtype))) == 0;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Result {
  std::string workload, dtype, mode;
  int64_t n;
  double seconds, bytes;
};

DType parse_bench_dtype(const std::string& name) {
  return name == "bf16" ? kBFloat16 : parse_dtype(name);
}

}  // namespace

int run_bench(const BenchOptions& options) {
  const Device device = resolve_device(Device(options.device));
  Timer timer(device);
  std::vector<Result> results;
  int failures = 0;
  std::vector<const Workload*> chosen;
  for (const Workload& w : workloads())
    if (options.workloads.empty() || std::find(options.workloads.begin(), options.workloads.end(),
                                               w.name) != options.workloads.end())
      chosen.push_back(&w);
  const int total =
      static_cast<int>(chosen.size() * options.dtypes.size() * options.log2_sizes.size());
  int done = 0;
  for (const Workload* workload : chosen) {
    for (const std::string& dtype_name : options.dtypes) {
      const DType dtype = parse_bench_dtype(dtype_name);
      for (int log2 : options.log2_sizes) {
        const int64_t n = int64_t{1} << log2;
        std::fprintf(stderr, "\r[%d/%d] %-12s %-5s 2^%-2d        ", ++done, total,
                     workload->name.c_str(), dtype_name.c_str(), log2);
        std::fflush(stderr);
        const double bytes = workload->unique_bytes(n, dtype_size(dtype));
        // Enough input sets that together they are four times a 60 MB L2.
        const int sets = static_cast<int>(std::clamp(std::ceil(240e6 / bytes), 1.0, 8.0));
        std::vector<std::vector<Tensor>> inputs(sets);
        for (auto& set : inputs) {
          for (const Shape& shape : workload->shapes(n))
            set.push_back(rand(shape, TensorOptions().dtype(dtype).device(device)) + 0.5);
          eval(set);
        }
        // The check: fused and unfused agree (both are compared with float64 references in
        // the test suite; here the point is that the timed code computes the right thing), bit
        // for bit where half types round after every op, as kernels that each store their value
        // do (Note [Half precision in fused kernels] in ir/half_rounding.h).
        {
          HalfRoundingGuard each_op(HalfRounding::EachOp);
          std::vector<Tensor> fused = workload->build(inputs[0]),
                              unfused = workload->build(inputs[0]);
          eval(fused);
          eval(unfused, EvalOptions{.fusion = false});
          for (size_t k = 0; k < fused.size(); ++k) {
            if (same_bytes(fused[k], unfused[k])) continue;
            const std::vector<double> a = fused[k].to_vector<double>(),
                                      b = unfused[k].to_vector<double>();
            // NaN equals NaN here: the same value computed both ways.
            int64_t differ = 0, first = -1;
            double largest = 0;
            for (size_t e = 0; e < a.size(); ++e) {
              if (a[e] == b[e] || (std::isnan(a[e]) && std::isnan(b[e]))) continue;
              if (differ++ == 0) first = static_cast<int64_t>(e);
              largest = std::max(largest, std::abs(a[e] - b[e]) / std::max(std::abs(b[e]), 1e-30));
            }
            if (differ > 0) {
              std::fprintf(stderr,
                           "\n%s %s 2^%d output %zu: fused and unfused differ in %lld of %zu "
                           "elements (first [%lld]: %.9g fused, %.9g unfused; largest relative "
                           "difference %.3g)\n",
                           workload->name.c_str(), dtype_name.c_str(), log2, k,
                           static_cast<long long>(differ), a.size(), static_cast<long long>(first),
                           a[first], b[first], largest);
              ++failures;
            }
          }
        }
        const int per_batch = static_cast<int>(std::clamp<int64_t>((int64_t{1} << 26) / n, 1, 100));
        for (const char* mode : {"fused", "unfused"}) {
          const EvalOptions eval_options{.fusion = std::strcmp(mode, "fused") == 0};
          auto body = [&](int i) {
            std::vector<Tensor> outputs = workload->build(inputs[i % sets]);
            eval(outputs, eval_options);
          };
          timer.seconds_per_call(3, body);  // warm-up: compile, fill the allocator's cache
          std::vector<double> times;
          for (int b = 0; b < options.batches; ++b)
            times.push_back(timer.seconds_per_call(per_batch, body));
          results.push_back({workload->name, dtype_name, mode, n, median(times), bytes});
        }
        // The roof: a copy moving the same bytes (half read, half written); on the CPU, on as
        // many threads as lazyfuse uses. Rotated among as many sources and destinations as the
        // inputs are, so that the copy's bytes come from where the workload's do: one pair
        // copied over and over stays in a cache the rotated inputs outgrow (the 2-core Intel
        // machine's shared L3 is 480 MiB).
        {
          const int64_t copy_elements = static_cast<int64_t>(bytes / 2 / dtype_size(dtype));
          std::vector<BufferView> sources, destinations;
          std::vector<Tensor> source_tensors;
          for (int set = 0; set < sets; ++set) {
            Tensor source = zeros({copy_elements}, TensorOptions().dtype(dtype).device(device)) + 1;
            eval(source);
            source_tensors.push_back(source);
            sources.push_back(*source.value()->buffer);
            destinations.push_back(allocate_buffer(device, dtype, {copy_elements}));
          }
          const size_t copy_bytes = static_cast<size_t>(copy_elements * dtype_size(dtype));
          auto copy = [&](int i) {
            const BufferView &src = sources[i % sets], &dst = destinations[i % sets];
            if (device.is_cuda()) {
              cuda::check(cuda::driver()->cuMemcpyDtoD(
                              reinterpret_cast<cuda::CUdeviceptr>(dst.data()),
                              reinterpret_cast<cuda::CUdeviceptr>(src.data()), copy_bytes),
                          "cuMemcpyDtoD");
            } else {
              // As many threads as lazyfuse's own kernels use, each copying a contiguous part,
              // written as lazyfuse writes a result of that size: past the caches (the kernel
              // table's non-temporal copy) from 16 MiB, else memcpy. glibc's memcpy stores
              // through the caches below a threshold set from the L3's size (here 480 MiB),
              // reading each destination line first, so it was no roof for kernels that stream
              // (Adam at 2^24 ran in 55% of its time, 2026-12-05 17:46).
              const int threads = omp_get_max_threads();
              const size_t part = (copy_bytes / threads + 63) / 64 * 64;
              const bool stream = worth_streaming(static_cast<int64_t>(copy_bytes)) &&
                                  copy_bytes % (64 * static_cast<size_t>(threads)) == 0;
              const CpuApplyFn stream_copy =
                  cpu_kernel_table()
                      .apply_stream[static_cast<int>(Op::Copy)][compute_slot(DType::Float32)];
#pragma omp parallel for num_threads(threads)
              for (int t = 0; t < threads; ++t) {
                const size_t begin = std::min(copy_bytes, t * part);
                const size_t end = std::min(copy_bytes, begin + part);
                std::byte* to = static_cast<std::byte*>(dst.data()) + begin;
                const std::byte* from = static_cast<const std::byte*>(src.data()) + begin;
                if (stream && stream_copy != nullptr) {
                  const void* in[1] = {from};
                  stream_copy(in, to, static_cast<int64_t>((end - begin) / sizeof(float)));
                } else {
                  std::memcpy(to, from, end - begin);
                }
              }
              if (stream) _mm_sfence();
            }
          };
          timer.seconds_per_call(3, copy);
          std::vector<double> times;
          for (int b = 0; b < options.batches; ++b)
            times.push_back(timer.seconds_per_call(per_batch, copy));
          results.push_back({workload->name, dtype_name, "roof", n, median(times), bytes});
        }
      }
    }
  }
  std::fprintf(stderr, "\r%60s\r", "");

  // Host cost: (z + 2).exp() * y on 4096 elements, its kernel cached, back to back; on a GPU,
  // batches of a bare cuLaunchKernel of the same computation alternate with them (the floor,
  // bench/launch_floor.h), so both see the machine in the same state.
  double host_us = 0, floor_us = 0;
  {
    Tensor y = rand({4096}, device), z = rand({4096}, device), out = zeros({4096}, device);
    eval({y, z, out});
    auto body = [&](int) { eval((z + 2).exp() * y); };
    timer.seconds_per_call(10, body);
    std::optional<LaunchFloor> floor;
    if (device.is_cuda()) {
      auto address = [](const Tensor& t) {
        return reinterpret_cast<uint64_t>(t.value()->buffer->data());
      };
      floor.emplace(device.index(), address(y), address(z), address(out), 4096);
    }
    auto per_call_us = [&](auto&& call) {
      auto begin = Clock::now();
      for (int i = 0; i < 1000; ++i) call(i);
      const double us =
          std::chrono::duration<double, std::micro>(Clock::now() - begin).count() / 1000;
      timer.synchronize();
      return us;
    };
    std::vector<double> times, floor_times;
    for (int b = 0; b < options.batches; ++b) {
      times.push_back(per_call_us(body));
      if (floor) floor_times.push_back(per_call_us([&](int) { floor->launch(); }));
    }
    host_us = median(times);
    if (floor) floor_us = median(floor_times);
  }

  // Compile latency of a new fused kernel: cold (NVRTC and load, empty disk cache), warm (from
  // the disk cache), hot (in memory).
  double cold_ms = 0, warm_ms = 0, hot_ms = 0;
  if (device.is_cuda()) {
    std::string dir =
        (std::filesystem::temp_directory_path() / absl::StrCat("lazyfuse-bench-", getpid()))
            .string();
    set_cache_dir(dir);
    Tensor y = rand({4096}, device);
    eval(y);
    auto once = [&](double constant) {
      auto begin = Clock::now();
      eval((y + constant).exp() * y);
      timer.synchronize();
      return std::chrono::duration<double, std::milli>(Clock::now() - begin).count();
    };
    std::vector<double> cold, warm, hot;
    for (int i = 0; i < 5; ++i) {
      const double constant = 3.25 + i;  // a new constant is a new kernel
      cold.push_back(once(constant));
      cuda::clear_memory_kernel_cache();
      warm.push_back(once(constant));
      hot.push_back(once(constant));
    }
    cold_ms = median(cold);
    warm_ms = median(warm);
    hot_ms = median(hot);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  // The table.
  std::printf("%-12s %-5s %6s %10s %10s %10s %9s %9s\n", "workload", "dtype", "n", "fused us",
              "unfused us", "roof us", "fused GB/s", "% roof");
  for (size_t i = 0; i + 2 < results.size(); i += 3) {
    const Result &fused = results[i], &unfused = results[i + 1], &roof = results[i + 2];
    std::printf("%-12s %-5s 2^%-4d %10.1f %10.1f %10.1f %9.0f %8.1f%%\n", fused.workload.c_str(),
                fused.dtype.c_str(), static_cast<int>(std::log2(fused.n)), fused.seconds * 1e6,
                unfused.seconds * 1e6, roof.seconds * 1e6, fused.bytes / fused.seconds / 1e9,
                100 * roof.seconds / fused.seconds);
  }
  std::printf("host cost per evaluation, (z + 2).exp() * y on 4096 elements: %.2f us", host_us);
  if (device.is_cuda()) std::printf(" (a bare cuLaunchKernel: %.2f us)", floor_us);
  std::printf("\n");
  if (device.is_cuda())
    std::printf(
        "new fused kernel: cold %.2f ms (NVRTC and load), warm %.3f ms (disk cache), hot %.3f ms\n",
        cold_ms, warm_ms, hot_ms);

  if (!options.json_path.empty()) {
    std::ofstream json(options.json_path);
    char date[64];
    std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::string device_name = device.str();
    if (device.is_cuda()) {
      DeviceReport report = device_report();
      device_name = absl::StrCat(report.gpus.at(device.index()).name, " (", device.str(),
                                 "), driver ", report.driver_version);
    }
    json << "{\n  \"tool\": \"lazyfuse\",\n  \"date\": \"" << date << "\",\n  \"device\": \""
         << device_name << "\",\n  \"host_cost_us\": " << host_us;
    if (device.is_cuda()) json << ",\n  \"launch_floor_us\": " << floor_us;
    json << ",\n  \"compile_ms\": {\"cold\": " << cold_ms << ", \"warm\": " << warm_ms
         << ", \"hot\": " << hot_ms << "},\n  \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      json << absl::StrFormat(
          "    {\"workload\": \"%s\", \"dtype\": \"%s\", \"n\": %d, \"mode\": \"%s\", \"us\": "
          "%.3f, \"bytes\": %.0f}%s\n",
          r.workload, r.dtype, r.n, r.mode, r.seconds * 1e6, r.bytes,
          i + 1 < results.size() ? "," : "");
    }
    json << "  ]\n}\n";
  }
  return failures ? 1 : 0;
}

}  // namespace lazyfuse::bench
