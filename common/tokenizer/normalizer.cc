#include "common/tokenizer/normalizer.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <vector>

#include "absl/strings/str_replace.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"
#include "re2/re2.h"

namespace pdserve {
namespace {

using Json = nlohmann::json;

class UnicodeForm : public Normalizer {
 public:
  explicit UnicodeForm(const icu::Normalizer2* n) : n_(n) {}
  std::string Normalize(std::string_view text) const override {
    UErrorCode status = U_ZERO_ERROR;
    const icu::UnicodeString in = icu::UnicodeString::fromUTF8(
        icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
    // Most text is already normalized: skip the copy.
    if (n_->isNormalized(in, status) && U_SUCCESS(status)) return std::string(text);
    status = U_ZERO_ERROR;
    const icu::UnicodeString out = n_->normalize(in, status);
    std::string result;
    if (U_FAILURE(status)) return std::string(text);
    out.toUTF8String(result);
    return result;
  }

 private:
  const icu::Normalizer2* n_;  // Owned by ICU (a process-wide singleton).
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string Normalize(std::string_view text) const override {
    if (text.empty()) return std::string();
    return Str(prefix_, text);
  }

 private:
  std::string prefix_;
};

class ReplaceString : public Normalizer {
 public:
  ReplaceString(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string Normalize(std::string_view text) const override {
    return absl::StrReplaceAll(AsAbsl(text), {{pattern_, content_}});
  }

 private:
  std::string pattern_;
  std::string content_;
};

class ReplaceRegex : public Normalizer {
 public:
  ReplaceRegex(std::unique_ptr<RE2> re, std::string content)
      : re_(std::move(re)), content_(std::move(content)) {}
  std::string Normalize(std::string_view text) const override {
    std::string out(text);
    RE2::GlobalReplace(&out, *re_, content_);
    return out;
  }

 private:
  std::unique_ptr<RE2> re_;
  std::string content_;
};

class Lowercase : public Normalizer {
 public:
  std::string Normalize(std::string_view text) const override {
    icu::UnicodeString s = icu::UnicodeString::fromUTF8(
        icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
    s.toLower();
    std::string out;
    s.toUTF8String(out);
    return out;
  }
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  std::string Normalize(std::string_view text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t p = begin;
        if (!IsUnicodeWhitespace(NextCodePoint(text, &p))) break;
        begin = p;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<uint8_t>(text[start]) & 0xc0) == 0x80) --start;
        size_t p = start;
        if (!IsUnicodeWhitespace(NextCodePoint(text, &p))) break;
        end = start;
      }
    }
    return std::string(text.substr(begin, end - begin));
  }

 private:
  bool left_, right_;
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  std::string Normalize(std::string_view text) const override {
    std::string s(text);
    for (const auto& step : steps_) s = step->Normalize(s);
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

absl::StatusOr<const icu::Normalizer2*> IcuForm(const std::string& type) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  if (type == "NFC") n = icu::Normalizer2::getNFCInstance(status);
  if (type == "NFD") n = icu::Normalizer2::getNFDInstance(status);
  if (type == "NFKC") n = icu::Normalizer2::getNFKCInstance(status);
  if (type == "NFKD") n = icu::Normalizer2::getNFKDInstance(status);
  if (n == nullptr || U_FAILURE(status)) {
    return absl::InternalError(Str("ICU cannot provide the ", type, " normalizer"));
  }
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> Normalizer::Parse(const Json& j) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  const std::string type = j.is_object() ? j.value("type", std::string()) : std::string();
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    PD_ASSIGN_OR_RETURN(const icu::Normalizer2* n, IcuForm(type));
    return std::unique_ptr<Normalizer>(new UnicodeForm(n));
  }
  if (type == "Prepend") {
    return std::unique_ptr<Normalizer>(new Prepend(j.value("prepend", std::string())));
  }
  if (type == "Replace") {
    const Json& pattern = j.value("pattern", Json::object());
    const std::string content = j.value("content", std::string());
    if (pattern.contains("String") && pattern["String"].is_string()) {
      const std::string s = pattern["String"].get<std::string>();
      if (s.empty()) return absl::InvalidArgumentError("Replace normalizer with an empty pattern");
      return std::unique_ptr<Normalizer>(new ReplaceString(s, content));
    }
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      RE2::Options options;
      options.set_log_errors(false);
      auto re = std::make_unique<RE2>(pattern["Regex"].get<std::string>(), options);
      if (!re->ok()) {
        return absl::InvalidArgumentError(Str("Replace normalizer regex: ", re->error()));
      }
      // RE2 rewrite strings treat backslashes specially; escape the literal content.
      std::string escaped;
      for (char c : content) {
        if (c == '\\') escaped += '\\';
        escaped += c;
      }
      return std::unique_ptr<Normalizer>(new ReplaceRegex(std::move(re), escaped));
    }
    return absl::InvalidArgumentError("Replace normalizer without a pattern");
  }
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new Lowercase());
  if (type == "Strip") {
    return std::unique_ptr<Normalizer>(
        new Strip(j.value("strip_left", true), j.value("strip_right", true)));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const Json& sub : j.value("normalizers", Json::array())) {
      PD_ASSIGN_OR_RETURN(std::unique_ptr<Normalizer> n, Parse(sub));
      if (n) steps.push_back(std::move(n));
    }
    return std::unique_ptr<Normalizer>(new Sequence(std::move(steps)));
  }
  return absl::UnimplementedError(Str("unsupported tokenizer component: normalizer '", type,
                                      "' (supported: NFC, NFD, NFKC, NFKD, Prepend, Replace, "
                                      "Lowercase, Strip, Sequence)"));
}

}  // namespace pdserve
