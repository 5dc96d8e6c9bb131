// NVRTC through dlopen.
#include "lazyfuse/codegen/cuda/nvrtc.h"

#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse {
namespace {

using nvrtcResult = int;
using nvrtcProgram = struct _nvrtcProgram*;

struct Nvrtc {
  bool ok = false;
  std::string why_not;
  int major = 0, minor = 0;
  std::vector<int> archs;
  nvrtcResult (*version)(int*, int*);
  const char* (*get_error_string)(nvrtcResult);
  nvrtcResult (*create_program)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                                const char* const*);
  nvrtcResult (*compile_program)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*get_log_size)(nvrtcProgram, size_t*);
  nvrtcResult (*get_log)(nvrtcProgram, char*);
  nvrtcResult (*get_cubin_size)(nvrtcProgram, size_t*);
  nvrtcResult (*get_cubin)(nvrtcProgram, char*);
  nvrtcResult (*get_ptx_size)(nvrtcProgram, size_t*);
  nvrtcResult (*get_ptx)(nvrtcProgram, char*);
  nvrtcResult (*destroy_program)(nvrtcProgram*);
  nvrtcResult (*get_num_supported_archs)(int*);
  nvrtcResult (*get_supported_archs)(int*);
};

const Nvrtc& nvrtc() {
  static const Nvrtc n = [] {
    Nvrtc n;
    void* lib = nullptr;
    // The loader path first (the GPU machine has it there), then the toolkit's own directory.
    for (const char* name :
         {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so.13",
          "/usr/local/cuda/lib64/libnvrtc.so"}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (lib == nullptr) {
      n.why_not = "NVRTC not found (libnvrtc.so.13 is in the CUDA toolkit, /usr/local/cuda/lib64)";
      return n;
    }
    bool all = true;
    auto load = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      all &= fn != nullptr;
    };
    load(n.version, "nvrtcVersion");
    load(n.get_error_string, "nvrtcGetErrorString");
    load(n.create_program, "nvrtcCreateProgram");
    load(n.compile_program, "nvrtcCompileProgram");
    load(n.get_log_size, "nvrtcGetProgramLogSize");
    load(n.get_log, "nvrtcGetProgramLog");
    load(n.get_cubin_size, "nvrtcGetCUBINSize");
    load(n.get_cubin, "nvrtcGetCUBIN");
    load(n.get_ptx_size, "nvrtcGetPTXSize");
    load(n.get_ptx, "nvrtcGetPTX");
    load(n.destroy_program, "nvrtcDestroyProgram");
    load(n.get_num_supported_archs, "nvrtcGetNumSupportedArchs");
    load(n.get_supported_archs, "nvrtcGetSupportedArchs");
    if (!all) {
      n.why_not = "NVRTC lacks an entry point lazyfuse needs";
      return n;
    }
    n.version(&n.major, &n.minor);
    int count = 0;
    n.get_num_supported_archs(&count);
    n.archs.resize(count);
    if (count) n.get_supported_archs(n.archs.data());
    n.ok = true;
    return n;
  }();
  return n;
}

// Saves the source of a failed compile where the user can read it.
std::string save_source(const std::string& source, const std::string& name) {
  const char* dir = std::getenv("LAZYFUSE_DUMP_DIR");
  std::filesystem::path path =
      dir ? std::filesystem::path(dir)
          : std::filesystem::temp_directory_path() / absl::StrCat("lazyfuse-", getpid());
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  path /= name + ".cu";
  std::ofstream(path) << source;
  return path.string();
}

}  // namespace

bool nvrtc_available() { return nvrtc().ok; }
std::string nvrtc_unavailable_reason() { return nvrtc().why_not; }
std::string nvrtc_version() {
  return nvrtc().ok ? absl::StrCat(nvrtc().major, ".", nvrtc().minor) : "";
}

CompiledKernel nvrtc_compile(const std::string& source, const std::string& name, int major,
                             int minor) {
  const Nvrtc& n = nvrtc();
  if (!n.ok) throw UnsupportedError(absl::StrCat("compiling CUDA source: ", n.why_not));
  auto started = std::chrono::steady_clock::now();
  CompiledKernel kernel;
  kernel.name = name;
  int arch = major * 10 + minor;
  bool known = false;
  int best = 0;
  for (int a : n.archs) {
    known |= a == arch;
    if (a <= arch) best = std::max(best, a);
  }
  if (!known && best == 0)
    throw CompileError(
        absl::StrCat("NVRTC ", nvrtc_version(), " supports no architecture at or below sm_", arch));
  kernel.is_cubin = known;
  kernel.arch = known ? absl::StrCat("sm_", arch) : absl::StrCat("compute_", best);
  std::string arch_option = absl::StrCat("--gpu-architecture=", kernel.arch);
  // No contraction of a multiply and an add into one FMA: each op rounds its result, as it does
  // in a kernel of its own, so fusion never changes a result (docs/design.md, Note [Rounding
  // after every op]). Fast-math kernels, which define LF_FAST_MATH first, may contract.
  const bool fast_math = source.starts_with("#define LF_FAST_MATH");
  const char* options[] = {arch_option.c_str(), "--std=c++17",
                           "--device-as-default-execution-space",
                           fast_math ? "--fmad=true" : "--fmad=false"};
  nvrtcProgram program = nullptr;
  std::string file = name + ".cu";
  if (int r = n.create_program(&program, source.c_str(), file.c_str(), 0, nullptr, nullptr); r != 0)
    throw CompileError(absl::StrCat("nvrtcCreateProgram: ", n.get_error_string(r)));
  int result = n.compile_program(program, 4, options);
  size_t log_size = 0;
  n.get_log_size(program, &log_size);
  std::string log(log_size, '\0');
  if (log_size) n.get_log(program, log.data());
  if (result != 0) {
    n.destroy_program(&program);
    std::string path = save_source(source, name);
    throw CompileError(absl::StrCat("NVRTC could not compile kernel ", name, " for ", kernel.arch,
                                    ": ", n.get_error_string(result), "\n", log, "source: ", path));
  }
  size_t size = 0;
  if (known) {
    n.get_cubin_size(program, &size);
    kernel.image.resize(size);
    n.get_cubin(program, kernel.image.data());
  } else {
    n.get_ptx_size(program, &size);
    kernel.image.resize(size);
    n.get_ptx(program, kernel.image.data());
  }
  n.destroy_program(&program);
  kernel.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  return kernel;
}

}  // namespace lazyfuse
