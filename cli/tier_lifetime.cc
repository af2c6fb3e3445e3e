#include "cli/tier_lifetime.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <grpcpp/health_check_service_interface.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common/base/log.h"

namespace pdserve::cli {
namespace {

// SIGTERM/SIGINT write a byte to this pipe (the only async-signal-safe thing the handler does);
// a watcher thread blocks reading it. A handler rather than sigwait, because threads started
// before main (OpenBLAS starts its pool from a library constructor) would otherwise take the
// signal with its default action and kill the process.
int g_stop_pipe[2] = {-1, -1};

void OnStopSignal(int signal) {
  const char b = static_cast<char>(signal);
  [[maybe_unused]] ssize_t n = ::write(g_stop_pipe[1], &b, 1);
}

// Whether the ready line is out, and whether a stop signal came after it. Guarded by g_stop_mu.
std::mutex g_stop_mu;
std::condition_variable g_stop_cv;
bool g_serving = false;
bool g_stop_requested = false;

}  // namespace

void StartStopWatcher(const char* cmd) {
  std::thread([cmd] {
    char b;
    while (::read(g_stop_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
    std::lock_guard<std::mutex> lock(g_stop_mu);
    if (!g_serving) {
      PD_LOG(Info) << cmd << ": stopped before it was ready";
      ExitAfterShutdown(kExitOk);
    }
    g_stop_requested = true;
    g_stop_cv.notify_all();
  }).detach();
}

void WaitForStopSignal() {
  std::unique_lock<std::mutex> lock(g_stop_mu);
  g_stop_cv.wait(lock, [] { return g_stop_requested; });
}

[[noreturn]] void ExitAfterShutdown(int code) {
  std::fflush(nullptr);
  std::_Exit(code);
}

int ReportFlagError(const char* cmd, const absl::Status& s) {
  return ReportError(cmd, s, s.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitError);
}

void Ready(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_stop_mu);
  g_serving = true;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

void MarkNotServing(const StartedServer& server) {
  if (auto* health = server.server->GetHealthCheckService()) health->SetServingStatus(false);
}

std::chrono::seconds DrainGrace(double seconds) {
  return std::chrono::seconds(static_cast<int64_t>(std::ceil(seconds)));
}

void InstallStopSignalHandler() {
  if (::pipe2(g_stop_pipe, O_CLOEXEC) != 0) return;
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // A parent may have started us with them blocked (the mask is inherited across exec): a stop
  // signal must always reach the handler.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
}

void StartExitOnStopSignal(const char* cmd) {
  std::thread([cmd] {
    char b = 0;
    while (::read(g_stop_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
    std::fprintf(stderr, "pdserve %s: stopped by signal %d\n", cmd, static_cast<int>(b));
    ExitAfterShutdown(128 + static_cast<int>(b));  // The shell's convention: 130 for Ctrl-C.
  }).detach();
}

}  // namespace pdserve::cli
