// The kernel cache: memory, then disk, then NVRTC.
#include "lazyfuse/runtime/kernel_cache.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lazyfuse/codegen/cuda/nvrtc.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/stable_hash.h"
#include "lazyfuse/runtime/cuda/cuda_graphs.h"
#include "lazyfuse/runtime/disk_cache.h"
#include "lazyfuse/runtime/env.h"

namespace lazyfuse::cuda {
namespace {

struct CacheState {
  std::mutex mutex;
  absl::flat_hash_map<std::pair<int, std::string>, CUfunction> functions;  // (device, key)
  KernelCacheStats stats;
};
CacheState& state() {
  static CacheState* s = new CacheState();
  return *s;
}

// The disk cache of the directory env_config().cache_dir names now (tests change it): made, and
// its directory checked, once per directory. Under the cache's mutex.
const DiskCache& disk_cache() {
  static std::map<std::string, std::unique_ptr<DiskCache>>* caches =
      new std::map<std::string, std::unique_ptr<DiskCache>>();
  const std::string& dir = env_config().cache_dir;
  std::unique_ptr<DiskCache>& cache = (*caches)[dir];
  if (cache == nullptr) cache = std::make_unique<DiskCache>(dir);
  return *cache;
}

void dump_source(const CudaSource& source) {
  const EnvConfig& env = env_config();
  if (env.dump_cuda)
    std::cerr << "// ----- CUDA kernel " << source.kernel_name << " -----\n" << source.source;
  if (!env.dump_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(env.dump_dir, ec);
    std::ofstream(std::filesystem::path(env.dump_dir) / (source.kernel_name + ".cu"))
        << source.source;
  }
}

}  // namespace

const DeviceProperties& device_properties(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceProperties> properties;
  std::lock_guard lock(mutex);
  auto it = properties.find(device);
  if (it != properties.end()) return it->second;
  DeviceProperties p;
  CUdevice handle = 0;
  check(driver()->cuDeviceGet(&handle, device), "cuDeviceGet");
  driver()->cuDeviceGetAttribute(&p.major, kAttrComputeCapabilityMajor, handle);
  driver()->cuDeviceGetAttribute(&p.minor, kAttrComputeCapabilityMinor, handle);
  driver()->cuDeviceGetAttribute(&p.multiprocessors, kAttrMultiprocessorCount, handle);
  return properties.emplace(device, p).first->second;
}

CUfunction get_kernel(int device, const std::string& key,
                      const std::function<CudaSource()>& generate) {
  CacheState& s = state();
  std::lock_guard lock(s.mutex);
  auto it = s.functions.find({device, key});
  if (it != s.functions.end()) {
    ++s.stats.memory_hits;
    return it->second;
  }
  check_replayable("a kernel is loaded", false);
  const DeviceProperties& props = device_properties(device);
  const CudaSource source = generate();
  dump_source(source);
  StableHash h;
  h.add(std::string_view(source.source))
      .add(props.major)
      .add(props.minor)
      .add(std::string_view(nvrtc_version()))
      .add(kNvrtcOptionsVersion);
  const std::string file_key =
      absl::StrFormat("%s-%016x-sm_%d%d-nvrtc%s", source.kernel_name, h.value(), props.major,
                      props.minor, nvrtc_version());
  auto started = std::chrono::steady_clock::now();
  const DiskCache& disk = disk_cache();
  bool damaged = false;
  std::vector<char> image = disk.load(file_key + ".cubin", &damaged);
  s.stats.damaged_entries += damaged;
  if (!image.empty()) ++s.stats.disk_hits;
  if (image.empty()) {
    CompiledKernel compiled =
        nvrtc_compile(source.source, source.kernel_name, props.major, props.minor);
    ++s.stats.compiles;
    s.stats.compile_ms += compiled.compile_ms;
    image = std::move(compiled.image);
    started = std::chrono::steady_clock::now();
    disk.store(file_key + ".cubin", image);
  }
  activate(device);
  CUmodule module = nullptr;
  check(driver()->cuModuleLoadData(&module, image.data()), "cuModuleLoadData");
  CUfunction function = nullptr;
  check(driver()->cuModuleGetFunction(&function, module, source.kernel_name.c_str()),
        "cuModuleGetFunction");
  s.stats.load_ms +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  s.functions[{device, key}] = function;
  return function;
}

KernelCacheStats kernel_cache_stats() {
  std::lock_guard lock(state().mutex);
  return state().stats;
}

void reset_kernel_cache_stats() {
  std::lock_guard lock(state().mutex);
  state().stats = {};
}

namespace {
std::atomic<uint64_t> generation{0};
}  // namespace

void clear_memory_kernel_cache() {
  std::lock_guard lock(state().mutex);
  state().functions.clear();
  ++generation;
}

uint64_t kernel_cache_generation() { return generation.load(); }

void count_memory_hit() {
  std::lock_guard lock(state().mutex);
  ++state().stats.memory_hits;
}

}  // namespace lazyfuse::cuda
