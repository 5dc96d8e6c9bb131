// Steps: kernel names and counts. (print_schedule is in printer.cc, beside the parser's twin of
// every choice it makes; how a backend lowers a reduction step is codegen/kernel_plan.cc's.)
#include "ir/schedule.h"

#include "absl/strings/str_format.h"

namespace lazyfuse {

std::string Step::kernel_name() const {
  return absl::StrFormat("k_%08x", static_cast<uint32_t>(kernel_key ^ (kernel_key >> 32)));
}

int Schedule::num_kernels() const {
  int count = 0;
  for (const Step& step : steps)
    count += step.kind != StepKind::View && step.kind != StepKind::Transfer;
  return count;
}

}  // namespace lazyfuse
