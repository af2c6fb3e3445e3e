// pdserve tokenize / detokenize: the model's tokenizer without its weights.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common/base/strings.h"
#include "common/model/gguf_tokenizer.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace pdserve::cli {
namespace {

using Json = nlohmann::json;

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// Runs `fn` on every line of `path` parsed as a JSON object; stops at the first error, naming the
// line.
absl::Status ForEachJsonLine(const std::string& path, const std::function<absl::Status(const Json&)>& fn) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(Str(path, ": cannot open"));
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(Str(path, ":", number, ": not a JSON object"));
    }
    if (absl::Status s = fn(j); !s.ok()) {
      return absl::Status(s.code(), Str(path, ":", number, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("--tokenizer PATH is required");
  return LoadModelTokenizer(path);
}

}  // namespace

int TokenizeCommand(int argc, char** argv) {
  const char* cmd = "tokenize";
  std::string path, text, input, format = "text";
  bool add_special = false;
  FlagSet flags("tokenize", "Encodes text with a model's tokenizer.json (no weights needed).");
  flags.String("tokenizer", &path, "tokenizer.json, or a directory holding it");
  flags.String("text", &text, "the text to encode");
  flags.String("input-jsonl", &input, "a file of {\"text\": ...} lines; prints {\"token_ids\": [...]} lines");
  flags.Bool("add-special-tokens", &add_special, "add BOS/EOS as the post-processor says");
  flags.String("format", &format, "text (ids separated by spaces) or json");
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  if (flags.WasSet("text") == !input.empty()) {
    return ReportError(cmd, absl::InvalidArgumentError("give exactly one of --text or --input-jsonl"),
                       kExitUsage);
  }
  auto tok = LoadTokenizer(path);
  if (!tok.ok()) return ReportError(cmd, tok.status());
  if (!input.empty()) {
    absl::Status s = ForEachJsonLine(input, [&](const Json& j) -> absl::Status {
      if (!j.contains("text") || !j["text"].is_string()) {
        return absl::InvalidArgumentError("field 'text' must be a string");
      }
      auto ids = (*tok)->Encode(j["text"].get<std::string>(), add_special);
      if (!ids.ok()) return ids.status();
      std::printf("%s\n", Dump(Json{{"token_ids", *ids}}).c_str());
      return absl::OkStatus();
    });
    return s.ok() ? kExitOk : ReportError(cmd, s);
  }
  auto ids = (*tok)->Encode(text, add_special);
  if (!ids.ok()) return ReportError(cmd, ids.status());
  if (format == "json") {
    std::printf("%s\n", Dump(Json{{"token_ids", *ids}}).c_str());
  } else {
    std::string line;
    for (int32_t id : *ids) StrAppendTo(&line, line.empty() ? "" : " ", id);
    std::printf("%s\n", line.c_str());
  }
  return kExitOk;
}

int DetokenizeCommand(int argc, char** argv) {
  const char* cmd = "detokenize";
  std::string path, ids_text, input, format = "text", clean_up = "auto";
  bool skip_special = false, stream = false;
  FlagSet flags("detokenize", "Decodes token ids with a model's tokenizer.json.");
  flags.String("tokenizer", &path, "tokenizer.json, or a directory holding it");
  flags.String("ids", &ids_text, "token ids, e.g. 1,2,3");
  flags.String("input-jsonl", &input, "a file of {\"token_ids\": [...]} lines; prints {\"text\": ...} lines");
  flags.Bool("skip-special-tokens", &skip_special, "drop special tokens from the text");
  flags.Bool("stream", &stream, "also decode id by id as a server streams (json: \"stream\" pieces)");
  flags.String("clean-up-tokenization-spaces", &clean_up,
               "auto (as tokenizer_config.json says), true or false");
  flags.String("format", &format, "text or json");
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  DecodeOptions options;
  options.skip_special_tokens = skip_special;
  if (clean_up == "true" || clean_up == "false") {
    options.clean_up_tokenization_spaces = clean_up == "true";
  } else if (clean_up != "auto") {
    return ReportError(cmd, absl::InvalidArgumentError(
                                "--clean-up-tokenization-spaces: auto, true or false"), kExitUsage);
  }
  if (flags.WasSet("ids") == !input.empty()) {
    return ReportError(cmd, absl::InvalidArgumentError("give exactly one of --ids or --input-jsonl"),
                       kExitUsage);
  }
  auto tok = LoadTokenizer(path);
  if (!tok.ok()) return ReportError(cmd, tok.status());
  auto decode = [&](const std::vector<int32_t>& ids) -> absl::StatusOr<Json> {
    auto text = (*tok)->Decode(ids, options);
    if (!text.ok()) return text.status();
    Json out{{"text", *text}};
    if (stream) {
      IncrementalDetokenizer d(tok->get(), skip_special);
      Json pieces = Json::array();
      for (int32_t id : ids) {
        auto delta = d.Next(id);
        if (!delta.ok()) return delta.status();
        if (!delta->empty()) pieces.push_back(*delta);
      }
      if (std::string rest = d.Finish(); !rest.empty()) pieces.push_back(rest);
      out["stream"] = pieces;
    }
    return out;
  };
  if (!input.empty()) {
    absl::Status s = ForEachJsonLine(input, [&](const Json& j) -> absl::Status {
      if (!j.contains("token_ids") || !j["token_ids"].is_array()) {
        return absl::InvalidArgumentError("field 'token_ids' must be a list of integers");
      }
      std::vector<int32_t> ids;
      for (const Json& v : j["token_ids"]) {
        if (!v.is_number_integer()) {
          return absl::InvalidArgumentError("field 'token_ids' must be a list of integers");
        }
        ids.push_back(v.get<int32_t>());
      }
      auto out = decode(ids);
      if (!out.ok()) return out.status();
      std::printf("%s\n", Dump(*out).c_str());
      return absl::OkStatus();
    });
    return s.ok() ? kExitOk : ReportError(cmd, s);
  }
  std::vector<int32_t> ids;
  if (absl::Status s = ParseIntList(ids_text, "--ids", &ids); !s.ok()) {
    return ReportError(cmd, s, kExitUsage);
  }
  auto out = decode(ids);
  if (!out.ok()) return ReportError(cmd, out.status());
  if (format == "json") {
    std::printf("%s\n", Dump(*out).c_str());
  } else {
    std::printf("%s\n", (*out)["text"].get<std::string>().c_str());
  }
  return kExitOk;
}

}  // namespace pdserve::cli
