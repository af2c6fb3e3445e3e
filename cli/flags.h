// Command-line flags for one subcommand: `--name value`, `--name=value`, bare `--flag` for
// booleans; positional arguments kept in order. Every flag can also come from the environment as
// PDSERVE_<NAME> (upper case, dashes as underscores), so Kubernetes manifests can set them; the
// command line wins. Flags are declared only here in cli/ (STYLE.md, habit 11).
#ifndef PDSERVE_CLI_FLAGS_H_
#define PDSERVE_CLI_FLAGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pdserve::cli {

class FlagSet {
 public:
  FlagSet(std::string command, std::string summary);

  void String(const char* name, std::string* value, const char* help);
  void Int(const char* name, int64_t* value, const char* help);
  void Double(const char* name, double* value, const char* help);
  void Bool(const char* name, bool* value, const char* help);
  // How many positional arguments the command takes (default none: a stray word is an error).
  void AllowPositional(int max) { max_positional_ = max; }
  // Records whether the flag was given (for "either --a or --b" checks).
  bool WasSet(const std::string& name) const;

  // InvalidArgument naming the flag: unknown flag, missing or malformed value.
  absl::Status Parse(int argc, char** argv);
  const std::vector<std::string>& positional() const { return positional_; }
  std::string Usage() const;
  bool help_requested() const { return help_; }

 private:
  enum class Kind { kString, kInt, kDouble, kBool };
  struct Flag {
    std::string name;
    Kind kind;
    void* value;
    std::string help;
    std::string default_text;
    bool set = false;
  };
  absl::Status Assign(Flag& flag, const std::string& text, const char* source);
  Flag* Find(const std::string& name);

  std::string command_;
  std::string summary_;
  std::vector<Flag> flags_;
  std::vector<std::string> positional_;
  bool help_ = false;
  int max_positional_ = 0;
};

// "1,2,3" -> {1,2,3}; InvalidArgument naming `what` on a bad element.
absl::Status ParseIntList(const std::string& text, const char* what, std::vector<int32_t>* out);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_FLAGS_H_
