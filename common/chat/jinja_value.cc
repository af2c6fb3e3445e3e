#include "common/chat/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace pdserve::jinja {

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.d_ = d;
  return v;
}
namespace {
uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }
}  // namespace

Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.weight_ = s.size();
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
void Value::SetNesting(const Value& element) {
  depth_ = std::max(depth_, element.depth_ + 1);
  holds_namespace_ = holds_namespace_ || element.holds_namespace_;
  weight_ = SaturatingAdd(weight_, SaturatingAdd(kElementWeight, element.weight_));
}
uint64_t Value::Weight() const {
  if (!holds_namespace_) return weight_;
  uint64_t w = kScalarWeight;  // As a container made now starts.
  if (kind_ == Kind::kList) {
    for (const Value& e : *list_) w = SaturatingAdd(w, SaturatingAdd(kElementWeight, e.Weight()));
  } else {
    for (const auto& [k, e] : *dict_) {
      w = SaturatingAdd(w, SaturatingAdd(kElementWeight + k.size(), e.Weight()));
    }
  }
  return w;
}
Value Value::MakeList(List items) {
  Value v;
  v.kind_ = Kind::kList;
  v.depth_ = 1;
  for (const Value& e : items) v.SetNesting(e);
  v.list_ = std::make_shared<const List>(std::move(items));
  return v;
}
Value Value::MakeDict(Dict items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.depth_ = 1;
  for (const auto& [k, e] : items) {
    v.SetNesting(e);
    v.weight_ = SaturatingAdd(v.weight_, k.size());
  }
  v.dict_ = std::make_shared<Dict>(std::move(items));
  return v;
}
Value Value::MakeNamespace(Dict items) {
  Value v = MakeDict(std::move(items));
  v.kind_ = Kind::kNamespace;
  v.holds_namespace_ = true;
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return None();
    case nlohmann::json::value_t::boolean: return Bool(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Int(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return Int(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::json::value_t::number_float: return Float(j.get<double>());
    case nlohmann::json::value_t::string: return String(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(FromJson(e));
      return MakeList(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict items;
      for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(it.key(), FromJson(it.value()));
      return MakeDict(std::move(items));
    }
    default: return Value();
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return d_ != 0;
    case Kind::kString: return !s_->empty();
    case Kind::kList: return !list_->empty();
    case Kind::kDict: return !dict_->empty();
    case Kind::kNamespace: return true;
  }
  return false;
}

Value Value::Get(const std::string& key) const {
  if (!is_mapping()) return Value();
  for (const auto& [k, v] : *dict_) {
    if (k == key) return v;
  }
  return Value();
}

bool Value::Equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (kind_ == Kind::kInt && o.kind_ == Kind::kInt) return i_ == o.i_;
    return as_number() == o.as_number();
  }
  // Python: True == 1; bools compare as ints with numbers.
  if (kind_ == Kind::kBool && o.is_number()) return Int(b_).Equals(o);
  if (o.kind_ == Kind::kBool && is_number()) return Equals(Int(o.b_));
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kBool: return b_ == o.b_;
    case Kind::kString: return *s_ == *o.s_;
    case Kind::kList: {
      if (list_->size() != o.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*o.list_)[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (dict_->size() != o.dict_->size()) return false;
      for (const auto& [k, v] : *dict_) {
        if (!v.Equals(o.Get(k))) return false;
      }
      return true;
    }
    case Kind::kNamespace: return dict_ == o.dict_;
    default: return false;
  }
}

std::string PythonFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest digits that round-trip, then Python's layout: fixed for 1e-4 <= |d| < 1e16.
  char buf[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*e", precision - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s(buf);
  const size_t e = s.find('e');
  const int exp = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (s[i] >= '0' && s[i] <= '9') digits += s[i];
  }
  const std::string sign = d < 0 ? "-" : "";
  if (exp >= 16 || exp < -4) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + ebuf;
  }
  if (exp < 0) return sign + "0." + std::string(-exp - 1, '0') + digits;
  if (static_cast<int>(digits.size()) <= exp + 1) {
    return sign + digits + std::string(exp + 1 - digits.size(), '0') + ".0";
  }
  return sign + digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
}

namespace {

std::string PythonQuote(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == q) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

void JsonString(const std::string& s, std::string* out) {
  *out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

void Json(const Value& v, int indent, int depth, size_t max_bytes, std::string* out) {
  if (out->size() > max_bytes) return;
  const std::string item_sep = indent < 0 ? ", " : ",";
  auto newline = [&](int d) {
    if (indent >= 0) *out += "\n" + std::string(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: *out += "null"; return;
    case Value::Kind::kBool: *out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: *out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: {
      const double d = v.as_number();
      *out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : PythonFloat(d);
      return;
    }
    case Value::Kind::kString: JsonString(v.str(), out); return;
    case Value::Kind::kList: {
      if (v.list().empty()) {
        *out += "[]";
        return;
      }
      *out += '[';
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        Json(v.list()[i], indent, depth + 1, max_bytes, out);
      }
      newline(depth);
      *out += ']';
      return;
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      if (v.dict().empty()) {
        *out += "{}";
        return;
      }
      *out += '{';
      bool first = true;
      for (const auto& [k, e] : v.dict()) {
        if (!first) *out += item_sep;
        first = false;
        newline(depth + 1);
        JsonString(k, out);
        *out += ": ";
        Json(e, indent, depth + 1, max_bytes, out);
      }
      newline(depth);
      *out += '}';
      return;
    }
  }
}

}  // namespace

std::string Value::Repr() const {
  if (kind_ == Kind::kString) return PythonQuote(*s_);
  return ToString();
}

std::string Value::ToString() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return b_ ? "True" : "False";
    case Kind::kInt: return std::to_string(i_);
    case Kind::kFloat: return PythonFloat(d_);
    case Kind::kString: return *s_;
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].Repr();
      return out + "]";
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : *dict_) {
        out += (first ? "" : ", ") + PythonQuote(k) + ": " + v.Repr();
        first = false;
      }
      return out + "}";
    }
  }
  return "";
}

std::string Value::ToJson(int indent) const { return ToJson(indent, SIZE_MAX); }

std::string Value::ToJson(int indent, size_t max_bytes) const {
  std::string out;
  Json(*this, indent, 0, max_bytes, &out);
  return out;
}

int64_t Value::Length() const {
  switch (kind_) {
    case Kind::kString: {
      int64_t n = 0;
      for (unsigned char c : *s_) n += (c & 0xc0) != 0x80;
      return n;
    }
    case Kind::kList: return static_cast<int64_t>(list_->size());
    case Kind::kDict:
    case Kind::kNamespace: return static_cast<int64_t>(dict_->size());
    default: return 0;
  }
}

}  // namespace pdserve::jinja
