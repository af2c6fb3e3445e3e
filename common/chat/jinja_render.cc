// Template::Render: evaluates the tree of jinja_ast.h with Python semantics for the values.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "common/base/strings.h"
#include "common/chat/jinja.h"
#include "common/chat/jinja_ast.h"

namespace pdserve::jinja {
namespace {

using Status = absl::Status;
template <typename T>
using StatusOr = absl::StatusOr<T>;

Status Err(int line, const std::string& what) {
  return absl::InvalidArgumentError(Str("chat template line ", line, ": ", what));
}

std::string KindName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "undefined";
    case Value::Kind::kNone: return "none";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "string";
    case Value::Kind::kList: return "list";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kNamespace: return "namespace";
  }
  return "?";
}

// UTF-8 code point boundaries of s (offsets of each code point's first byte, then s.size()).
std::vector<size_t> CodePoints(const std::string& s) {
  std::vector<size_t> at;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80) at.push_back(i);
  }
  at.push_back(s.size());
  return at;
}

uint32_t Decode(const std::string& s, size_t i, size_t end) {
  const unsigned char c = s[i];
  if (c < 0x80) return c;
  int n = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : 1;
  uint32_t cp = c & (0x3f >> n);
  for (size_t k = i + 1; k < end && n > 0; ++k, --n) cp = (cp << 6) | (s[k] & 0x3f);
  return cp;
}

// Python's str.isspace() for one code point.
bool PySpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

// Whether `chars` can be strip()'s argument: absent, none or a string.
bool StripChars(const Value& chars) { return chars.is_undefined() || chars.is_none() || chars.is_string(); }

