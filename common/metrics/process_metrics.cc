#include "common/metrics/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace pdserve::metrics {
namespace {

// /proc/self/stat's fields after the command name: utime and stime (clock ticks), starttime
// (ticks after boot), vsize (bytes) and rss (pages).
struct Stat {
  double cpu_seconds = 0, start_ticks = 0, vsize = 0, rss_pages = 0;
  bool ok = false;
};

Stat ReadStat() {
  Stat s;
  std::ifstream f("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');  // The command name may hold spaces and parentheses.
  if (close == std::string::npos) return s;
  std::istringstream in(text.substr(close + 2));
  std::string field;
  // Field 3 (state) is the first here; utime is 14, stime 15, starttime 22, vsize 23, rss 24.
  for (int i = 3; i <= 24 && in >> field; ++i) {
    const double v = std::strtod(field.c_str(), nullptr);
    if (i == 14 || i == 15) s.cpu_seconds += v;
    if (i == 22) s.start_ticks = v;
    if (i == 23) s.vsize = v;
    if (i == 24) {
      s.rss_pages = v;
      s.ok = true;
    }
  }
  s.cpu_seconds /= static_cast<double>(sysconf(_SC_CLK_TCK));
  return s;
}

double BootTime() {
  std::ifstream f("/proc/stat");
  std::string key;
  double value = 0;
  while (f >> key) {
    if (key == "btime") {
      f >> value;
      return value;
    }
    f.ignore(1 << 20, '\n');
  }
  return 0;
}

double OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  double n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // The directory's own descriptor.
}

}  // namespace

void AddProcessMetrics(Registry* registry) {
  Counter& cpu = registry->AddCounter("process_cpu_seconds_total",
                                      "Total user and system CPU time spent in seconds.", {}).With({});
  Gauge& rss = registry->AddGauge("process_resident_memory_bytes", "Resident memory size in bytes.", {}).With({});
  Gauge& vsize = registry->AddGauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", {}).With({});
  Gauge& fds = registry->AddGauge("process_open_fds", "Number of open file descriptors.", {}).With({});
  Gauge& max_fds = registry->AddGauge("process_max_fds", "Maximum number of open file descriptors.", {}).With({});
  Gauge& start = registry->AddGauge("process_start_time_seconds",
                                    "Start time of the process since unix epoch in seconds.", {}).With({});
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  const double boot = BootTime();
  registry->AddCollector([&cpu, &rss, &vsize, &fds, &max_fds, &start, page, boot] {
    const Stat s = ReadStat();
    if (!s.ok) return;
    cpu.SetTotal(s.cpu_seconds);
    rss.Set(s.rss_pages * page);
    vsize.Set(s.vsize);
    fds.Set(OpenFds());
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) == 0) max_fds.Set(static_cast<double>(limit.rlim_cur));
    start.Set(boot + s.start_ticks / static_cast<double>(sysconf(_SC_CLK_TCK)));
  });
}

}  // namespace pdserve::metrics
