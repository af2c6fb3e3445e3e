#include "common/tokenizer/decoder.h"

#include "absl/strings/str_replace.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

using Json = nlohmann::json;

// Every token's characters back to bytes (a token with a character outside the byte map is kept
// as its own UTF-8), all fused, invalid UTF-8 replaced by U+FFFD.
class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& t : *tokens) {
      std::string b;
      bool mapped = true;
      size_t pos = 0;
      while (pos < t.size()) {
        auto byte = CodePointToByte(NextCodePoint(t, &pos));
        if (!byte) {
          mapped = false;
          break;
        }
        b.push_back(static_cast<char>(*byte));
      }
      bytes += mapped ? b : t;
    }
    tokens->assign(1, Utf8Lossy(bytes));
  }
  void MidSequence(std::string* t, bool*) const override {
    std::string b;
    size_t pos = 0;
    while (pos < t->size()) {
      auto byte = CodePointToByte(NextCodePoint(*t, &pos));
      if (!byte) return;  // Kept as its own UTF-8, as DecodeChain does.
      b.push_back(static_cast<char>(*byte));
    }
    *t = std::move(b);
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& t = (*tokens)[i];
      t = absl::StrReplaceAll(t, {{replacement_, " "}});
      if (i == 0 && strip_first_ && !t.empty() && t[0] == ' ') t.erase(0, 1);
    }
  }
  void MidSequence(std::string* t, bool*) const override { *t = absl::StrReplaceAll(*t, {{replacement_, " "}}); }

 private:
  std::string replacement_;
  bool strip_first_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& t : *tokens) t = absl::StrReplaceAll(t, {{pattern_, content_}});
  }
  void MidSequence(std::string* t, bool*) const override { *t = absl::StrReplaceAll(*t, {{pattern_, content_}}); }

 private:
  std::string pattern_;
  std::string content_;
};

// Runs of <0xNN> tokens become the bytes they name; a run that is not valid UTF-8 becomes one
// U+FFFD per byte (as Hugging Face tokenizers does).
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    size_t pending_count = 0;
    auto flush = [&] {
      if (pending_count == 0) return;
      if (IsValidUtf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending_count; ++i) out.push_back("\xEF\xBF\xBD");
      }
      pending.clear();
      pending_count = 0;
    };
    for (std::string& t : *tokens) {
      int byte = ParseByteToken(t);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
        ++pending_count;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens->swap(out);
  }
  void MidSequence(std::string* t, bool*) const override {
    const int byte = ParseByteToken(*t);
    if (byte >= 0) *t = std::string(1, static_cast<char>(byte));
  }

 private:
  static int ParseByteToken(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; ++i) {
      const char c = t[i];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= c - '0';
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else {
        return -1;
      }
    }
    return v;
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string joined;
    for (const std::string& t : *tokens) joined += t;
    tokens->assign(1, std::move(joined));
  }
  void MidSequence(std::string*, bool* fused) const override { *fused = true; }
};

// Removes up to `start` leading and `stop` trailing copies of a character from each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, int start, int stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& t : *tokens) {
      size_t begin = 0, end = t.size();
      for (int i = 0; i < start_ && t.compare(begin, content_.size(), content_) == 0 &&
                      begin + content_.size() <= end;
           ++i) {
        begin += content_.size();
      }
      for (int i = 0; i < stop_ && end >= begin + content_.size() &&
                      t.compare(end - content_.size(), content_.size(), content_) == 0;
           ++i) {
        end -= content_.size();
      }
      t = t.substr(begin, end - begin);
    }
  }
  void MidSequence(std::string* t, bool* fused) const override {
    if (*fused) return;  // After Fuse it strips the text's ends only.
    std::vector<std::string> one = {std::move(*t)};
    DecodeChain(&one);
    *t = std::move(one[0]);
  }

 private:
  std::string content_;
  int start_, stop_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& s : steps_) s->DecodeChain(tokens);
  }
  void MidSequence(std::string* t, bool* fused) const override {
    for (const auto& s : steps_) s->MidSequence(t, fused);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::Parse(const Json& j) {
  if (j.is_null()) return std::unique_ptr<Decoder>();
  const std::string type = j.is_object() ? j.value("type", std::string()) : std::string();
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "Metaspace") {
    bool strip_first = j.value("add_prefix_space", true);
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      strip_first = j["prepend_scheme"].get<std::string>() != "never";
    }
    return std::unique_ptr<Decoder>(
        new MetaspaceDecoder(j.value("replacement", std::string("\xE2\x96\x81")), strip_first));
  }
  if (type == "Replace") {
    const Json& pattern = j.value("pattern", Json::object());
    if (!pattern.contains("String") || !pattern["String"].is_string() ||
        pattern["String"].get<std::string>().empty()) {
      return absl::UnimplementedError("unsupported tokenizer component: Replace decoder needs a "
                                      "non-empty String pattern");
    }
    return std::unique_ptr<Decoder>(
        new ReplaceDecoder(pattern["String"].get<std::string>(), j.value("content", std::string())));
  }
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Strip") {
    return std::unique_ptr<Decoder>(new StripDecoder(j.value("content", std::string(" ")),
                                                     j.value("start", 0), j.value("stop", 0)));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const Json& sub : j.value("decoders", Json::array())) {
      PD_ASSIGN_OR_RETURN(std::unique_ptr<Decoder> d, Parse(sub));
      if (d) steps.push_back(std::move(d));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(steps)));
  }
  return absl::UnimplementedError(Str("unsupported tokenizer component: decoder '", type,
                                      "' (supported: ByteLevel, Metaspace, Replace, "
                                      "ByteFallback, Fuse, Strip, Sequence)"));
}

}  // namespace pdserve
