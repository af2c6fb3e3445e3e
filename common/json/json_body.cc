#include "common/json/json_body.h"

#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pdserve {
namespace {

using Json = nlohmann::ordered_json;
using ObjectVector = Json::object_t::Container;  // ordered_map is a vector of pairs.

// Builds the document from SAX events. Every value is made once and moved into its parent once;
// an open object finds a repeated key through its index, so the work is linear in the body.
class Builder {
 public:
  Builder(int max_depth, const std::function<bool(std::string_view)>& keep)
      : max_depth_(max_depth), keep_(keep) {}

  bool null() { return Value(Json(nullptr)); }
  bool boolean(bool v) { return Value(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return Value(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return Value(Json(v)); }
  bool number_float(Json::number_float_t v, const Json::string_t&) { return Value(Json(v)); }
  bool string(Json::string_t& v) { return Value(Json(std::move(v))); }
  bool binary(Json::binary_t&) { return Value(Json(nullptr)); }  // Not produced by JSON text.

  bool start_object(std::size_t) { return Open(Json::object()); }
  bool start_array(std::size_t) { return Open(Json::array()); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(Json::string_t& k) {
    Frame& f = stack_.back();
    if (f.skipped > 0) return true;  // A key inside a skipped member.
    // The root object's members the caller does not want are skipped: nothing below is built.
    if (stack_.size() == 1 && keep_ && !keep_(k)) {
      f.skip_next = true;
      return true;
    }
    f.key = std::move(k);
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) {
    if (message_.empty()) message_ = "not valid JSON at byte " + std::to_string(position);
    return false;
  }

  bool too_deep() const { return too_deep_; }
  const std::string& message() const { return message_; }
  Json& root() { return root_; }

 private:
  struct Frame {
    Json value;
    std::string key;               // Objects: the member whose value comes next.
    bool skip_next = false;        // That member is not built.
    int skipped = 0;               // Inside a skipped member: how many containers deep.
    std::unordered_map<std::string, size_t> index;  // Objects: key -> position.
  };

  // Inside a skipped member of the root, values are dropped (containers only counted).
  bool Skipping() const {
    return !stack_.empty() && (stack_.back().skipped > 0 || stack_.back().skip_next);
  }

  bool Open(Json container) {
    if (++depth_ > max_depth_) {
      too_deep_ = true;
      return false;
    }
    if (Skipping()) {
      Frame& f = stack_.back();
      if (f.skipped == 0) f.skip_next = false;
      ++f.skipped;
      return true;
    }
    Frame f;
    f.value = std::move(container);
    stack_.push_back(std::move(f));
    return true;
  }

  bool Close() {
    --depth_;
    if (!stack_.empty() && stack_.back().skipped > 0) {
      --stack_.back().skipped;
      return true;
    }
    Json done = std::move(stack_.back().value);
    stack_.pop_back();
    return Value(std::move(done));
  }

  bool Value(Json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return true;
    }
    Frame& f = stack_.back();
    if (f.skipped > 0) return true;
    if (f.skip_next) {
      f.skip_next = false;
      return true;
    }
    if (f.value.is_array()) {
      f.value.get_ref<Json::array_t&>().push_back(std::move(v));
      return true;
    }
    auto& members = static_cast<ObjectVector&>(f.value.get_ref<Json::object_t&>());
    auto [it, inserted] = f.index.try_emplace(f.key, members.size());
    if (inserted) {
      members.emplace_back(std::move(f.key), std::move(v));
    } else {
      members[it->second].second = std::move(v);  // nlohmann's rule: the last value wins.
    }
    f.key.clear();
    return true;
  }

  const int max_depth_;
  const std::function<bool(std::string_view)>& keep_;
  std::vector<Frame> stack_;
  int depth_ = 0;
  bool too_deep_ = false;
  std::string message_;
  Json root_;
};

}  // namespace

bool ParseJsonBody(std::string_view body, int max_depth,
                   const std::function<bool(std::string_view key)>& keep, Json* out,
                   JsonBodyError* error) {
  Builder b(max_depth, keep);
  const bool ok = Json::sax_parse(body.begin(), body.end(), &b, nlohmann::json::input_format_t::json,
                                  /*strict=*/true);
  if (!ok) {
    error->too_deep = b.too_deep();
    error->message = b.too_deep() ? "nests deeper than " + std::to_string(max_depth) + " levels"
                                  : (b.message().empty() ? "not valid JSON" : b.message());
    return false;
  }
  *out = std::move(b.root());
  return true;
}

}  // namespace pdserve
