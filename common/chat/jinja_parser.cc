// Template::Parse: splits the source into text and tags, applies whitespace control
// (`-` on a tag, trim_blocks, lstrip_blocks), then parses tags into the tree of jinja_ast.h.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string_view>

#include "common/base/strings.h"
#include "common/chat/jinja.h"
#include "common/chat/jinja_ast.h"

namespace pdserve::jinja {
namespace {

struct Segment {
  enum Kind { kText, kExpr, kStmt, kComment } kind;
  std::string content;
  int line = 1;
  bool strip_before = false;  // {%- {{- {#-
  bool strip_after = false;   // -%} -}} -#}
  bool keep_before = false;   // {%+ : no lstrip_blocks
};

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

absl::StatusOr<std::vector<Segment>> Split(const std::string& src) {
  std::vector<Segment> out;
  size_t pos = 0;
  int line = 1;
  auto count_lines = [&](size_t from, size_t to) {
    for (size_t i = from; i < to; ++i) line += src[i] == '\n';
  };
  while (pos < src.size()) {
    size_t open = std::string::npos;
    for (size_t i = pos; i + 1 < src.size(); ++i) {
      if (src[i] == '{' && (src[i + 1] == '{' || src[i + 1] == '%' || src[i + 1] == '#')) {
        open = i;
        break;
      }
    }
    if (open == std::string::npos) {
      out.push_back({Segment::kText, src.substr(pos), line});
      break;
    }
    if (open > pos) {
      out.push_back({Segment::kText, src.substr(pos, open - pos), line});
      count_lines(pos, open);
    }
    const char type = src[open + 1];
    const std::string close = type == '{' ? "}}" : type == '%' ? "%}" : "#}";
    Segment seg{type == '{' ? Segment::kExpr : type == '%' ? Segment::kStmt : Segment::kComment, "", line};
    size_t body = open + 2;
    if (body < src.size() && src[body] == '-') {
      seg.strip_before = true;
      ++body;
    } else if (body < src.size() && src[body] == '+') {
      seg.keep_before = true;
      ++body;
    }
    // The closing delimiter, outside string literals (comments have none).
    size_t end = std::string::npos;
    char quote = 0;
    for (size_t i = body; i + 1 < src.size(); ++i) {
      if (seg.kind != Segment::kComment) {
        if (quote) {
          if (src[i] == '\\') {
            ++i;
          } else if (src[i] == quote) {
            quote = 0;
          }
          continue;
        }
        if (src[i] == '\'' || src[i] == '"') {
          quote = src[i];
          continue;
        }
      }
      if (src.compare(i, 2, close) == 0) {
        end = i;
        break;
      }
    }
    if (end == std::string::npos) {
      return absl::InvalidArgumentError(Str("chat template line ", line, ": unclosed '{", std::string(1, type), "'"));
    }
    size_t content_end = end;
    if (content_end > body && src[content_end - 1] == '-') {
      seg.strip_after = true;
      --content_end;
    }
    seg.content = src.substr(body, content_end - body);
    out.push_back(seg);
    count_lines(open, end + 2);
    pos = end + 2;
  }
  // Whitespace control on the text between tags.
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].kind != Segment::kText) continue;
    std::string& t = out[i].content;
    if (i + 1 < out.size()) {
      const Segment& next = out[i + 1];
      if (next.strip_before) {
        while (!t.empty() && IsSpace(t.back())) t.pop_back();
      } else if ((next.kind == Segment::kStmt || next.kind == Segment::kComment) && !next.keep_before) {
        // lstrip_blocks: spaces and tabs between the line's start and the block tag.
        const size_t nl = t.find_last_of('\n');
        if (nl != std::string::npos || i == 0) {
          const size_t from = nl == std::string::npos ? 0 : nl + 1;
          if (t.find_first_not_of(" \t", from) == std::string::npos) t.erase(from);
        }
      }
    }
    if (i > 0) {
      const Segment& prev = out[i - 1];
      if (prev.strip_after) {
        size_t n = 0;
        while (n < t.size() && IsSpace(t[n])) ++n;
        t.erase(0, n);
      } else if (prev.kind == Segment::kStmt || prev.kind == Segment::kComment) {
        // trim_blocks: the first newline after a block tag.
        if (t.compare(0, 2, "\r\n") == 0) {
          t.erase(0, 2);
        } else if (!t.empty() && t[0] == '\n') {
          t.erase(0, 1);
        }
      }
    }
  }
  return out;
}

