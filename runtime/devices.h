// The devices this process can use: the host, and the CUDA GPUs the driver reports (through
// dlopen("libcuda.so.1"), so one binary runs with and without a GPU; CUDA_VISIBLE_DEVICES is
// honoured by the driver itself).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lazyfuse/ir/device.h"

namespace lazyfuse {

namespace cuda {
// 0 when there is no driver or no GPU: never an error.
int device_count();
bool is_available();
// A CUDA device with its index resolved (the CUDA backend's resolve).
Device resolve(const Device& device);
}  // namespace cuda

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int64_t total_bytes = 0;
  int64_t free_bytes = -1;  // -1 when it could not be read
};

struct DeviceReport {
  std::string driver_version;  // "" when there is no driver
  std::string why_none;        // why no GPU is listed, when none is
  std::vector<CudaDeviceInfo> gpus;
  int cpu_cores = 0;
  int64_t host_memory_bytes = 0;
};
DeviceReport device_report();
// The report as nvidia-smi-like text.
std::string format_device_report(const DeviceReport& report);

// Gives "cuda" its index (the current device, 0) and checks that the device exists, through
// the backend of its type; throws DeviceIndexError saying how many there are.
Device resolve_device(const Device& device);

}  // namespace lazyfuse
