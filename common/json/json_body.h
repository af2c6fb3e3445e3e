// Request bodies as JSON, parsed in time linear in their size whatever their shape.
//
// nlohmann's DOM parser with a callback rescans a container's elements each time one of its
// objects closes, and ordered_json finds a key by a linear search, so an array of N objects or an
// object of N keys cost O(N^2) (a 15 MB body held a handler thread for minutes). This builds the
// same ordered_json from nlohmann's SAX events instead: each value is moved into its parent once,
// an object's keys are indexed by a hash map while it is open (a repeated key keeps its first
// place and its last value, as nlohmann does), nesting is refused past a bound as it is read, and
// the root object's members that the caller does not want are parsed but never built.
#ifndef PDSERVE_COMMON_JSON_JSON_BODY_H_
#define PDSERVE_COMMON_JSON_JSON_BODY_H_

#include <functional>
#include <string>
#include <string_view>

#include "nlohmann/json.hpp"

namespace pdserve {

struct JsonBodyError {
  bool too_deep = false;  // Else: not JSON (or trailing bytes).
  std::string message;
};

// Parses `body` into *out (any JSON value). `keep`, when set, says which members of a root object
// to build; the others are checked for syntax and dropped. Nesting deeper than `max_depth` fails.
bool ParseJsonBody(std::string_view body, int max_depth,
                   const std::function<bool(std::string_view key)>& keep,
                   nlohmann::ordered_json* out, JsonBodyError* error);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_JSON_JSON_BODY_H_
