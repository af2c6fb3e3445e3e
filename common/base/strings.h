// String concatenation that accepts std::string_view.
//
// Debian's Abseil 20220623 is built with ABSL_OPTION_USE_STD_STRING_VIEW=0, so absl::string_view
// is its own type and absl::StrCat rejects std::string_view. pdserve uses std::string_view in its
// interfaces; these wrappers convert at the one place where the two meet.
#ifndef PDSERVE_COMMON_BASE_STRINGS_H_
#define PDSERVE_COMMON_BASE_STRINGS_H_

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pdserve {

inline absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

namespace strings_internal {
inline absl::string_view Arg(std::string_view s) { return AsAbsl(s); }
inline absl::string_view Arg(const std::string& s) { return absl::string_view(s); }
inline absl::string_view Arg(const char* s) { return absl::string_view(s); }
template <typename T>
inline const T& Arg(const T& v) {
  return v;
}
}  // namespace strings_internal

// absl::StrCat, also for std::string_view arguments.
template <typename... Args>
std::string Str(const Args&... args) {
  return absl::StrCat(strings_internal::Arg(args)...);
}

template <typename... Args>
void StrAppendTo(std::string* out, const Args&... args) {
  absl::StrAppend(out, strings_internal::Arg(args)...);
}

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BASE_STRINGS_H_
