// The lazyfuse command-line tool: `lazyfuse devices` lists devices as nvidia-smi does;
// `lazyfuse opt` runs passes over IR text as mlir-opt does.
#include <fstream>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>

#include "bench/bench.h"
#include "ir/errors.h"
#include "ir/passes/passes.h"
#include "ir/verifier.h"
#include "runtime/devices.h"

namespace {

std::string read_input(const std::string& path) {
  if (path == "-") {
    std::ostringstream text;
    text << std::cin.rdbuf();
    return text.str();
  }
  std::ifstream file(path);
  if (!file) throw lazyfuse::Error("cannot open '" + path + "'");
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

int run_opt(const std::string& path, const std::string& passes, bool print_after_all,
            const std::vector<std::string>& print_after) {
  std::string text = read_input(path);
  std::string name = path == "-" ? "<stdin>" : path;
  lazyfuse::Graph graph;
  try {
    graph = lazyfuse::parse_graph(text);
  } catch (const lazyfuse::ParseError& e) {
    std::cerr << name << ":" << e.what() << "\n";
    return 1;
  }
  lazyfuse::PipelineOptions options;
  if (!passes.empty()) {
    std::stringstream list(passes);
    for (std::string pass; std::getline(list, pass, ',');) options.only.push_back(pass);
  }
  bool any_after = print_after_all || !print_after.empty();
  options.after_pass = [&](std::string_view pass, const std::string& ir) {
    bool wanted = print_after_all ||
                  std::find(print_after.begin(), print_after.end(), pass) != print_after.end();
    if (wanted) std::cout << "// -----// IR Dump After " << pass << " //----- //\n" << ir;
  };
  try {
    lazyfuse::Schedule schedule = lazyfuse::run_pipeline(std::move(graph), options);
    if (!any_after) {
      bool fused = options.only.empty() || std::find(options.only.begin(), options.only.end(),
                                                     "fusion") != options.only.end();
      std::cout << (fused ? lazyfuse::print_schedule(schedule)
                          : lazyfuse::print_graph(schedule.graph));
    }
  } catch (const lazyfuse::Error& e) {
    std::cerr << name << ": error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lazyfuse: lazy tensors, fused kernels. Inspect devices, IR and passes."};
  app.require_subcommand(1);

  CLI::App* devices =
      app.add_subcommand("devices", "List CUDA devices and the CPU, like nvidia-smi");

  CLI::App* opt =
      app.add_subcommand("opt", "Parse IR text, run passes, print the IR (like mlir-opt)");
  std::string input;
  std::string passes;
  bool print_after_all = false;
  std::vector<std::string> print_after;
  opt->add_option("file", input, "IR file, or - for standard input")->required();
  opt->add_option("--passes", passes,
                  "Comma-separated passes to run: placement,cse,dce,fusion (default: all)");
  opt->add_flag("--print-after-all", print_after_all, "Print the IR after every pass");
  opt->add_option("--print-after", print_after, "Print the IR after the named pass")
      ->delimiter(',');

  CLI::App* bench =
      app.add_subcommand("bench", "Run the fusion benchmark: fused, unfused and the copy roof");
  lazyfuse::bench::BenchOptions bench_options;
  bench->add_option("--device", bench_options.device, "cuda:N or cpu")->capture_default_str();
  bench->add_option("--sizes", bench_options.log2_sizes, "log2 of the element counts")
      ->delimiter(',')
      ->capture_default_str();
  bench->add_option("--dtypes", bench_options.dtypes, "f32, bf16, f16, f64")
      ->delimiter(',')
      ->capture_default_str();
  bench
      ->add_option("--workloads", bench_options.workloads,
                   "exp_mul, gelu, bias_relu, softmax, sum_squares, chain16, adam (default: all)")
      ->delimiter(',');
  bench->add_option("--json", bench_options.json_path, "write the results here");
  bench->add_option("--batches", bench_options.batches, "timed batches (the median is reported)")
      ->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  try {
    if (*devices) {
      std::cout << lazyfuse::format_device_report(lazyfuse::device_report());
      return 0;
    }
    if (*opt) return run_opt(input, passes, print_after_all, print_after);
    if (*bench) return lazyfuse::bench::run_bench(bench_options);
  } catch (const lazyfuse::Error& e) {
    std::cerr << "lazyfuse: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