// Tokens inside a tag.
struct Token {
  enum Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind;
  std::string text;
  Value value;
};

absl::StatusOr<std::vector<Token>> Lex(const std::string& s, int line) {
  std::vector<Token> out;
  size_t i = 0;
  static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                               "(", ")", "[", "]", "{", "}", ".", ",", ":", "|", "="};
  while (i < s.size()) {
    const char c = s[i];
    if (IsSpace(c)) {
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::kName, s.substr(i, j - i), {}});
      i = j;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {  // 1e20, 2.5e-3
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
          is_float = true;
          j = k;
          while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
        }
      }
      std::string num;
      for (size_t k = i; k < j; ++k) {
        if (s[k] != '_') num += s[k];
      }
      if (is_float) {
        out.push_back({Token::kFloat, num, Value::Float(std::strtod(num.c_str(), nullptr))});
      } else {
        // Python's ints are unbounded; ours are 64-bit, so a literal past that is an error (strtoll
        // would silently saturate it).
        errno = 0;
        const long long v = std::strtoll(num.c_str(), nullptr, 10);
        if (errno == ERANGE) {
          return absl::InvalidArgumentError(
              Str("chat template line ", line, ": integer literal ", num, " does not fit in 64 bits"));
        }
        out.push_back({Token::kInt, num, Value::Int(v)});
      }
      i = j;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] == '\\' && j + 1 < s.size()) {
          const char e = s[++j];
          switch (e) {
            case 'n': v += '\n'; break;
            case 't': v += '\t'; break;
            case 'r': v += '\r'; break;
            case '\\': v += '\\'; break;
            case '\'': v += '\''; break;
            case '"': v += '"'; break;
            default: v += '\\'; v += e;
          }
        } else {
          v += s[j];
        }
      }
      if (j >= s.size()) return absl::InvalidArgumentError(Str("chat template line ", line, ": unterminated string"));
      out.push_back({Token::kString, v, Value::String(v)});
      i = j + 1;
      continue;
    }
    bool matched = false;
    for (const char* op : kOps) {
      const size_t n = std::string_view(op).size();
      if (s.compare(i, n, op) == 0) {
        out.push_back({Token::kOp, op, {}});
        i += n;
        matched = true;
        break;
      }
    }
    if (!matched) {
      return absl::InvalidArgumentError(Str("chat template line ", line, ": unexpected character '", std::string(1, c), "'"));
    }
  }
  out.push_back({Token::kEnd, "", {}});
  return out;
}

