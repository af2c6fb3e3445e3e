#include "loadgen/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"

extern char** environ;

namespace pdserve {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Tail(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(s.size() - n); }

// Waits for `pid` up to `seconds`; the exit code, or -1 if it is still running.
int WaitFor(pid_t pid, double seconds) {
  const auto give_up = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  while (true) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r < 0) return -2;
    if (std::chrono::steady_clock::now() >= give_up) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::string& binary, const std::vector<std::string>& args, const std::string& log_dir,
    double timeout_seconds) {
  static int counter = 0;
  std::unique_ptr<ChildProcess> p(new ChildProcess());
  p->name_ = Str(args.empty() ? "child" : args[0], "-", ++counter);
  const std::string out_path = JoinPath(log_dir, p->name_ + ".out");
  const std::string err_path = JoinPath(log_dir, p->name_ + ".err");
  p->err_path_ = err_path;
  p->command_ = Str("pdserve ", absl::StrJoin(args, " "));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int rc = posix_spawn(&p->pid_, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    p->pid_ = -1;
    return absl::InternalError(Str("cannot start ", binary, ": ", std::strerror(rc)));
  }
  const std::regex pair(R"((\w+)=(\S+))");
  const auto give_up = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  while (std::chrono::steady_clock::now() < give_up) {
    const std::string out = ReadAll(out_path);
    const size_t ready = out.find("ready:");
    if (ready != std::string::npos && out.find('\n', ready) != std::string::npos) {
      const std::string line = out.substr(ready, out.find('\n', ready) - ready);
      for (std::sregex_iterator it(line.begin(), line.end(), pair), end; it != end; ++it) {
        p->addresses_[(*it)[1]] = (*it)[2];
      }
      if (!p->addresses_.contains("grpc")) break;
      return p;
    }
    if (const int code = WaitFor(p->pid_, 0); code != -1) {
      p->pid_ = -1;
      return absl::InternalError(Str("pdserve ", absl::StrJoin(args, " "), " exited with ", code,
                                     ": ", Tail(ReadAll(err_path), 2000)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(Str("pdserve ", absl::StrJoin(args, " "),
                                         " did not become ready: ", Tail(ReadAll(err_path), 2000)));
}

int ChildProcess::Stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int code = WaitFor(pid_, 30);
  if (code == -1) {
    ::kill(pid_, SIGKILL);
    code = WaitFor(pid_, 10);
  }
  pid_ = -1;
  return code;
}

std::string ChildProcess::Describe() const {
  return Str(command_, ": ", Tail(ReadAll(err_path_), 3000));
}

ChildProcess::~ChildProcess() { Stop(); }

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(const LocalClusterOptions& o) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  char tmpl[] = "/tmp/pdserve-bench-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return absl::InternalError("cannot create a temporary directory");
  c->log_dir_ = tmpl;
  std::vector<std::string> prefill, decode;
  for (int64_t i = 0; i < o.prefill + o.decode; ++i) {
    const bool is_prefill = i < o.prefill;
    std::vector<std::string> args = {is_prefill ? "prefill" : "decode", "--listen", "127.0.0.1:0",
                                     "--model", o.model};
    args.insert(args.end(), o.worker_args.begin(), o.worker_args.end());
    if (!is_prefill) args.insert(args.end(), o.decode_args.begin(), o.decode_args.end());
    PD_ASSIGN_OR_RETURN(auto child, ChildProcess::Start(o.binary, args, c->log_dir_, 120));
    (is_prefill ? prefill : decode).push_back(child->grpc());
    c->workers_.push_back(std::move(child));
  }
  std::vector<std::string> args = {"router", "--listen", "127.0.0.1:0", "--model", o.model,
                                   "--prefill", absl::StrJoin(prefill, ","),
                                   "--decode", absl::StrJoin(decode, ",")};
  args.insert(args.end(), o.router_args.begin(), o.router_args.end());
  PD_ASSIGN_OR_RETURN(c->router_, ChildProcess::Start(o.binary, args, c->log_dir_, 120));
  return c;
}

absl::Status LocalCluster::Stop() {
  std::string errors;
  std::vector<ChildProcess*> all;
  if (router_) all.push_back(router_.get());
  for (auto& w : workers_) all.push_back(w.get());
  for (ChildProcess* p : all) {
    const int code = p->Stop();
    if (code > 0) errors += Str("\n  exited with ", code, ": ", p->Describe());
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InternalError(Str("cluster processes failed:", errors));
}

LocalCluster::~LocalCluster() {
  Stop().IgnoreError();
  std::error_code ec;
  std::filesystem::remove_all(log_dir_, ec);
}

}  // namespace pdserve
