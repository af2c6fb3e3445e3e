// Minimal leveled logging to stderr. Thread-safe: each line is written with one write(2).
// absl 20220623 (Debian 12) predates absl/log, hence this small replacement.
#ifndef PDSERVE_COMMON_BASE_LOG_H_
#define PDSERVE_COMMON_BASE_LOG_H_

#include <sstream>
#include <string>

namespace pdserve {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below this level are dropped. Default kInfo; PDSERVE_LOG_LEVEL=debug|info|warning|error.
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();

namespace internal {
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace internal
}  // namespace pdserve

#define PD_LOG(level)                                                          \
  if (::pdserve::LogLevel::k##level < ::pdserve::MinLogLevel()) {              \
  } else                                                                       \
    ::pdserve::internal::LogLine(::pdserve::LogLevel::k##level, __FILE__, __LINE__).stream()

#endif  // PDSERVE_COMMON_BASE_LOG_H_