class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, int line) : t_(std::move(tokens)), line_(line) {}

  bool AtEnd() const { return t_[p_].kind == Token::kEnd; }
  bool IsName(const char* n) const { return t_[p_].kind == Token::kName && t_[p_].text == n; }
  bool IsOp(const char* o) const { return t_[p_].kind == Token::kOp && t_[p_].text == o; }
  const Token& Peek() const { return t_[p_]; }
  absl::Status Expect(const char* what) {
    if ((t_[p_].kind == Token::kOp || t_[p_].kind == Token::kName) && t_[p_].text == what) {
      ++p_;
      return absl::OkStatus();
    }
    return Error(Str("expected '", what, "'"));
  }
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(Str("chat template line ", line_, ": ", what, " near '",
                                          t_[p_].kind == Token::kEnd ? "end of tag" : t_[p_].text, "'"));
  }
  absl::StatusOr<std::string> Name() {
    if (t_[p_].kind != Token::kName) return Error("expected a name");
    return t_[p_++].text;
  }
  absl::Status ExpectEnd() { return AtEnd() ? absl::OkStatus() : Error("unexpected token"); }

  // expression := or ['if' or ['else' expression]]
  absl::StatusOr<ExprPtr> Expression() {
    // Nesting is bounded so that no template can exhaust the stack.
    if (++depth_ > kMaxDepth) return Error(Str("expressions nested deeper than ", kMaxDepth));
    struct Leave {
      int* d;
      ~Leave() { --*d; }
    } leave{&depth_};
    auto e = Or();
    if (!e.ok()) return e;
    if (IsName("if")) {
      ++p_;
      auto cond = Or();
      if (!cond.ok()) return cond;
      ExprPtr other;
      if (IsName("else")) {
        ++p_;
        auto o = Expression();
        if (!o.ok()) return o;
        other = *o;
      }
      auto x = Make(Expr::Kind::kCond);
      x->a = *cond;
      x->b = *e;
      x->c = other;
      return ExprPtr(x);
    }
    return e;
  }

 private:
  std::shared_ptr<Expr> Make(Expr::Kind k) {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = line_;
    return e;
  }
  ExprPtr Binary(const std::string& op, ExprPtr a, ExprPtr b) {
    auto e = Make(Expr::Kind::kBinary);
    e->name = op;
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  absl::StatusOr<ExprPtr> Or() {
    auto l = And();
    while (l.ok() && IsName("or")) {
      ++p_;
      auto r = And();
      if (!r.ok()) return r;
      l = Binary("or", *l, *r);
    }
    return l;
  }
  absl::StatusOr<ExprPtr> And() {
    auto l = Not();
    while (l.ok() && IsName("and")) {
      ++p_;
      auto r = Not();
      if (!r.ok()) return r;
      l = Binary("and", *l, *r);
    }
    return l;
  }
  absl::StatusOr<ExprPtr> Not() {
    if (IsName("not")) {
      if (++unary_ + depth_ > kMaxDepth) return Error(Str("expressions nested deeper than ", kMaxDepth));
      ++p_;
      auto x = Not();
      if (!x.ok()) return x;
      auto e = Make(Expr::Kind::kUnary);
      e->name = "not";
      e->a = *x;
      return ExprPtr(e);
    }
    return Compare();
  }
  absl::StatusOr<ExprPtr> Compare() {
    auto l = Add();
    while (l.ok()) {
      std::string op;
      if (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") || IsOp("<=") || IsOp(">=")) {
        op = t_[p_++].text;
      } else if (IsName("in")) {
        ++p_;
        op = "in";
      } else if (IsName("not") && t_[p_ + 1].kind == Token::kName && t_[p_ + 1].text == "in") {
        p_ += 2;
        op = "not in";
      } else {
        break;
      }
      auto r = Add();
      if (!r.ok()) return r;
      l = Binary(op, *l, *r);
    }
    return l;
  }
  absl::StatusOr<ExprPtr> Add() {
    auto l = Concat();
    while (l.ok() && (IsOp("+") || IsOp("-"))) {
      const std::string op = t_[p_++].text;
      auto r = Concat();
      if (!r.ok()) return r;
      l = Binary(op, *l, *r);
    }
    return l;
  }
  absl::StatusOr<ExprPtr> Concat() {
    auto l = Mul();
    while (l.ok() && IsOp("~")) {
      ++p_;
      auto r = Mul();
      if (!r.ok()) return r;
      l = Binary("~", *l, *r);
    }
    return l;
  }
  absl::StatusOr<ExprPtr> Mul() {
    auto l = Pow();
    while (l.ok() && (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%"))) {
      const std::string op = t_[p_++].text;
      auto r = Pow();
      if (!r.ok()) return r;
      l = Binary(op, *l, *r);
    }
    return l;
  }
  absl::StatusOr<ExprPtr> Pow() {
    auto l = Unary();
    while (l.ok() && IsOp("**")) {
      ++p_;
      auto r = Unary();
      if (!r.ok()) return r;
      l = Binary("**", *l, *r);
    }
    return l;
  }
  absl::StatusOr<ExprPtr> Unary() {
    if ((IsOp("-") || IsOp("+") || IsName("not")) && depth_ + unary_ > kMaxDepth) {
      return Error(Str("expressions nested deeper than ", kMaxDepth));
    }
    if (IsOp("-") || IsOp("+")) {
      ++unary_;
      const std::string op = t_[p_++].text;
      auto x = Unary();
      if (!x.ok()) return x;
      auto e = Make(Expr::Kind::kUnary);
      e->name = op;
      e->a = *x;
      return ExprPtr(e);
    }
    auto x = Primary();
    if (!x.ok()) return x;
    return Postfix(*x);
  }

  absl::Status Args(std::vector<ExprPtr>* args, std::vector<std::pair<std::string, ExprPtr>>* kwargs) {
    // After '(': positional and keyword arguments up to ')'.
    while (!IsOp(")")) {
      if (t_[p_].kind == Token::kName && t_[p_ + 1].kind == Token::kOp && t_[p_ + 1].text == "=") {
        const std::string key = t_[p_].text;
        p_ += 2;
        auto v = Expression();
        if (!v.ok()) return v.status();
        kwargs->emplace_back(key, *v);
      } else {
        auto v = Expression();
        if (!v.ok()) return v.status();
        args->push_back(*v);
      }
      if (IsOp(",")) {
        ++p_;
      } else if (!IsOp(")")) {
        return Error("expected ',' or ')'");
      }
    }
    ++p_;
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> Postfix(ExprPtr x) {
    while (true) {
      if (IsOp(".")) {
        ++p_;
        auto n = Name();
        if (!n.ok()) return n.status();
        auto e = Make(Expr::Kind::kAttr);
        e->a = x;
        e->name = *n;
        x = e;
      } else if (IsOp("[")) {
        ++p_;
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) {
            auto v = Expression();
            if (!v.ok()) return v;
            parts[k] = *v;
          }
          if (IsOp(":") && k < 2) {
            ++p_;
            slice = true;
            continue;
          }
          break;
        }
        if (absl::Status s = Expect("]"); !s.ok()) return s;
        auto e = Make(slice ? Expr::Kind::kSlice : Expr::Kind::kItem);
        e->a = x;
        if (slice) {
          e->args = {parts[0], parts[1], parts[2]};
        } else {
          if (parts[0] == nullptr) return Error("empty subscript");
          e->b = parts[0];
        }
        x = e;
      } else if (IsOp("(")) {
        ++p_;
        auto e = Make(Expr::Kind::kCall);
        e->a = x;
        if (absl::Status s = Args(&e->args, &e->kwargs); !s.ok()) return s;
        x = e;
      } else if (IsOp("|")) {
        ++p_;
        auto n = Name();
        if (!n.ok()) return n.status();
        auto e = Make(Expr::Kind::kFilter);
        e->a = x;
        e->name = *n;
        if (IsOp("(")) {
          ++p_;
          if (absl::Status s = Args(&e->args, &e->kwargs); !s.ok()) return s;
        }
        x = e;
      } else if (IsName("is")) {
        ++p_;
        auto e = Make(Expr::Kind::kTest);
        e->a = x;
        if (IsName("not")) {
          ++p_;
          e->negated = true;
        }
        auto n = Name();
        if (!n.ok()) return n.status();
        e->name = *n;
        if (IsOp("(")) {
          ++p_;
          if (absl::Status s = Args(&e->args, &e->kwargs); !s.ok()) return s;
        } else if (t_[p_].kind == Token::kString || t_[p_].kind == Token::kInt ||
                   (t_[p_].kind == Token::kName && t_[p_].text != "and" && t_[p_].text != "or" &&
                    t_[p_].text != "else" && t_[p_].text != "if")) {
          auto arg = Primary();  // `x is divisibleby 3`, `x is sameas y`.
          if (!arg.ok()) return arg;
          e->args.push_back(*arg);
        }
        x = e;
      } else {
        return x;
      }
    }
  }

  absl::StatusOr<ExprPtr> Primary() {
    const Token& t = t_[p_];
    if (t.kind == Token::kString) {
      // Adjacent string literals concatenate.
      std::string s;
      while (t_[p_].kind == Token::kString) s += t_[p_++].text;
      auto e = Make(Expr::Kind::kLiteral);
      e->value = Value::String(s);
      return ExprPtr(e);
    }
    if (t.kind == Token::kInt || t.kind == Token::kFloat) {
      auto e = Make(Expr::Kind::kLiteral);
      e->value = t_[p_++].value;
      return ExprPtr(e);
    }
    if (t.kind == Token::kName) {
      ++p_;
      auto e = Make(Expr::Kind::kLiteral);
      if (t.text == "true" || t.text == "True") {
        e->value = Value::Bool(true);
      } else if (t.text == "false" || t.text == "False") {
        e->value = Value::Bool(false);
      } else if (t.text == "none" || t.text == "None") {
        e->value = Value::None();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      return ExprPtr(e);
    }
    if (IsOp("(")) {
      ++p_;
      auto x = Expression();
      if (!x.ok()) return x;
      if (IsOp(",")) {  // A tuple: evaluated as a list.
        auto e = Make(Expr::Kind::kList);
        e->args.push_back(*x);
        while (IsOp(",")) {
          ++p_;
          if (IsOp(")")) break;
          auto y = Expression();
          if (!y.ok()) return y;
          e->args.push_back(*y);
        }
        x = ExprPtr(e);
      }
      if (absl::Status s = Expect(")"); !s.ok()) return s;
      return x;
    }
    if (IsOp("[")) {
      ++p_;
      auto e = Make(Expr::Kind::kList);
      while (!IsOp("]")) {
        auto y = Expression();
        if (!y.ok()) return y;
        e->args.push_back(*y);
        if (IsOp(",")) {
          ++p_;
        } else if (!IsOp("]")) {
          return Error("expected ',' or ']'");
        }
      }
      ++p_;
      return ExprPtr(e);
    }
    if (IsOp("{")) {
      ++p_;
      auto e = Make(Expr::Kind::kDict);
      while (!IsOp("}")) {
        auto k = Expression();
        if (!k.ok()) return k;
        if (absl::Status s = Expect(":"); !s.ok()) return s;
        auto v = Expression();
        if (!v.ok()) return v;
        e->args.push_back(*k);
        e->args.push_back(*v);
        if (IsOp(",")) {
          ++p_;
        } else if (!IsOp("}")) {
          return Error("expected ',' or '}'");
        }
      }
      ++p_;
      return ExprPtr(e);
    }
    return Error("expected an expression");
  }

  static constexpr int kMaxDepth = 100;
  std::vector<Token> t_;
  size_t p_ = 0;
  int line_;
  int depth_ = 0;
  int unary_ = 0;  // Prefix operators so far (each recurses once).
};

// Statements: a recursive descent over the segments.
class StmtParser {
 public:
  explicit StmtParser(std::vector<Segment> segs) : s_(std::move(segs)) {}

  // Parses until one of `ends` (a block keyword) or the end; *ended gets the keyword found.
  absl::StatusOr<NodePtr> Body(const std::vector<std::string>& ends, std::string* ended,
                               std::unique_ptr<ExprParser>* end_tag) {
    if (depth_ >= kMaxBlockDepth) {
      return absl::InvalidArgumentError(Str("chat template: blocks nested deeper than ", kMaxBlockDepth));
    }
    ++depth_;
    struct Leave {
      int* d;
      ~Leave() { --*d; }
    } leave{&depth_};
    auto body = std::make_shared<Node>();
    body->kind = Node::Kind::kBody;
    while (i_ < s_.size()) {
      const Segment& seg = s_[i_];
      if (seg.kind == Segment::kText) {
        if (!seg.content.empty()) {
          auto n = std::make_shared<Node>();
          n->kind = Node::Kind::kText;
          n->text = seg.content;
          body->children.push_back(n);
        }
        ++i_;
        continue;
      }
      if (seg.kind == Segment::kComment) {
        ++i_;
        continue;
      }
      auto tokens = Lex(seg.content, seg.line);
      if (!tokens.ok()) return tokens.status();
      auto p = std::make_unique<ExprParser>(std::move(*tokens), seg.line);
      if (seg.kind == Segment::kExpr) {
        auto e = p->Expression();
        if (!e.ok()) return e.status();
        if (absl::Status st = p->ExpectEnd(); !st.ok()) return st;
        auto n = std::make_shared<Node>();
        n->kind = Node::Kind::kOutput;
        n->expr = *e;
        n->line = seg.line;
        body->children.push_back(n);
        ++i_;
        continue;
      }
      auto kw = p->Name();
      if (!kw.ok()) return kw.status();
      for (const std::string& e : ends) {
        if (*kw == e) {
          *ended = e;
          ++i_;
          *end_tag = std::move(p);
          return NodePtr(body);
        }
      }
      ++i_;
      auto n = Statement(*kw, p.get(), seg.line);
      if (!n.ok()) return n.status();
      if (*n != nullptr) body->children.push_back(*n);
    }
    if (!ends.empty()) {
      return absl::InvalidArgumentError(Str("chat template: missing '{% ", ends.back(), " %}'"));
    }
    *ended = "";
    return NodePtr(body);
  }

 private:
  absl::StatusOr<NodePtr> Statement(const std::string& kw, ExprParser* p, int line) {
    auto n = std::make_shared<Node>();
    n->line = line;
    std::string ended;
    std::unique_ptr<ExprParser> tag;
    if (kw == "if") {
      n->kind = Node::Kind::kIf;
      auto cond = p->Expression();
      if (!cond.ok()) return cond.status();
      if (absl::Status s = p->ExpectEnd(); !s.ok()) return s;
      ExprPtr c = *cond;
      while (true) {
        auto body = Body({"elif", "else", "endif"}, &ended, &tag);
        if (!body.ok()) return body.status();
        n->branches.emplace_back(c, *body);
        if (ended == "elif") {
          auto next = tag->Expression();
          if (!next.ok()) return next.status();
          c = *next;
          continue;
        }
        if (ended == "else") {
          auto other = Body({"endif"}, &ended, &tag);
          if (!other.ok()) return other.status();
          n->else_body = *other;
        }
        break;
      }
      return NodePtr(n);
    }
    if (kw == "for") {
      n->kind = Node::Kind::kFor;
      while (true) {
        auto name = p->Name();
        if (!name.ok()) return name.status();
        n->targets.push_back(*name);
        if (!p->IsOp(",")) break;
        if (absl::Status s = p->Expect(","); !s.ok()) return s;
      }
      if (absl::Status s = p->Expect("in"); !s.ok()) return s;
      auto iter = p->Expression();  // `x if c` here would parse as a ternary: see below.
      if (!iter.ok()) return iter.status();
      n->expr = *iter;
      if ((*iter)->kind == Expr::Kind::kCond && (*iter)->c == nullptr) {
        n->expr = (*iter)->b;  // `for x in xs if cond`: a filter, not a ternary.
        n->filter = (*iter)->a;
      }
      if (p->IsName("recursive")) return p->Error("'recursive' loops are not supported");
      if (absl::Status s = p->ExpectEnd(); !s.ok()) return s;
      auto body = Body({"else", "endfor"}, &ended, &tag);
      if (!body.ok()) return body.status();
      n->body = *body;
      if (ended == "else") {
        auto other = Body({"endfor"}, &ended, &tag);
        if (!other.ok()) return other.status();
        n->else_body = *other;
      }
      return NodePtr(n);
    }
    if (kw == "set") {
      n->kind = Node::Kind::kSet;
      auto name = p->Name();
      if (!name.ok()) return name.status();
      n->targets.push_back(*name);
      if (p->IsOp(".")) {
        if (absl::Status s = p->Expect("."); !s.ok()) return s;
        auto attr = p->Name();
        if (!attr.ok()) return attr.status();
        n->attr = *attr;
      }
      while (p->IsOp(",")) {
        if (absl::Status s = p->Expect(","); !s.ok()) return s;
        auto more = p->Name();
        if (!more.ok()) return more.status();
        n->targets.push_back(*more);
      }
      if (p->AtEnd()) {  // {% set x %}...{% endset %}
        auto body = Body({"endset"}, &ended, &tag);
        if (!body.ok()) return body.status();
        n->body = *body;
        return NodePtr(n);
      }
      if (absl::Status s = p->Expect("="); !s.ok()) return s;
      auto value = p->Expression();
      if (!value.ok()) return value.status();
      n->expr = *value;
      if (absl::Status s = p->ExpectEnd(); !s.ok()) return s;
      return NodePtr(n);
    }
    if (kw == "macro") {
      n->kind = Node::Kind::kMacro;
      auto name = p->Name();
      if (!name.ok()) return name.status();
      n->targets.push_back(*name);
      if (absl::Status s = p->Expect("("); !s.ok()) return s;
      while (!p->IsOp(")")) {
        auto param = p->Name();
        if (!param.ok()) return param.status();
        ExprPtr def;
        if (p->IsOp("=")) {
          if (absl::Status s = p->Expect("="); !s.ok()) return s;
          auto d = p->Expression();
          if (!d.ok()) return d.status();
          def = *d;
        }
        n->params.emplace_back(*param, def);
        if (p->IsOp(",")) {
          if (absl::Status s = p->Expect(","); !s.ok()) return s;
        } else if (!p->IsOp(")")) {
          return p->Error("expected ',' or ')'");
        }
      }
      if (absl::Status s = p->Expect(")"); !s.ok()) return s;
      auto body = Body({"endmacro"}, &ended, &tag);
      if (!body.ok()) return body.status();
      n->body = *body;
      return NodePtr(n);
    }
    if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      return NodePtr(n);
    }
    if (kw == "generation" || kw == "endgeneration") {
      return NodePtr(nullptr);  // Hugging Face's assistant-mask markers: no output of their own.
    }
    return absl::InvalidArgumentError(
        Str("chat template line ", line, ": the '", kw, "' tag is not supported"));
  }

  static constexpr int kMaxBlockDepth = 100;
  std::vector<Segment> s_;
  size_t i_ = 0;
  int depth_ = 0;
};

