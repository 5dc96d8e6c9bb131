// lazyfuse launch: starts a job of N processes on this machine, as `torchrun --nproc-per-node=N`
// does: each gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT
// (a free port unless one is given), which lazyfuse::distributed::init() reads, and, unless it is
// set, OMP_NUM_THREADS: the machine's cores divided among the processes, so that N processes of
// OpenMP threads do not oversubscribe the cores (torchrun sets 1). When a process
// fails, the others have `grace` seconds to see it and report (they raise DistributedError
// naming it) before they are stopped; the job's status is the first failure's.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lazyfuse/ir/errors.h"
#include "tools/commands.h"

namespace lazyfuse::tools {
namespace {

// A port nothing listens on now: the kernel's choice for a socket bound to port 0.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    if (fd >= 0) ::close(fd);
    throw Error(absl::StrCat("launch: no free port: ", std::strerror(errno)));
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

volatile sig_atomic_t forwarded_signal = 0;
void remember_signal(int signal) { forwarded_signal = signal; }

}  // namespace

int launch(int nproc, int master_port, double grace_seconds,
           const std::vector<std::string>& command) {
  if (nproc < 1) throw Error(absl::StrCat("launch: --nproc must be at least 1, not ", nproc));
  if (command.empty()) throw Error("launch: no program to run");
  const int port = master_port > 0 ? master_port : free_port();
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string threads = std::to_string(std::max(1u, cores / static_cast<unsigned>(nproc)));
  std::vector<char*> argv;
  for (const std::string& word : command) argv.push_back(const_cast<char*>(word.c_str()));
  argv.push_back(nullptr);
  std::vector<pid_t> ranks(static_cast<size_t>(nproc), -1);
  const pid_t launcher = ::getpid();
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) throw Error(absl::StrCat("launch: fork: ", std::strerror(errno)));
    if (pid == 0) {
      // A process outlives no launcher: stopped when it goes.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(1);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("OMP_NUM_THREADS", threads.c_str(), 0);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "lazyfuse launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    ranks[static_cast<size_t>(rank)] = pid;
  }
  ::signal(SIGINT, remember_signal);
  ::signal(SIGTERM, remember_signal);
  int status_of_job = 0, running = nproc;
  std::optional<std::chrono::steady_clock::time_point> stop_at;
  bool terminated = false;
  while (running > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      --running;
      int rank = 0;
      while (ranks[static_cast<size_t>(rank)] != pid) ++rank;
      ranks[static_cast<size_t>(rank)] = -1;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code != 0) {
        std::cerr << "lazyfuse launch: rank " << rank
                  << (WIFEXITED(status) ? absl::StrCat(" exited with status ", code)
                                        : absl::StrCat(" was killed by signal ", WTERMSIG(status)))
                  << "\n";
        if (status_of_job == 0) {
          status_of_job = code;
          stop_at = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(grace_seconds * 1000));
        }
      }
      continue;
    }
    if (forwarded_signal != 0) {
      for (pid_t p : ranks)
        if (p > 0) ::kill(p, forwarded_signal);
      if (status_of_job == 0) status_of_job = 128 + forwarded_signal;
      forwarded_signal = 0;
    }
    if (stop_at && std::chrono::steady_clock::now() >= *stop_at) {
      // Past the grace period: stopped, then killed if they still run 5 s later.
      for (pid_t p : ranks)
        if (p > 0) ::kill(p, terminated ? SIGKILL : SIGTERM);
      stop_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      terminated = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status_of_job;
}

}  // namespace lazyfuse::tools
