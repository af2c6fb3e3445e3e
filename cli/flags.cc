#include "cli/flags.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "absl/strings/numbers.h"
#include "common/base/strings.h"

namespace pdserve::cli {

FlagSet::FlagSet(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void FlagSet::String(const char* name, std::string* value, const char* help) {
  flags_.push_back({name, Kind::kString, value, help, *value});
}
void FlagSet::Int(const char* name, int64_t* value, const char* help) {
  flags_.push_back({name, Kind::kInt, value, help, std::to_string(*value)});
}
void FlagSet::Double(const char* name, double* value, const char* help) {
  std::ostringstream s;
  s << *value;
  flags_.push_back({name, Kind::kDouble, value, help, s.str()});
}
void FlagSet::Bool(const char* name, bool* value, const char* help) {
  flags_.push_back({name, Kind::kBool, value, help, *value ? "true" : "false"});
}

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool FlagSet::WasSet(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.set;
  }
  return false;
}

absl::Status FlagSet::Assign(Flag& flag, const std::string& text, const char* source) {
  auto bad = [&](const char* expected) {
    return absl::InvalidArgumentError(
        Str(source, " --", flag.name, ": expected ", expected, ", got '", text, "'"));
  };
  switch (flag.kind) {
    case Kind::kString:
      *static_cast<std::string*>(flag.value) = text;
      break;
    case Kind::kInt: {
      int64_t v;
      if (!absl::SimpleAtoi(text, &v)) return bad("an integer");
      *static_cast<int64_t*>(flag.value) = v;
      break;
    }
    case Kind::kDouble: {
      double v;
      if (!absl::SimpleAtod(text, &v)) return bad("a number");
      *static_cast<double*>(flag.value) = v;
      break;
    }
    case Kind::kBool:
      if (text == "true" || text == "1") {
        *static_cast<bool*>(flag.value) = true;
      } else if (text == "false" || text == "0") {
        *static_cast<bool*>(flag.value) = false;
      } else {
        return bad("true, false, 1 or 0");
      }
      break;
  }
  flag.set = true;
  return absl::OkStatus();
}

absl::Status FlagSet::Parse(int argc, char** argv) {
  // Environment first; the command line overrides.
  for (Flag& f : flags_) {
    std::string env = "PDSERVE_" + f.name;
    for (char& c : env) c = c == '-' ? '_' : static_cast<char>(std::toupper(c));
    if (const char* v = std::getenv(env.c_str()); v != nullptr && *v != '\0') {
      if (absl::Status s = Assign(f, v, env.c_str()); !s.ok()) return s;
    }
  }
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      if (static_cast<int>(positional_.size()) >= max_positional_) {
        return absl::InvalidArgumentError(
            Str("unexpected argument '", arg, "' (see pdserve ", command_, " --help)"));
      }
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    Flag* f = Find(name);
    if (f == nullptr && name.rfind("no-", 0) == 0) {
      Flag* b = Find(name.substr(3));
      if (b != nullptr && b->kind == Kind::kBool && !value) {
        *static_cast<bool*>(b->value) = false;
        b->set = true;
        continue;
      }
    }
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          Str("unknown flag --", name, " (see pdserve ", command_, " --help)"));
    }
    if (!value) {
      if (f->kind == Kind::kBool) {
        // `--flag false` as well as `--flag` and `--flag=false`; a following word that is not a
        // boolean is an argument of its own (and refused when the command takes none).
        const std::string next = i + 1 < argc ? argv[i + 1] : "";
        if (next == "true" || next == "false" || next == "1" || next == "0") {
          value = next;
          ++i;
        } else {
          value = "true";
        }
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(Str("flag --", name, " needs a value"));
      }
    }
    if (absl::Status s = Assign(*f, *value, "flag"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string FlagSet::Usage() const {
  std::string out = Str("usage: pdserve ", command_, " [flags]\n", summary_, "\n\nflags:\n");
  for (const Flag& f : flags_) {
    std::string env = "PDSERVE_" + f.name;
    for (char& c : env) c = c == '-' ? '_' : static_cast<char>(std::toupper(c));
    StrAppendTo(&out, "  --", f.name, "  ", f.help);
    if (!f.default_text.empty()) StrAppendTo(&out, " (default ", f.default_text, ")");
    StrAppendTo(&out, "  [$", env, "]\n");
  }
  return out;
}

absl::Status ParseIntList(const std::string& text, const char* what, std::vector<int32_t>* out) {
  out->clear();
  if (text.empty()) return absl::OkStatus();
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int32_t v;
    if (!absl::SimpleAtoi(item, &v)) {
      return absl::InvalidArgumentError(
          Str(what, ": '", item, "' is not an integer (expected a list like 1,2,3)"));
    }
    out->push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return absl::OkStatus();
}

}  // namespace pdserve::cli
