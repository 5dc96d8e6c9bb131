// Loading the CUDA driver and making contexts current.
#include "lazyfuse/runtime/cuda/cuda_driver.h"

#include <dlfcn.h>

#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse::cuda {
namespace {

struct Loaded {
  DriverApi api{};
  bool ok = false;
  std::string why_not;
  int version = 0;
};

const Loaded& loaded() {
  static const Loaded state = [] {
    Loaded s;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      s.why_not = "no CUDA driver (libcuda.so.1 not found)";
      return s;
    }
    bool all = true;
    auto load = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr) {
        all = false;
        if (s.why_not.empty()) s.why_not = absl::StrCat("the CUDA driver lacks ", name);
      }
    };
    DriverApi& a = s.api;
    load(a.cuInit, "cuInit");
    load(a.cuDriverGetVersion, "cuDriverGetVersion");
    load(a.cuGetErrorString, "cuGetErrorString");
    load(a.cuDeviceGetCount, "cuDeviceGetCount");
    load(a.cuDeviceGet, "cuDeviceGet");
    load(a.cuDeviceGetName, "cuDeviceGetName");
    load(a.cuDeviceTotalMem, "cuDeviceTotalMem_v2");
    load(a.cuDeviceGetAttribute, "cuDeviceGetAttribute");
    load(a.cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer");
    load(a.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    load(a.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    load(a.cuCtxSetCurrent, "cuCtxSetCurrent");
    load(a.cuCtxSynchronize, "cuCtxSynchronize");
    load(a.cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess");
    load(a.cuMemGetInfo, "cuMemGetInfo_v2");
    load(a.cuMemAlloc, "cuMemAlloc_v2");
    load(a.cuMemFree, "cuMemFree_v2");
    load(a.cuMemcpyHtoD, "cuMemcpyHtoD_v2");
    load(a.cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    load(a.cuMemcpyDtoD, "cuMemcpyDtoD_v2");
    load(a.cuMemcpyPeer, "cuMemcpyPeer");
    load(a.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    load(a.cuMemcpy2DAsync, "cuMemcpy2DAsync_v2");
    load(a.cuModuleLoadData, "cuModuleLoadData");
    load(a.cuModuleUnload, "cuModuleUnload");
    load(a.cuModuleGetFunction, "cuModuleGetFunction");
    load(a.cuLaunchKernel, "cuLaunchKernel");
    load(a.cuEventCreate, "cuEventCreate");
    load(a.cuEventRecord, "cuEventRecord");
    load(a.cuEventSynchronize, "cuEventSynchronize");
    load(a.cuEventElapsedTime, "cuEventElapsedTime");
    load(a.cuEventDestroy, "cuEventDestroy_v2");
    load(a.cuStreamCreate, "cuStreamCreate");
    load(a.cuStreamGetFlags, "cuStreamGetFlags");
    load(a.cuStreamWaitEvent, "cuStreamWaitEvent");
    load(a.cuStreamSynchronize, "cuStreamSynchronize");
    load(a.cuStreamQuery, "cuStreamQuery");
    load(a.cuEventQuery, "cuEventQuery");
    load(a.cuStreamBeginCapture, "cuStreamBeginCapture_v2");
    load(a.cuStreamEndCapture, "cuStreamEndCapture");
    load(a.cuGraphInstantiate, "cuGraphInstantiateWithFlags");
    load(a.cuGraphLaunch, "cuGraphLaunch");
    load(a.cuGraphExecDestroy, "cuGraphExecDestroy");
    load(a.cuGraphDestroy, "cuGraphDestroy");
    if (!all) return s;
    a.cuDriverGetVersion(&s.version);
    if (CUresult r = a.cuInit(0); r != 0) {
      s.why_not = absl::StrCat("cuInit failed (CUresult ", r, "): no usable GPU");
      return s;
    }
    s.ok = true;
    return s;
  }();
  return state;
}

}  // namespace

const DriverApi* driver() { return loaded().ok ? &loaded().api : nullptr; }
std::string why_unavailable() { return loaded().why_not; }
int driver_version() { return loaded().version; }

void check(CUresult result, const char* what) {
  if (result == 0) return;
  const char* message = nullptr;
  if (driver() != nullptr) driver()->cuGetErrorString(result, &message);
  throw CudaError(
      absl::StrCat(what, ": ", message ? message : "unknown error", " (CUresult ", result, ")"));
}

CUcontext activate(int index) {
  const DriverApi* api = driver();
  if (api == nullptr) throw DeviceIndexError(absl::StrCat("no CUDA GPU: ", why_unavailable()));
  // Read on every step: the contexts retained so far are read without a lock (each slot is set
  // once); a slot past them, or a first use, takes it.
  constexpr int kFastSlots = 64;
  static std::atomic<CUcontext> fast[kFastSlots] = {};
  CUcontext context =
      index >= 0 && index < kFastSlots ? fast[index].load(std::memory_order_acquire) : nullptr;
  if (context == nullptr) {
    static std::mutex mutex;
    static std::vector<CUcontext> contexts;
    std::lock_guard lock(mutex);
    if (contexts.size() <= static_cast<size_t>(index)) contexts.resize(index + 1, nullptr);
    if (contexts[index] == nullptr) {
      CUdevice device = 0;
      check(api->cuDeviceGet(&device, index), "cuDeviceGet");
      // The primary context is shared with the CUDA runtime (PyTorch, CuPy) in one process;
      // it is retained for the life of the process.
      check(api->cuDevicePrimaryCtxRetain(&contexts[index], device), "cuDevicePrimaryCtxRetain");
      if (index >= 0 && index < kFastSlots)
        fast[index].store(contexts[index], std::memory_order_release);
    }
    context = contexts[index];
  }
  check(api->cuCtxSetCurrent(context), "cuCtxSetCurrent");
  return context;
}

namespace {
// The guards' streams, by device, on this thread; how many are set, so that the common case (no
// guard) costs one test.
constexpr int kOverrideSlots = 64;
thread_local CUstream overrides[kOverrideSlots] = {};
thread_local int overrides_set = 0;
}  // namespace

CUstream stream_override(int index) {
  return overrides_set > 0 && index >= 0 && index < kOverrideSlots ? overrides[index] : nullptr;
}

CUstream set_stream_override(int index, CUstream stream) {
  if (index < 0 || index >= kOverrideSlots)
    throw CudaError(absl::StrCat("a stream guard for GPU ", index, ": at most ", kOverrideSlots,
                                 " GPUs take one"));
  const CUstream before = overrides[index];
  overrides_set += (stream != nullptr) - (before != nullptr);
  overrides[index] = stream;
  return before;
}

CUstream device_stream(int index) {
  if (overrides_set > 0)
    if (CUstream user = stream_override(index)) return user;
  // Read on every launch: the streams made so far are read without a lock (each slot is set
  // once); a slot past them, or a first use, takes it.
  constexpr int kFastSlots = 64;
  static std::atomic<CUstream> fast[kFastSlots] = {};
  if (index >= 0 && index < kFastSlots)
    if (CUstream stream = fast[index].load(std::memory_order_acquire)) return stream;
  static std::mutex mutex;
  static std::map<int, CUstream> streams;
  std::lock_guard lock(mutex);
  CUstream& stream = streams[index];
  if (stream == nullptr) {
    // Flags 0: a blocking stream, ordered with the legacy default stream both ways.
    check(driver()->cuStreamCreate(&stream, 0), "cuStreamCreate");
    if (index >= 0 && index < kFastSlots) fast[index].store(stream, std::memory_order_release);
  }
  return stream;
}

}  // namespace lazyfuse::cuda