// Every filter, test, function and method the template names must be one the renderer has.
class Validator {
 public:
  absl::Status Check(const Node& root) {
    CollectMacros(root);
    return Walk(root);
  }

 private:
  void CollectMacros(const Node& n) {
    if (n.kind == Node::Kind::kMacro) macros_.push_back(n.targets[0]);
    for (const NodePtr& c : n.children) CollectMacros(*c);
    for (const auto& b : n.branches) CollectMacros(*b.second);
    if (n.body) CollectMacros(*n.body);
    if (n.else_body) CollectMacros(*n.else_body);
  }

  absl::Status Unknown(int line, const char* what, const std::string& name) {
    return absl::InvalidArgumentError(Str("chat template line ", line, ": unknown ", what, " '", name, "'"));
  }

  absl::Status Walk(const Expr* e) {
    if (e == nullptr) return absl::OkStatus();
    if (e->kind == Expr::Kind::kFilter && !KnownFilter(e->name)) return Unknown(e->line, "filter", e->name);
    if (e->kind == Expr::Kind::kTest && !KnownTest(e->name)) return Unknown(e->line, "test", e->name);
    if (e->kind == Expr::Kind::kCall) {
      if (e->a->kind == Expr::Kind::kName && !KnownFunction(e->a->name) &&
          std::find(macros_.begin(), macros_.end(), e->a->name) == macros_.end()) {
        return Unknown(e->line, "function", e->a->name);
      }
      if (e->a->kind == Expr::Kind::kAttr && !KnownMethod(e->a->name)) return Unknown(e->line, "method", e->a->name);
    }
    for (const Expr* x : {e->a.get(), e->b.get(), e->c.get()}) {
      if (absl::Status s = Walk(x); !s.ok()) return s;
    }
    for (const ExprPtr& x : e->args) {
      if (absl::Status s = Walk(x.get()); !s.ok()) return s;
    }
    for (const auto& [k, x] : e->kwargs) {
      if (absl::Status s = Walk(x.get()); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Walk(const Node& n) {
    for (const Expr* x : {n.expr.get(), n.filter.get()}) {
      if (absl::Status s = Walk(x); !s.ok()) return s;
    }
    for (const auto& [name, def] : n.params) {
      if (absl::Status s = Walk(def.get()); !s.ok()) return s;
    }
    for (const auto& [cond, body] : n.branches) {
      if (absl::Status s = Walk(cond.get()); !s.ok()) return s;
      if (absl::Status s = Walk(*body); !s.ok()) return s;
    }
    for (const NodePtr& c : n.children) {
      if (absl::Status s = Walk(*c); !s.ok()) return s;
    }
    if (n.body) {
      if (absl::Status s = Walk(*n.body); !s.ok()) return s;
    }
    if (n.else_body) return Walk(*n.else_body);
    return absl::OkStatus();
  }

  std::vector<std::string> macros_;
};

}  // namespace

absl::StatusOr<Template> Template::Parse(const std::string& source) {
  auto segments = Split(source);
  if (!segments.ok()) return segments.status();
  StmtParser parser(std::move(*segments));
  std::string ended;
  std::unique_ptr<ExprParser> tag;
  auto root = parser.Body({}, &ended, &tag);
  if (!root.ok()) return root.status();
  if (absl::Status s = Validator().Check(**root); !s.ok()) return s;
  Template t;
  t.root_ = *root;
  return t;
}

}  // namespace pdserve::jinja
