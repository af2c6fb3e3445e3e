// A Jinja2 subset for chat templates, set up as Hugging Face's apply_chat_template sets up Jinja:
// trim_blocks, lstrip_blocks, loop controls (break/continue), `raise_exception(msg)`, `tojson`
// (json.dumps without ASCII escaping), `strftime_now(fmt)`, `namespace(...)`.
//
// Parse() accepts what real templates use: if/elif/else, for (with loop.*, else, an `if` filter,
// tuple unpacking), set (names, namespace attributes, set blocks), macros, output expressions
// with whitespace control, comments; expressions with Python literals, attribute/item access,
// slices, calls with keyword arguments, filters, tests, the ternary and the usual operators,
// and the string/dict methods templates call. Anything else is refused by Parse() naming the
// construct and its line (tags, and every filter, test, function and method name), so a template
// the renderer cannot handle fails at start-up, never at the first request.
#ifndef PDSERVE_COMMON_CHAT_JINJA_H_
#define PDSERVE_COMMON_CHAT_JINJA_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/chat/jinja_value.h"

namespace pdserve::jinja {

struct Node;

class Template {
 public:
  static absl::StatusOr<Template> Parse(const std::string& source);
  // Renders with `context` (a dict of variables). raise_exception(msg) in the template and
  // runtime type errors come back as InvalidArgument with the message.
  absl::StatusOr<std::string> Render(const Value& context) const;

 private:
  std::shared_ptr<const Node> root_;
};

}  // namespace pdserve::jinja

#endif  // PDSERVE_COMMON_CHAT_JINJA_H_
