// Loading the CPU JIT library and calling it (codegen/cpu/cpu_jit.h).
#include <dlfcn.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cpu/cpu_jit.h"
#include "lazyfuse/codegen/cpu/cpu_kernels.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {
namespace {

CpuJitMode mode_from_environment() {
  const char* value = std::getenv("LAZYFUSE_CPU_JIT");
  if (value == nullptr || *value == '\0') return CpuJitMode::Hot;
  const std::string_view text = value;
  if (text == "0") return CpuJitMode::Off;
  if (text == "1") return CpuJitMode::Hot;
  if (text == "always") return CpuJitMode::Always;
  throw UnsupportedError(
      absl::StrCat("LAZYFUSE_CPU_JIT=", std::string(text), ": expected 0, 1 or always"));
}

std::atomic<int> mode{-1};

struct Library {
  LfJitCompileFn compile = nullptr;
  LfJitLanesFn lanes = nullptr;
  LfJitReleaseFn release = nullptr;
  std::string error;  // why it did not load
};

// Where the library may be: named by LAZYFUSE_CPU_JIT_LIBRARY; beside the running program's
// lib/ (a build tree's bin/ and lib/, or an installed prefix); where this build put it; where
// it was to be installed; the loader's own search path.
std::vector<std::string> candidates() {
  constexpr const char* kName = "liblazyfuse_cpu_jit.so";
  std::vector<std::string> paths;
  if (const char* named = std::getenv("LAZYFUSE_CPU_JIT_LIBRARY")) return {named};
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) paths.push_back((exe.parent_path().parent_path() / "lib" / kName).string());
#ifdef LAZYFUSE_BUILD_LIB_DIR
  paths.push_back(absl::StrCat(LAZYFUSE_BUILD_LIB_DIR, "/", kName));
#endif
#ifdef LAZYFUSE_INSTALL_LIB_DIR
  paths.push_back(absl::StrCat(LAZYFUSE_INSTALL_LIB_DIR, "/", kName));
#endif
  paths.push_back(kName);
  return paths;
}

const Library& library() {
  static const Library loaded = [] {
    Library lib;
    for (const std::string& path : candidates()) {
      if (path.find('/') != std::string::npos && !std::filesystem::exists(path)) continue;
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        const char* why = dlerror();
        absl::StrAppend(&lib.error, lib.error.empty() ? "" : "; ", why != nullptr ? why : path);
        continue;
      }
      lib.compile = reinterpret_cast<LfJitCompileFn>(dlsym(handle, "lazyfuse_cpu_jit_compile"));
      lib.lanes = reinterpret_cast<LfJitLanesFn>(dlsym(handle, "lazyfuse_cpu_jit_lanes"));
      lib.release = reinterpret_cast<LfJitReleaseFn>(dlsym(handle, "lazyfuse_cpu_jit_release"));
      const auto version =
          reinterpret_cast<LfJitAbiVersionFn>(dlsym(handle, "lazyfuse_cpu_jit_abi_version"));
      const int32_t abi = version != nullptr ? version() : 1;
      if (lib.compile != nullptr && lib.lanes != nullptr && lib.release != nullptr &&
          abi == LF_JIT_ABI_VERSION) {
        lib.error.clear();
        return lib;
      }
      // A library from another build would read this program's instructions wrongly.
      absl::StrAppend(&lib.error, lib.error.empty() ? "" : "; ", path,
                      abi != LF_JIT_ABI_VERSION
                          ? absl::StrCat(" speaks the JIT's interface version ", abi,
                                         ", this program ", LF_JIT_ABI_VERSION)
                          : std::string(" lacks lazyfuse_cpu_jit_compile"));
      lib.compile = nullptr;
      lib.lanes = nullptr;
      lib.release = nullptr;
    }
    if (lib.error.empty()) lib.error = "liblazyfuse_cpu_jit.so not found";
    return lib;
  }();
  return loaded;
}

std::mutex stats_mutex;
CpuJitStats stats;
// Runs are counted on every call of compiled code, from every thread: a counter per thread slot,
// each on its own cache line, since one counter that every core wrote was a large part of a sum
// of squares' profile. A slot's thread adds with a load and a store rather than a locked add
// (docs/benchmarks.md, "The CPU JIT"): past 64 threads two may share a slot and lose a count,
// which a statistic can afford.
struct alignas(64) RunCounter {
  std::atomic<int64_t> count{0};
};
constexpr int kRunCounters = 64;
RunCounter run_counters[kRunCounters];
RunCounter& my_run_counter() {
  static std::atomic<int> next{0};
  thread_local RunCounter& mine = run_counters[next.fetch_add(1) % kRunCounters];
  return mine;
}

}  // namespace

CpuJitMode cpu_jit_mode() {
  int m = mode.load(std::memory_order_relaxed);
  if (m < 0) {
    m = static_cast<int>(mode_from_environment());
    mode.store(m, std::memory_order_relaxed);
  }
  return static_cast<CpuJitMode>(m);
}

void set_cpu_jit_mode(CpuJitMode m) { mode.store(static_cast<int>(m)); }

bool cpu_jit_available() { return library().compile != nullptr; }
std::string cpu_jit_unavailable_reason() { return library().error; }

const char* cpu_jit_isa() { return cpu_kernel_table().isa; }

int32_t cpu_jit_lanes(bool double_precision) {
  const Library& lib = library();
  return lib.lanes == nullptr ? 0 : lib.lanes(cpu_jit_isa(), double_precision ? 1 : 0);
}

const char* cpu_jit_function(Op op, bool double_precision) {
  static const auto names = [] {
    std::array<std::array<const char*, 2>, kNumOps> table{};
#define LF_ELEMENTWISE(Name, mnemonic, arity, dtype_rule, bool_ok, expression) \
  table[static_cast<int>(Op::Name)] = {"lf_jit_" #Name "_f32", "lf_jit_" #Name "_f64"};
#include "lazyfuse/ir/ops.def"
    return table;
  }();
  return names[static_cast<int>(op)][double_precision ? 1 : 0];
}

CpuJitKernel cpu_jit_compile(const LfJitProgram& program) {
  const Library& lib = library();
  CpuJitKernel compiled;
  const char* error = lib.compile == nullptr
                          ? lib.error.c_str()
                          : lib.compile(&program, &compiled.kernel, &compiled.code);
  std::lock_guard<std::mutex> lock(stats_mutex);
  if (error != nullptr) {
    ++stats.failures;
    stats.last_failure = error;
    return {};
  }
  ++stats.compiled;
  if (program.num_phases > 0) ++stats.row_programs;
  return compiled;
}

void cpu_jit_release(const CpuJitKernel& kernel) {
  if (kernel.code == nullptr) return;
  library().release(kernel.code);
  std::lock_guard<std::mutex> lock(stats_mutex);
  ++stats.released;
}

CpuJitStats cpu_jit_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex);
  CpuJitStats copy = stats;
  for (const RunCounter& counter : run_counters) copy.runs += counter.count.load();
  return copy;
}

void reset_cpu_jit_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex);
  stats = {};
  for (RunCounter& counter : run_counters) counter.count.store(0);
}

void count_cpu_jit_run() {
  std::atomic<int64_t>& count = my_run_counter().count;
  count.store(count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

}  // namespace lazyfuse
