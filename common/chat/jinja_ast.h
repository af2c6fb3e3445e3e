// The parsed form of a template (internal to common/chat): expressions and statements.
#ifndef PDSERVE_COMMON_CHAT_JINJA_AST_H_
#define PDSERVE_COMMON_CHAT_JINJA_AST_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/chat/jinja_value.h"

namespace pdserve::jinja {

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kAttr,      // a.name
    kItem,      // a[b]
    kSlice,     // a[b:c:d] (args: start, stop, step; null = omitted)
    kCall,      // a(args, kwargs)
    kFilter,    // a | name(args, kwargs)
    kTest,      // a is [not] name(args)
    kUnary,     // op a ("not", "-", "+")
    kBinary,    // a op b
    kCond,      // b if a else c (a = condition)
    kList,      // [args]
    kDict,      // {kwargs-like pairs: keys in args (even), values (odd)}
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;  // kName, kAttr, kFilter, kTest, op of kUnary/kBinary.
  bool negated = false;  // kTest.
  ExprPtr a, b, c;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

// The names the renderer implements (jinja_render.cc); Parse() refuses a template that uses any
// other, so an unsupported template fails at start-up rather than at a request.
inline bool KnownName(const std::vector<std::string_view>& names, std::string_view n) {
  for (std::string_view k : names) {
    if (k == n) return true;
  }
  return false;
}
inline bool KnownFilter(std::string_view n) {
  static const std::vector<std::string_view> k = {
      "trim", "length", "count", "tojson", "string", "safe", "lower", "upper", "capitalize", "title",
      "replace", "default", "d", "first", "last", "list", "reverse", "join", "items", "int", "float",
      "abs", "map", "selectattr", "rejectattr", "select", "reject"};
  return KnownName(k, n);
}
inline bool KnownTest(std::string_view n) {
  static const std::vector<std::string_view> k = {
      "defined", "undefined", "none", "string", "number", "integer", "float", "boolean", "true", "false",
      "mapping", "iterable", "sequence", "callable", "odd", "even", "divisibleby", "eq", "equalto", "==",
      "ne", "!=", "in"};
  return KnownName(k, n);
}
inline bool KnownFunction(std::string_view n) {
  static const std::vector<std::string_view> k = {"raise_exception", "namespace", "dict", "range", "strftime_now"};
  return KnownName(k, n);
}
inline bool KnownMethod(std::string_view n) {
  static const std::vector<std::string_view> k = {
      "startswith", "endswith", "strip", "lstrip", "rstrip", "lower", "upper", "split", "replace", "join",
      "find", "get", "items", "keys", "values"};
  return KnownName(k, n);
}

struct Node;
using NodePtr = std::shared_ptr<const Node>;

struct Node {
  enum class Kind {
    kBody,      // children
    kText,      // text
    kOutput,    // expr
    kIf,        // branches (cond, body); else_body
    kFor,       // targets in expr [if filter]: body, else_body
    kSet,       // targets[0] (and attr) = expr, or a set block (body)
    kMacro,     // name(params with defaults): body
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr, filter;
  std::vector<std::string> targets;
  std::string attr;  // kSet on a namespace: targets[0].attr.
  std::vector<std::pair<ExprPtr, NodePtr>> branches;
  NodePtr body, else_body;
  std::vector<NodePtr> children;
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro (default may be null).
};

}  // namespace pdserve::jinja

#endif  // PDSERVE_COMMON_CHAT_JINJA_AST_H_
