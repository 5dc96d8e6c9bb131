// The lazyfuse command-line tool: devices (like nvidia-smi), opt (like mlir-opt), codegen,
// compile, run, dot, bench, fuzz and launch. Each subcommand lives in tools/cmd_*.cc (bench in
// bench/).
#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>

#include "bench/bench.h"
#include "lazyfuse/codegen/cuda/nvrtc.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/passes/passes.h"
#include "lazyfuse/runtime/devices.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  namespace tools = lazyfuse::tools;
  CLI::App app{
      "lazyfuse: lazy tensors, fused kernels. Inspect devices, IR, passes and generated code."};
  app.require_subcommand(1);
  app.footer(
      "\n`lazyfuse SUBCOMMAND --help` gives each subcommand's options.\n\n"
      "Examples:\n"
      "  lazyfuse devices\n"
      "  lazyfuse opt examples/ir/seed.ir --print-after=fusion\n"
      "  lazyfuse codegen examples/ir/seed.ir --target=cpu\n"
      "  lazyfuse run examples/ir/seed.ir --device=cpu --check\n"
      "  lazyfuse bench --device=cpu --sizes 20 --workloads softmax\n"
      "  lazyfuse fuzz --device=cpu --graphs=1000\n"
      "  lazyfuse launch --nproc=2 build/bin/mlp_classifier --distributed\n\n"
      "Environment (the README lists all): LAZYFUSE_DUMP=ir,fusion,cuda,jit prints the IR, the\n"
      "fused kernels, the CUDA sources and the CPU JIT's loops; LAZYFUSE_FUSION=0 runs one kernel\n"
      "per op; LAZYFUSE_CACHE_DIR is the kernel disk cache; LAZYFUSE_CPU_JIT=0|1|always.");

  CLI::App* devices =
      app.add_subcommand("devices", "List the GPUs (like nvidia-smi), NVRTC and the CPU");

  CLI::App* opt =
      app.add_subcommand("opt", "Parse IR text, run passes, print the IR (like mlir-opt)");
  std::string file, passes;
  bool print_after_all = false;
  std::vector<std::string> print_after;
  opt->add_option("file", file, "IR file, or - for standard input")->required();
  // expected(0, 1): `--passes=` (or a bare `--passes`) is an empty list, which runs no pass,
  // instead of taking the file name that follows as its value.
  CLI::Option* passes_option =
      opt->add_option("--passes", passes,
                      "Comma-separated passes: " + lazyfuse::pass_names(",") +
                          " (default: all; empty: none, only parse, verify and print)")
          ->expected(0, 1);
  opt->add_flag("--print-after-all", print_after_all, "Print the IR after every pass");
  opt->add_option("--print-after", print_after, "Print the IR after the named pass")
      ->delimiter(',');

  CLI::App* codegen = app.add_subcommand("codegen", "Print the generated source of each kernel");
  std::string target = "cuda";
  bool with_prologue = false;
  codegen->add_option("file", file, "IR file, or -")->required();
  codegen->add_option("--target", target, "cuda (CUDA source) or cpu (the CPU block program)")
      ->capture_default_str();
  codegen->add_flag("--with-prologue", with_prologue,
                    "Include the fixed prologue every CUDA kernel starts with");

  CLI::App* compile = app.add_subcommand(
      "compile", "Compile each kernel with NVRTC (no GPU needed): time and size");
  std::string arch = "sm_90";
  compile->add_option("file", file, "IR file, or -")->required();
  compile->add_option("--arch", arch, "GPU architecture")->capture_default_str();

  CLI::App* run =
      app.add_subcommand("run", "Evaluate a graph on seeded random inputs and print its outputs");
  std::string device;
  uint64_t seed = 0;
  bool check = false, check_unfused = false, check_cpu = false;
  run->add_option("file", file, "IR file, or -")->required();
  run->add_option("--device", device,
                  "cpu or cuda:N for every node (default: the devices in the file)");
  run->add_option("--seed", seed, "Seed of the random inputs")->capture_default_str();
  CLI::Option* check_flag =
      run->add_flag("--check", check,
                    "Compare with the graph evaluated in float64 on the CPU; exit 1 on a mismatch");
  CLI::Option* check_unfused_flag =
      run->add_flag("--check-unfused", check_unfused,
                    "Compare with the same graph evaluated unfused on its own devices, bit for "
                    "bit; exit 1 on a mismatch")
          ->excludes(check_flag);
  run->add_flag("--check-cpu", check_cpu,
                "Compare with the same graph evaluated unfused on the CPU: bit for bit on the "
                "CPU, within the dtype's tolerance on a GPU; exit 1 on a mismatch")
      ->excludes(check_flag)
      ->excludes(check_unfused_flag);

  CLI::App* dot = app.add_subcommand("dot", "The graph as Graphviz DOT, fused kernels as clusters");
  bool fused = false;
  std::string output;
  dot->add_option("file", file, "IR file, or -")->required();
  dot->add_flag("--fused", fused, "Draw the fused kernels as clusters");
  dot->add_option("-o,--output", output,
                  "Write FILE.svg or FILE.png (through Graphviz's dot) or FILE.dot");

  CLI::App* bench =
      app.add_subcommand("bench", "Run the fusion benchmark: fused, unfused and the copy roof");
  lazyfuse::bench::BenchOptions bench_options;
  bench->add_option("--device", bench_options.device, "cuda:N or cpu")->capture_default_str();
  bench->add_option("--sizes", bench_options.log2_sizes, "log2 of the element counts")
      ->delimiter(',');
  bench->add_option("--dtypes", bench_options.dtypes, "f32, bf16, f16, f64")->delimiter(',');
  bench
      ->add_option("--workloads", bench_options.workloads,
                   "exp_mul, gelu, bias_relu, softmax, sum_squares, chain16, adam, layernorm, "
                   "layernorm4k, rmsnorm, rmsnorm4k, log_softmax (default: all)")
      ->delimiter(',');
  bench->add_option("--json", bench_options.json_path, "Write the results here");
  bench->add_option("--batches", bench_options.batches, "Timed batches (the median is reported)")
      ->capture_default_str();

  CLI::App* fuzz = app.add_subcommand(
      "fuzz", "Random graphs evaluated fused and unfused; shrink and print failures");
  uint64_t fuzz_seed = 1;
  int64_t graphs = 100;
  std::string fuzz_device = "cpu";
  fuzz->add_option("--seed", fuzz_seed, "First seed")->capture_default_str();
  fuzz->add_option("--graphs", graphs, "How many graphs")->capture_default_str();
  fuzz->add_option("--device", fuzz_device,
                   "cpu (fused against unfused, bit for bit) or cuda:N (against the CPU)")
      ->capture_default_str();
  bool no_shrink = false;
  fuzz->add_flag("--no-shrink", no_shrink,
                 "Print each failing graph as generated, without shrinking it first");
  bool fuzz_rows = false;
  fuzz->add_flag("--rows", fuzz_rows,
                 "Graphs whose innermost size is 16, 64 or 256 (rows the CPU JIT compiles a row "
                 "step's parts into one loop over): another family of graphs per seed");

  CLI::App* launch = app.add_subcommand(
      "launch", "Run PROGRAM ARGS... as N processes of one job on this machine (like torchrun)");
  int nproc = 1, master_port = 0;
  double grace = 10;
  launch->add_option("--nproc", nproc, "Processes in the job")->capture_default_str();
  launch
      ->add_option("--master-port", master_port,
                   "The rendezvous port (MASTER_PORT); 0 picks a free one")
      ->capture_default_str();
  launch
      ->add_option("--grace", grace,
                   "Seconds the other processes have to report a failed one before they stop")
      ->capture_default_str();
  // Everything after the options is the program and its own arguments.
  launch->prefix_command();

  CLI11_PARSE(app, argc, argv);
  try {
    if (*devices) {
      std::cout << lazyfuse::format_device_report(lazyfuse::device_report());
      std::cout << "NVRTC: "
                << (lazyfuse::nvrtc_available() ? lazyfuse::nvrtc_version()
                                                : lazyfuse::nvrtc_unavailable_reason())
                << "\n";
      return 0;
    }
    if (*opt)
      return tools::opt(file, passes_option->count() > 0 ? std::optional(passes) : std::nullopt,
                        print_after_all, print_after);
    if (*codegen) return tools::codegen(file, target, with_prologue);
    if (*compile) return tools::compile(file, arch);
    if (*run) {
      std::optional<tools::Reference> reference;
      if (check) reference = tools::Reference::Float64;
      if (check_unfused) reference = tools::Reference::Unfused;
      if (check_cpu) reference = tools::Reference::Cpu;
      return tools::run(file, device, seed, reference);
    }
    if (*dot) return tools::dot(file, fused, output);
    if (*bench) return lazyfuse::bench::run_bench(bench_options);
    if (*fuzz) return tools::fuzz(fuzz_seed, graphs, fuzz_device, !no_shrink, fuzz_rows);
    if (*launch) return tools::launch(nproc, master_port, grace, launch->remaining());
  } catch (const lazyfuse::ParseError& e) {
    std::cerr << e.what() << "\n";  // already FILE:LINE:COL: error: ...
    return 1;
  } catch (const lazyfuse::Error& e) {
    std::cerr << (file.empty()  ? std::string("lazyfuse")
                  : file == "-" ? std::string("<stdin>")
                                : file)
              << ": error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