// str.strip/lstrip/rstrip(chars): chars absent or none = whitespace.
std::string Strip(const std::string& s, bool left, bool right, const Value& chars) {
  const std::vector<size_t> at = CodePoints(s);
  std::vector<uint32_t> set;
  const bool ws = chars.is_undefined() || chars.is_none();
  if (!ws) {
    const std::string& c = chars.str();
    const auto cat = CodePoints(c);
    for (size_t k = 0; k + 1 < cat.size(); ++k) set.push_back(Decode(c, cat[k], cat[k + 1]));
  }
  auto strip = [&](size_t k) {
    const uint32_t cp = Decode(s, at[k], at[k + 1]);
    return ws ? PySpace(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = at.size() - 1;
  if (left) {
    while (b < e && strip(b)) ++b;
  }
  if (right) {
    while (e > b && strip(e - 1)) --e;
  }
  return s.substr(at[b], at[e] - at[b]);
}

// Python slice indices over n items.
std::vector<int64_t> SliceIndices(int64_t n, const Value& start, const Value& stop, const Value& step) {
  const int64_t st = step.is_undefined() || step.is_none() ? 1 : step.as_int();
  std::vector<int64_t> out;
  if (st == 0) return out;
  auto clamp = [&](const Value& v, int64_t def) {
    if (v.is_undefined() || v.is_none()) return def;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = clamp(start, st > 0 ? 0 : n - 1);
  const int64_t e = clamp(stop, st > 0 ? n : -1);
  for (int64_t i = b; st > 0 ? i < e : i > e;) {
    out.push_back(i);
    if (__builtin_add_overflow(i, st, &i)) break;
  }
  return out;
}

struct Macro {
  NodePtr node;
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  explicit Renderer(const Value& context) {
    scopes_.emplace_back();
    for (const auto& [k, v] : context.dict()) scopes_.back()[k] = v;
  }

  Status Run(const Node& n, std::string* out) {
    Flow flow = Flow::kNormal;
    return Exec(n, out, &flow);
  }

 private:
  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value();
  }

  Status Exec(const Node& n, std::string* out, Flow* flow) {
    if (++steps_ > kMaxSteps || out->size() > kMaxString) {
      return Err(n.line, Str("the template ran more than ", kMaxSteps, " steps or wrote more than ",
                             kMaxString, " bytes"));
    }
    switch (n.kind) {
      case Node::Kind::kBody:
        for (const NodePtr& c : n.children) {
          if (Status s = Exec(*c, out, flow); !s.ok()) return s;
          if (*flow != Flow::kNormal) return absl::OkStatus();
        }
        return absl::OkStatus();
      case Node::Kind::kText:
        *out += n.text;
        return absl::OkStatus();
      case Node::Kind::kOutput: {
        auto v = Eval(*n.expr);
        if (!v.ok()) return v.status();
        *out += v->ToString();
        return absl::OkStatus();
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          auto c = Eval(*cond);
          if (!c.ok()) return c.status();
          if (c->Truthy()) return Exec(*body, out, flow);
        }
        if (n.else_body) return Exec(*n.else_body, out, flow);
        return absl::OkStatus();
      case Node::Kind::kFor: return ExecFor(n, out, flow);
      case Node::Kind::kSet: {
        Value v;
        if (n.body) {
          std::string captured;
          Flow inner = Flow::kNormal;
          if (Status s = Exec(*n.body, &captured, &inner); !s.ok()) return s;
          v = Value::String(captured);
        } else {
          auto e = Eval(*n.expr);
          if (!e.ok()) return e.status();
          v = *e;
        }
        if (!n.attr.empty()) {
          Value ns = Lookup(n.targets[0]);
          if (ns.kind() != Value::Kind::kNamespace) {
            return Err(n.line, Str("cannot set attribute '", n.attr, "' of a ", KindName(ns), " (only a namespace)"));
          }
          if (v.holds_namespace()) return Err(n.line, kNamespaceInNamespace);
          for (auto& [k, slot] : ns.mutable_dict()) {
            if (k == n.attr) {
              slot = v;
              return absl::OkStatus();
            }
          }
          ns.mutable_dict().emplace_back(n.attr, v);
          return absl::OkStatus();
        }
        if (n.targets.size() == 1) {
          scopes_.back()[n.targets[0]] = v;
          return absl::OkStatus();
        }
        if (!v.is_list() || v.list().size() != n.targets.size()) {
          return Err(n.line, "cannot unpack the value into the set targets");
        }
        for (size_t i = 0; i < n.targets.size(); ++i) scopes_.back()[n.targets[i]] = v.list()[i];
        return absl::OkStatus();
      }
      case Node::Kind::kMacro:
        macros_[n.targets[0]] = Macro{std::shared_ptr<const Node>(std::shared_ptr<const Node>{}, &n)};
        return absl::OkStatus();
      case Node::Kind::kBreak:
        *flow = Flow::kBreak;
        return absl::OkStatus();
      case Node::Kind::kContinue:
        *flow = Flow::kContinue;
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  StatusOr<List> Iterate(const Value& v, int line) {
    if (v.is_list()) return v.list();
    if (v.is_mapping()) {
      List keys;
      for (const auto& [k, e] : v.dict()) keys.push_back(Value::String(k));
      return keys;
    }
    if (v.is_string()) {
      List chars;
      const auto at = CodePoints(v.str());
      for (size_t k = 0; k + 1 < at.size(); ++k) chars.push_back(Value::String(v.str().substr(at[k], at[k + 1] - at[k])));
      return chars;
    }
    if (v.is_undefined() || v.is_none()) return List{};
    return Err(line, Str("cannot iterate over a ", KindName(v)));
  }

  Status ExecFor(const Node& n, std::string* out, Flow* flow) {
    auto seq = Eval(*n.expr);
    if (!seq.ok()) return seq.status();
    auto items = Iterate(*seq, n.line);
    if (!items.ok()) return items.status();
    scopes_.emplace_back();
    List kept;
    for (const Value& item : *items) {
      if (n.filter) {
        if (Status s = Bind(n, item); !s.ok()) return s;
        auto c = Eval(*n.filter);
        if (!c.ok()) return c.status();
        if (!c->Truthy()) continue;
      }
      kept.push_back(item);
    }
    const int64_t len = static_cast<int64_t>(kept.size());
    for (int64_t i = 0; i < len; ++i) {
      if (Status s = Bind(n, kept[i]); !s.ok()) return s;
      scopes_.back()["loop"] = Value::MakeDict({
          {"index0", Value::Int(i)},
          {"index", Value::Int(i + 1)},
          {"revindex0", Value::Int(len - 1 - i)},
          {"revindex", Value::Int(len - i)},
          {"first", Value::Bool(i == 0)},
          {"last", Value::Bool(i == len - 1)},
          {"length", Value::Int(len)},
          {"previtem", i > 0 ? kept[i - 1] : Value()},
          {"nextitem", i + 1 < len ? kept[i + 1] : Value()},
      });
      Flow inner = Flow::kNormal;
      if (Status s = Exec(*n.body, out, &inner); !s.ok()) return s;
      if (inner == Flow::kBreak) break;
    }
    scopes_.pop_back();
    if (len == 0 && n.else_body) return Exec(*n.else_body, out, flow);
    return absl::OkStatus();
  }

  Status Bind(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = item;
      return absl::OkStatus();
    }
    if (!item.is_list() || item.list().size() != n.targets.size()) {
      return Err(n.line, Str("cannot unpack a ", KindName(item), " into ", n.targets.size(), " loop variables"));
    }
    for (size_t i = 0; i < n.targets.size(); ++i) scopes_.back()[n.targets[i]] = item.list()[i];
    return absl::OkStatus();
  }

  // `sep`.join(items) (the method and the filter), refused once its text passes kMaxString (an
  // item's text is bounded by its weight, so it stops within a bounded step of that).
  StatusOr<Value> Join(const List& items, const std::string& sep, int line) const {
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      out += (i ? sep : "") + items[i].ToString();
      if (out.size() > kMaxString) {
        return Err(line, Str("join() would make a string of more than ", kMaxString, " bytes"));
      }
    }
    return Value::String(std::move(out));
  }

  // Every value a template makes passes here: nesting past kMaxDepth is an error, so printing,
  // comparing and freeing values (all recursive) stay within the stack, and so is a value
  // weighing more than kMaxString (a string or list doubled in a loop would outgrow memory: each
  // operation's inputs passed here, so what it makes is at most a few times the bound).
  StatusOr<Value> Eval(const Expr& e) {
    StatusOr<Value> v = EvalUnchecked(e);
    if (v.ok() && v->depth() > kMaxDepth) {
      return Err(e.line, Str("a value nested deeper than ", kMaxDepth, " levels"));
    }
    if (v.ok() && v->Weight() > kMaxString) {
      return Err(e.line, Str("a value of more than ", kMaxString, " bytes"));
    }
    return v;
  }

  StatusOr<Value> EvalUnchecked(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.value;
      case Expr::Kind::kName: return Lookup(e.name);
      case Expr::Kind::kAttr: {
        auto a = Eval(*e.a);
        if (!a.ok()) return a;
        return a->Get(e.name);
      }
      case Expr::Kind::kItem: {
        auto a = Eval(*e.a);
        if (!a.ok()) return a;
        auto b = Eval(*e.b);
        if (!b.ok()) return b;
        return Item(*a, *b, e.line);
      }
      case Expr::Kind::kSlice: {
        auto a = Eval(*e.a);
        if (!a.ok()) return a;
        Value parts[3];
        for (int k = 0; k < 3; ++k) {
          if (e.args[k]) {
            auto v = Eval(*e.args[k]);
            if (!v.ok()) return v;
            parts[k] = *v;
          }
        }
        if (a->is_list()) {
          List out;
          for (int64_t i : SliceIndices(static_cast<int64_t>(a->list().size()), parts[0], parts[1], parts[2])) {
            out.push_back(a->list()[i]);
          }
          return Value::MakeList(std::move(out));
        }
        if (a->is_string()) {
          const auto at = CodePoints(a->str());
          std::string out;
          for (int64_t i : SliceIndices(static_cast<int64_t>(at.size() - 1), parts[0], parts[1], parts[2])) {
            out += a->str().substr(at[i], at[i + 1] - at[i]);
          }
          return Value::String(out);
        }
        return Err(e.line, Str("cannot slice a ", KindName(*a)));
      }
      case Expr::Kind::kCall: return Call(e);
      case Expr::Kind::kFilter: return Filter(e);
      case Expr::Kind::kTest: {
        auto t = Test(e);
        if (!t.ok()) return t.status();
        return Value::Bool(*t != e.negated);
      }
      case Expr::Kind::kUnary: {
        auto a = Eval(*e.a);
        if (!a.ok()) return a;
        if (e.name == "not") return Value::Bool(!a->Truthy());
        if (a->kind() == Value::Kind::kInt) {
          if (e.name == "-" && a->as_int() == INT64_MIN) return Err(e.line, "integer overflow in -");
          return Value::Int(e.name == "-" ? -a->as_int() : a->as_int());
        }
        if (a->kind() == Value::Kind::kFloat) return Value::Float(e.name == "-" ? -a->as_number() : a->as_number());
        return Err(e.line, Str("bad operand for unary ", e.name, ": ", KindName(*a)));
      }
      case Expr::Kind::kBinary: return Binary(e);
      case Expr::Kind::kCond: {
        auto c = Eval(*e.a);
        if (!c.ok()) return c;
        if (c->Truthy()) return Eval(*e.b);
        if (e.c) return Eval(*e.c);
        return Value();
      }
      case Expr::Kind::kList: {
        List items;
        for (const ExprPtr& x : e.args) {
          auto v = Eval(*x);
          if (!v.ok()) return v;
          items.push_back(*v);
        }
        return Value::MakeList(std::move(items));
      }
      case Expr::Kind::kDict: {
        Dict items;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          auto k = Eval(*e.args[i]);
          if (!k.ok()) return k;
          auto v = Eval(*e.args[i + 1]);
          if (!v.ok()) return v;
          items.emplace_back(k->ToString(), *v);
        }
        return Value::MakeDict(std::move(items));
      }
    }
    return Value();
  }

  StatusOr<Value> Item(const Value& a, const Value& b, int line) {
    if (a.is_mapping()) return a.Get(b.ToString());
    if ((a.is_list() || a.is_string()) && b.kind() == Value::Kind::kInt) {
      const int64_t n = a.is_list() ? static_cast<int64_t>(a.list().size()) : a.Length();
      int64_t i = b.as_int();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();  // Jinja: undefined.
      if (a.is_list()) return a.list()[i];
      const auto at = CodePoints(a.str());
      return Value::String(a.str().substr(at[i], at[i + 1] - at[i]));
    }
    if (a.is_undefined()) return Value();
    return Err(line, Str("cannot index a ", KindName(a), " with a ", KindName(b)));
  }

  StatusOr<Value> Binary(const Expr& e) {
    const std::string& op = e.name;
    auto a = Eval(*e.a);
    if (!a.ok()) return a;
    if (op == "and") return a->Truthy() ? Eval(*e.b) : a;
    if (op == "or") return a->Truthy() ? a : Eval(*e.b);
    auto b = Eval(*e.b);
    if (!b.ok()) return b;
    const Value& x = *a;
    const Value& y = *b;
    if (op == "==") return Value::Bool(x.Equals(y));
    if (op == "!=") return Value::Bool(!x.Equals(y));
    if (op == "~") return Value::String(x.ToString() + y.ToString());
    if (op == "in" || op == "not in") {
      bool found = false;
      if (y.is_string()) {
        found = x.is_string() && y.str().find(x.str()) != std::string::npos;
      } else if (y.is_list()) {
        for (const Value& v : y.list()) found = found || v.Equals(x);
      } else if (y.is_mapping()) {
        found = !y.Get(x.ToString()).is_undefined();
      } else if (!y.is_undefined()) {
        return Err(e.line, Str("'in' needs a string, list or dict, got a ", KindName(y)));
      }
      return Value::Bool(op == "in" ? found : !found);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int cmp;
      if (x.is_number() && y.is_number()) {
        cmp = x.as_number() < y.as_number() ? -1 : x.as_number() > y.as_number() ? 1 : 0;
      } else if (x.is_string() && y.is_string()) {
        cmp = x.str().compare(y.str());
      } else {
        return Err(e.line, Str("cannot compare a ", KindName(x), " with a ", KindName(y)));
      }
      return Value::Bool(op == "<" ? cmp < 0 : op == ">" ? cmp > 0 : op == "<=" ? cmp <= 0 : cmp >= 0);
    }
    if (op == "+") {
      if (x.is_string() && y.is_string()) return Value::String(x.str() + y.str());
      if (x.is_list() && y.is_list()) {
        List out = x.list();
        out.insert(out.end(), y.list().begin(), y.list().end());
        return Value::MakeList(std::move(out));
      }
    }
    if (op == "*" && (x.is_string() || y.is_string())) {  // str * int, int * str.
      const Value& text = x.is_string() ? x : y;
      const Value& times = x.is_string() ? y : x;
      if (times.kind() != Value::Kind::kInt) return Err(e.line, "a string can only be repeated an int times");
      if (times.as_int() > 0 && !text.str().empty() &&
          static_cast<uint64_t>(times.as_int()) > kMaxString / text.str().size()) {
        return Err(e.line, Str("a repeated string longer than ", kMaxString, " bytes"));
      }
      std::string out;  // An empty string repeated any number of times is empty: no loop.
      for (int64_t i = 0; !text.str().empty() && i < times.as_int(); ++i) out += text.str();
      return Value::String(out);
    }
    auto num = [](const Value& v) { return v.is_number() || v.kind() == Value::Kind::kBool; };
    if (!num(x) || !num(y)) {
      return Err(e.line, Str("unsupported operand types for ", op, ": ", KindName(x), " and ", KindName(y)));
    }
    auto as_int = [](const Value& v) { return v.kind() == Value::Kind::kBool ? int64_t{v.as_bool()} : v.as_int(); };
    auto as_num = [](const Value& v) { return v.kind() == Value::Kind::kBool ? double(v.as_bool()) : v.as_number(); };
    const bool ints = x.kind() != Value::Kind::kFloat && y.kind() != Value::Kind::kFloat;
    if (op == "/") {
      if (as_num(y) == 0) return Err(e.line, "division by zero");
      return Value::Float(as_num(x) / as_num(y));
    }
    if (ints) {
      // Python's ints do not overflow; ours are 64-bit, and a result past that is an error.
      const int64_t i = as_int(x), j = as_int(y);
      int64_t r = 0;
      const Status overflow = Err(e.line, Str("integer overflow in ", op));
      if (op == "+") return __builtin_add_overflow(i, j, &r) ? StatusOr<Value>(overflow) : Value::Int(r);
      if (op == "-") return __builtin_sub_overflow(i, j, &r) ? StatusOr<Value>(overflow) : Value::Int(r);
      if (op == "*") return __builtin_mul_overflow(i, j, &r) ? StatusOr<Value>(overflow) : Value::Int(r);
      if (op == "**" && j >= 0) {
        // Bases 0, 1 and -1 never overflow, so they are answered without a loop of up to 2^63 steps;
        // any other base overflows within 64 multiplications.
        if (i == 0) return Value::Int(j == 0 ? 1 : 0);
        if (i == 1) return Value::Int(1);
        if (i == -1) return Value::Int(j % 2 == 0 ? 1 : -1);
        r = 1;
        for (int64_t k = 0; k < j; ++k) {
          if (__builtin_mul_overflow(r, i, &r)) return overflow;
        }
        return Value::Int(r);
      }
      if (j == 0 && (op == "//" || op == "%")) return Err(e.line, "division by zero");
      if (i == INT64_MIN && j == -1) return overflow;
      const int64_t q = i / j - ((i % j != 0) && ((i < 0) != (j < 0)));  // Python floors.
      if (op == "//") return Value::Int(q);
      if (op == "%") return Value::Int(i - q * j);
    }
    const double p = as_num(x), q = as_num(y);
    if (op == "+") return Value::Float(p + q);
    if (op == "-") return Value::Float(p - q);
    if (op == "*") return Value::Float(p * q);
    if (op == "**") return Value::Float(std::pow(p, q));
    if (q == 0) return Err(e.line, "division by zero");
    if (op == "//") return Value::Float(std::floor(p / q));
    if (op == "%") return Value::Float(p - std::floor(p / q) * q);
    return Err(e.line, Str("unsupported operator ", op));
  }

  struct Args {
    List pos;
    Dict kw;
    Value Arg(size_t i, const std::string& name) const {
      if (i < pos.size()) return pos[i];
      for (const auto& [k, v] : kw) {
        if (k == name) return v;
      }
      return Value();
    }
  };

  StatusOr<Args> EvalArgs(const Expr& e) {
    Args out;
    for (const ExprPtr& x : e.args) {
      auto v = Eval(*x);
      if (!v.ok()) return v.status();
      out.pos.push_back(*v);
    }
    for (const auto& [k, x] : e.kwargs) {
      auto v = Eval(*x);
      if (!v.ok()) return v.status();
      out.kw.emplace_back(k, *v);
    }
    return out;
  }

  StatusOr<Value> Call(const Expr& e) {
    auto args = EvalArgs(e);
    if (!args.ok()) return args.status();
    if (e.a->kind == Expr::Kind::kAttr) {
      auto obj = Eval(*e.a->a);
      if (!obj.ok()) return obj;
      return Method(*obj, e.a->name, *args, e.line);
    }
    if (e.a->kind != Expr::Kind::kName) return Err(e.line, "only named functions and methods can be called");
    const std::string& f = e.a->name;
    if (f == "raise_exception") {
      return absl::InvalidArgumentError(Str("chat template: ", args->Arg(0, "message").ToString()));
    }
    if (f == "namespace") {
      for (const auto& [k, v] : args->kw) {
        if (v.holds_namespace()) return Err(e.line, kNamespaceInNamespace);
      }
      Dict items = args->kw;
      return Value::MakeNamespace(std::move(items));
    }
    if (f == "dict") return Value::MakeDict(args->kw);
    if (f == "range") {
      int64_t start = 0, stop, step = 1;
      if (args->pos.size() == 1) {
        stop = args->pos[0].as_int();
      } else if (args->pos.size() >= 2) {
        start = args->pos[0].as_int();
        stop = args->pos[1].as_int();
        if (args->pos.size() == 3) step = args->pos[2].as_int();
      } else {
        return Err(e.line, "range() needs arguments");
      }
      if (step == 0) return Err(e.line, "range() step is 0");
      int64_t span = 0;
      if (__builtin_sub_overflow(stop, start, &span) || span / step > kMaxRange) {
        return Err(e.line, Str("range() longer than ", kMaxRange));
      }
      List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        out.push_back(Value::Int(i));
        if (__builtin_add_overflow(i, step, &i)) break;
      }
      return Value::MakeList(std::move(out));
    }
    if (f == "strftime_now") {
      const std::time_t now = std::time(nullptr);
      std::tm tm;
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof(buf), args->Arg(0, "format").ToString().c_str(), &tm);
      return Value::String(std::string(buf, n));
    }
    auto m = macros_.find(f);
    if (m != macros_.end()) {
      if (scopes_.size() > kMaxScopes) return Err(e.line, Str("macro calls nested deeper than ", kMaxScopes));
      const Node& macro = *m->second.node;
      scopes_.emplace_back();
      for (size_t i = 0; i < macro.params.size(); ++i) {
        const auto& [name, def] = macro.params[i];
        Value v = args->Arg(i, name);
        if (v.is_undefined() && def) {
          auto d = Eval(*def);
          if (!d.ok()) return d;
          v = *d;
        }
        scopes_.back()[name] = v;
      }
      std::string out;
      Flow flow = Flow::kNormal;
      Status s = Exec(*macro.body, &out, &flow);
      scopes_.pop_back();
      if (!s.ok()) return s;
      return Value::String(out);
    }
    return Err(e.line, Str("unknown function '", f, "'"));
  }

  StatusOr<Value> Method(const Value& obj, const std::string& name, const Args& args, int line) {
    if (obj.is_string()) {
      const std::string& s = obj.str();
      if (name == "startswith" || name == "endswith") {
        const Value p = args.Arg(0, "prefix");
        List options = p.is_list() ? p.list() : List{p};
        for (const Value& o : options) {
          if (!o.is_string()) return Err(line, Str(name, "() needs a string"));
          const std::string& t = o.str();
          const bool hit = t.size() <= s.size() &&
                           (name == "startswith" ? s.compare(0, t.size(), t) == 0
                                                 : s.compare(s.size() - t.size(), t.size(), t) == 0);
          if (hit) return Value::Bool(true);
        }
        return Value::Bool(false);
      }
      if ((name == "strip" || name == "lstrip" || name == "rstrip") && !StripChars(args.Arg(0, "chars"))) {
        return Err(line, Str(name, "() chars must be a string"));
      }
      if (name == "strip") return Value::String(Strip(s, true, true, args.Arg(0, "chars")));
      if (name == "lstrip") return Value::String(Strip(s, true, false, args.Arg(0, "chars")));
      if (name == "rstrip") return Value::String(Strip(s, false, true, args.Arg(0, "chars")));
      if (name == "lower" || name == "upper") {
        std::string out = s;
        for (char& c : out) c = static_cast<char>(name == "lower" ? std::tolower(c) : std::toupper(c));
        return Value::String(out);
      }
      if (name == "split") return Split(s, args.Arg(0, "sep"), args.Arg(1, "maxsplit"), line);
      if (name == "replace") {
        const std::string from = args.Arg(0, "old").ToString(), to = args.Arg(1, "new").ToString();
        if (from.empty()) return Err(line, "replace() of an empty string is not supported");
        std::string out;
        size_t pos = 0;
        for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
          out += s.substr(pos, hit - pos) + to;
          if (out.size() > kMaxString) {
            return Err(line, Str("replace() would make a string of more than ", kMaxString,
                                 " bytes"));
          }
        }
        return Value::String(out + s.substr(pos));
      }
      if (name == "join") {
        const Value items = args.Arg(0, "iterable");
        if (!items.is_list()) return Err(line, "join() needs a list");
        return Join(items.list(), s, line);
      }
      if (name == "find") {
        const size_t at = s.find(args.Arg(0, "sub").ToString());
        return Value::Int(at == std::string::npos ? -1 : static_cast<int64_t>(at));
      }
    }
    if (obj.is_mapping()) {
      if (name == "get") {
        const Value v = obj.Get(args.Arg(0, "key").ToString());
        if (!v.is_undefined()) return v;
        const Value def = args.Arg(1, "default");
        return def.is_undefined() ? Value::None() : def;
      }
      if (name == "items" || name == "keys" || name == "values") {
        List out;
        for (const auto& [k, v] : obj.dict()) {
          if (name == "items") out.push_back(Value::MakeList({Value::String(k), v}));
          if (name == "keys") out.push_back(Value::String(k));
          if (name == "values") out.push_back(v);
        }
        return Value::MakeList(std::move(out));
      }
    }
    return Err(line, Str("a ", KindName(obj), " has no method '", name, "'"));
  }

  StatusOr<Value> Split(const std::string& s, const Value& sep, const Value& maxsplit, int line) {
    const int64_t max = maxsplit.is_undefined() || maxsplit.is_none() ? -1 : maxsplit.as_int();
    List out;
    if (sep.is_undefined() || sep.is_none()) {  // Runs of whitespace; no empty pieces.
      const auto at = CodePoints(s);
      size_t k = 0, n = at.size() - 1;
      while (k < n) {
        while (k < n && PySpace(Decode(s, at[k], at[k + 1]))) ++k;
        if (k == n) break;
        if (max >= 0 && static_cast<int64_t>(out.size()) == max) {
          out.push_back(Value::String(Strip(s.substr(at[k]), false, true, Value())));
          break;
        }
        size_t j = k;
        while (j < n && !PySpace(Decode(s, at[j], at[j + 1]))) ++j;
        out.push_back(Value::String(s.substr(at[k], at[j] - at[k])));
        k = j;
      }
      return Value::MakeList(std::move(out));
    }
    if (!sep.is_string() || sep.str().empty()) return Err(line, "split() needs a non-empty separator");
    size_t pos = 0;
    for (size_t hit; (max < 0 || static_cast<int64_t>(out.size()) < max) &&
                     (hit = s.find(sep.str(), pos)) != std::string::npos;
         pos = hit + sep.str().size()) {
      out.push_back(Value::String(s.substr(pos, hit - pos)));
    }
    out.push_back(Value::String(s.substr(pos)));
    return Value::MakeList(std::move(out));
  }

  StatusOr<Value> Filter(const Expr& e) {
    auto in = Eval(*e.a);
    if (!in.ok()) return in;
    auto args = EvalArgs(e);
    if (!args.ok()) return args.status();
    const Value& v = *in;
    const std::string& f = e.name;
    if (f == "trim") {
      if (!StripChars(args->Arg(0, "chars"))) return Err(e.line, "trim chars must be a string");
      return Value::String(Strip(v.ToString(), true, true, args->Arg(0, "chars")));
    }
    if (f == "length" || f == "count") return Value::Int(v.Length());
    if (f == "tojson") {
      const Value indent = args->Arg(0, "indent");
      if (indent.is_undefined() || indent.is_none()) return Value::String(v.ToJson(-1));
      if (indent.kind() != Value::Kind::kInt || indent.as_int() < 0 || indent.as_int() > 32) {
        return Err(e.line, "tojson indent must be an integer in [0, 32]");
      }
      std::string json = v.ToJson(static_cast<int>(indent.as_int()), kMaxString);
      if (json.size() > kMaxString) {
        return Err(e.line, Str("tojson of more than ", kMaxString, " bytes"));
      }
      return Value::String(std::move(json));
    }
    if (f == "string") return Value::String(v.ToString());
    if (f == "safe" || f == "e" || f == "escape") {
      if (f == "safe") return v;
      return Err(e.line, "the 'escape' filter is not supported (templates render without autoescape)");
    }
    if (f == "lower" || f == "upper") return Method(Value::String(v.ToString()), f, Args{}, e.line);
    if (f == "capitalize" || f == "title") {
      std::string s = v.ToString();
      bool start = true;
      for (char& c : s) {
        const bool alpha = std::isalpha(static_cast<unsigned char>(c));
        c = static_cast<char>(start && alpha ? std::toupper(c) : std::tolower(c));
        start = f == "title" ? !alpha : false;
      }
      return Value::String(s);
    }
    if (f == "replace") return Method(Value::String(v.ToString()), "replace", *args, e.line);
    if (f == "default" || f == "d") {
      const bool boolean = args->Arg(1, "boolean").Truthy();
      if (v.is_undefined() || (boolean && !v.Truthy())) {
        const Value d = args->Arg(0, "default_value");
        return d.is_undefined() ? Value::String("") : d;
      }
      return v;
    }
    if (f == "first" || f == "last") {
      auto items = Iterate(v, e.line);
      if (!items.ok()) return items.status();
      if (items->empty()) return Value();
      return f == "first" ? items->front() : items->back();
    }
    if (f == "list") {
      auto items = Iterate(v, e.line);
      if (!items.ok()) return items.status();
      return Value::MakeList(*items);
    }
    if (f == "reverse") {
      if (v.is_string()) {
        const auto at = CodePoints(v.str());
        std::string out;
        for (size_t k = at.size() - 1; k > 0; --k) out += v.str().substr(at[k - 1], at[k] - at[k - 1]);
        return Value::String(out);
      }
      auto items = Iterate(v, e.line);
      if (!items.ok()) return items.status();
      List out(items->rbegin(), items->rend());
      return Value::MakeList(std::move(out));
    }
    if (f == "join") {
      auto items = Iterate(v, e.line);
      if (!items.ok()) return items.status();
      const std::string sep = args->Arg(0, "d").ToString();
      return Join(*items, sep, e.line);
    }
    if (f == "items") return Method(v, "items", Args{}, e.line);
    if (f == "int") {
      if (v.kind() == Value::Kind::kInt) return v;
      if (v.is_number()) {
        const double d = v.as_number();
        if (!(d > -9.2e18 && d < 9.2e18)) return Err(e.line, "int() of a float out of range");
        return Value::Int(static_cast<int64_t>(d));
      }
      if (v.is_string()) return Value::Int(std::strtoll(v.str().c_str(), nullptr, 10));
      return Value::Int(0);
    }
    if (f == "float") {
      if (v.is_number()) return Value::Float(v.as_number());
      if (v.is_string()) return Value::Float(std::strtod(v.str().c_str(), nullptr));
      return Value::Float(0);
    }
    if (f == "abs") {
      if (v.kind() == Value::Kind::kInt) {
        if (v.as_int() == INT64_MIN) return Err(e.line, "integer overflow in abs");
        return Value::Int(std::llabs(v.as_int()));
      }
      return Value::Float(std::fabs(v.as_number()));
    }
    if (f == "map" || f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
      auto items = Iterate(v, e.line);
      if (!items.ok()) return items.status();
      List out;
      const bool by_attr = f == "map" || f == "selectattr" || f == "rejectattr";
      const std::string attr = by_attr ? args->Arg(0, "attribute").ToString() : "";
      if (f == "map" && args->Arg(0, "attribute").is_undefined()) {
        return Err(e.line, "map() is supported with attribute= only");
      }
      for (const Value& item : *items) {
        if (f == "map") {
          out.push_back(item.Get(attr));
          continue;
        }
        const Value subject = by_attr ? item.Get(attr) : item;
        const size_t test_arg = by_attr ? 1 : 0;
        bool pass;
        if (args->pos.size() > test_arg) {
          Args rest;
          rest.pos.assign(args->pos.begin() + test_arg + 1, args->pos.end());
          auto t = ApplyTest(args->pos[test_arg].ToString(), subject, rest, e.line);
          if (!t.ok()) return t.status();
          pass = *t;
        } else {
          pass = subject.Truthy();
        }
        if (pass == (f == "selectattr" || f == "select")) out.push_back(item);
      }
      return Value::MakeList(std::move(out));
    }
    return Err(e.line, Str("unknown filter '", f, "'"));
  }

  StatusOr<bool> Test(const Expr& e) {
    auto v = Eval(*e.a);
    if (!v.ok()) return v.status();
    auto args = EvalArgs(e);
    if (!args.ok()) return args.status();
    return ApplyTest(e.name, *v, *args, e.line);
  }

  StatusOr<bool> ApplyTest(const std::string& t, const Value& v, const Args& args, int line) {
    if (t == "defined") return !v.is_undefined();
    if (t == "undefined") return v.is_undefined();
    if (t == "none") return v.is_none();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.kind() == Value::Kind::kInt;
    if (t == "float") return v.kind() == Value::Kind::kFloat;
    if (t == "boolean") return v.kind() == Value::Kind::kBool;
    if (t == "true") return v.kind() == Value::Kind::kBool && v.as_bool();
    if (t == "false") return v.kind() == Value::Kind::kBool && !v.as_bool();
    if (t == "mapping") return v.is_mapping();
    if (t == "iterable") return v.is_list() || v.is_string() || v.is_mapping();
    if (t == "sequence") return v.is_list() || v.is_string() || v.is_mapping();
    if (t == "callable") return false;
    if (t == "odd" || t == "even") {
      if (v.kind() != Value::Kind::kInt) return Err(line, Str("'", t, "' needs an integer"));
      return (v.as_int() % 2 != 0) == (t == "odd");
    }
    if (t == "divisibleby") {
      const int64_t d = args.Arg(0, "num").as_int();
      if (d == 0) return Err(line, "divisibleby 0");
      if (d == -1) return true;  // Also for INT64_MIN, whose % -1 would overflow.
      return v.as_int() % d == 0;
    }
    if (t == "eq" || t == "equalto" || t == "==") return v.Equals(args.Arg(0, "other"));
    if (t == "ne" || t == "!=") return !v.Equals(args.Arg(0, "other"));
    if (t == "in") {
      const Value c = args.Arg(0, "seq");
      if (c.is_list()) {
        for (const Value& x : c.list()) {
          if (x.Equals(v)) return true;
        }
        return false;
      }
      if (c.is_string()) return v.is_string() && c.str().find(v.str()) != std::string::npos;
      if (c.is_mapping()) return !c.Get(v.ToString()).is_undefined();
      return false;
    }
    return Err(line, Str("unknown test '", t, "'"));
  }

  static constexpr size_t kMaxScopes = 200;  // Loops and macro calls: recursion is bounded.
  // Work bounds, far above what a chat template does per request, so none can hang a request.
  static constexpr int64_t kMaxSteps = 10'000'000;
  static constexpr uint64_t kMaxString = 64 << 20;
  // Request JSON nests at most 64 levels (openai_request.cc); templates may wrap it a little.
  static constexpr int kMaxDepth = 128;
  // A namespace may not hold a namespace, even inside a list or dict: no value can then come to
  // contain itself (a cycle would print forever and never be freed), and a namespace's depth is
  // its attributes' (which hold none) plus one. Chat templates keep flags and counters there.
  static constexpr const char* kNamespaceInNamespace =
      "a namespace attribute cannot hold a namespace (or a list or dict holding one)";
  static constexpr int64_t kMaxRange = 1'000'000;
  int64_t steps_ = 0;
  std::vector<std::map<std::string, Value>> scopes_;
  std::map<std::string, Macro> macros_;
};

}  // namespace

absl::StatusOr<std::string> Template::Render(const Value& context) const {
  if (!context.is_mapping()) return absl::InvalidArgumentError("chat template context must be a dict");
  Renderer r(context);
  std::string out;
  if (absl::Status s = r.Run(*root_, &out); !s.ok()) return s;
  return out;
}

}  // namespace pdserve::jinja
