// PD_CHECK: for programmer errors only (a broken invariant inside pdserve). Anything a user, a
// peer, a file or a device can cause is an absl::Status instead (STYLE.md, habit 2).
#ifndef PDSERVE_COMMON_BASE_CHECK_H_
#define PDSERVE_COMMON_BASE_CHECK_H_

namespace pdserve::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* expr, const char* msg);
}  // namespace pdserve::internal

#define PD_CHECK(cond)                                                         \
  do {                                                                         \
    if (__builtin_expect(!(cond), 0))                                          \
      ::pdserve::internal::CheckFailed(__FILE__, __LINE__, #cond, nullptr);   \
  } while (0)

#define PD_CHECK_MSG(cond, msg)                                                \
  do {                                                                         \
    if (__builtin_expect(!(cond), 0))                                          \
      ::pdserve::internal::CheckFailed(__FILE__, __LINE__, #cond, (msg));     \
  } while (0)

#endif  // PDSERVE_COMMON_BASE_CHECK_H_
