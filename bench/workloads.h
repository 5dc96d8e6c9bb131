// The fusion benchmark's workloads: each builds its expression from a set of inputs, as a user
// would write it, so a measured evaluation includes building the graph.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <lazyfuse/lazyfuse.h>

namespace lazyfuse::bench {

struct Workload {
  std::string name;
  // Input shapes for n elements (n a power of two >= 2^12).
  std::function<std::vector<Shape>(int64_t n)> shapes;
  std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)> build;
  // Bytes that must move per evaluation, for `element_size`-byte elements: distinct input
  // elements plus outputs (a broadcast input counts once).
  std::function<double(int64_t n, int64_t element_size)> unique_bytes;
};

const std::vector<Workload>& workloads();

}  // namespace lazyfuse::bench
