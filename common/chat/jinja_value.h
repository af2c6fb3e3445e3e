// Values of the Jinja subset that chat templates use (common/chat/jinja.h), with Python's
// semantics where templates can see them: str() of each kind, truthiness, equality, and
// json.dumps for `tojson` (Hugging Face's: no ASCII escaping, default separators).
#ifndef PDSERVE_COMMON_CHAT_JINJA_VALUE_H_
#define PDSERVE_COMMON_CHAT_JINJA_VALUE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace pdserve::jinja {

class Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // Insertion order, as Python's dict.

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace };

  Value() = default;  // Undefined.
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value MakeList(List items);
  static Value MakeDict(Dict items);
  static Value MakeNamespace(Dict items);  // Shared and mutable: `set ns.x = ...` writes through.
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }
  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_number() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : d_; }
  const std::string& str() const { return *s_; }
  const List& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }
  Dict& mutable_dict() { return *dict_; }
  // Nesting: 0 for a scalar, 1 + the deepest element's for a list, dict or namespace (as made:
  // a namespace's later attributes do not update the containers that already hold it).
  int depth() const { return depth_; }
  // Whether this is a namespace or holds one (namespaces are the only mutable values, so only
  // through them can a value come to contain itself).
  bool holds_namespace() const { return holds_namespace_; }
  // What the value costs, in bytes, saturating: a string's length; a scalar's kScalarWeight; a
  // container's elements' weights plus kElementWeight each (its memory, and more than any element
  // prints besides its own text). The renderer bounds it, so that no value a template makes can
  // grow past memory. Cached when made; namespaces and the values holding them are weighed now
  // (their attributes change), which walks them.
  static constexpr uint64_t kScalarWeight = 8, kElementWeight = 40;
  uint64_t Weight() const;

  // Python truthiness (undefined is false).
  bool Truthy() const;
  // dict/namespace key lookup; undefined when missing.
  Value Get(const std::string& key) const;
  // Python ==.
  bool Equals(const Value& other) const;
  // Python str(); undefined prints as "".
  std::string ToString() const;
  // Python repr() (strings quoted), used inside lists and dicts.
  std::string Repr() const;
  // json.dumps(value, ensure_ascii=False, indent=indent) (indent < 0: none).
  std::string ToJson(int indent = -1) const;
  // The same, stopping once the text passes max_bytes (then longer than max_bytes, and cut).
  std::string ToJson(int indent, size_t max_bytes) const;
  // Length of a string (code points), list or dict.
  int64_t Length() const;

 private:
  void SetNesting(const Value& element);

  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool holds_namespace_ = false;
  int depth_ = 0;
  uint64_t weight_ = kScalarWeight;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
};

// Python's repr() of a float (shortest round-trip digits, "1.0", "1e+16", "inf").
std::string PythonFloat(double d);

}  // namespace pdserve::jinja

#endif  // PDSERVE_COMMON_CHAT_JINJA_VALUE_H_
