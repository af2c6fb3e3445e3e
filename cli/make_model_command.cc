// pdserve make-model DIR: a random model in the Hugging Face layout (test fixture, demo default).
#include <cstdio>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common/base/strings.h"
#include "common/model/random_model.h"

namespace pdserve::cli {

int MakeModelCommand(int argc, char** argv) {
  RandomModelSpec spec;
  std::string dtype = "f32";
  int64_t shards = 1, seed = 0;
  bool tie = false;
  FlagSet flags("make-model DIR",
                "Writes a random model (config.json, safetensors, tokenizer.json) into DIR.");
  flags.String("arch", &spec.arch, "llama, mistral, qwen2 or qwen3");
  flags.Int("layers", &spec.layers, "decoder layers");
  flags.Int("hidden", &spec.hidden, "hidden size");
  flags.Int("heads", &spec.heads, "attention heads");
  flags.Int("kv-heads", &spec.kv_heads, "key/value heads (GQA)");
  flags.Int("head-dim", &spec.head_dim, "head dimension (0: hidden / heads)");
  flags.Int("intermediate", &spec.intermediate, "MLP intermediate size");
  flags.Int("vocab", &spec.vocab, "vocabulary size (>= 258)");
  flags.Int("max-position", &spec.max_position, "max_position_embeddings");
  flags.Int("sliding-window", &spec.sliding_window, "mistral sliding window (0: none)");
  flags.Bool("tie-embeddings", &tie, "tie lm_head to the embeddings");
  flags.String("dtype", &dtype, "weight dtype: f32, bf16 or f16");
  flags.Int("shards", &shards, "number of safetensors shards");
  flags.Int("seed", &seed, "random seed");
  flags.AllowPositional(1);
  int code;
  if (!ParseFlagsOrExit(flags, "make-model", argc, argv, &code)) return code;
  if (flags.positional().size() != 1) {
    return ReportError("make-model", absl::InvalidArgumentError("expected one directory: "
                                                                "pdserve make-model DIR"),
                       kExitUsage);
  }
  auto parsed = ParseDType(dtype);
  if (!parsed.ok()) return ReportError("make-model", parsed.status(), kExitUsage);
  spec.dtype = *parsed;
  spec.shards = static_cast<int>(shards);
  spec.seed = static_cast<uint64_t>(seed);
  spec.tie_embeddings = tie;
  const std::string& dir = flags.positional()[0];
  if (absl::Status s = WriteRandomModel(spec, dir); !s.ok()) {
    return ReportError("make-model", s,
                       s.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitError);
  }
  std::printf("wrote a random %s model (%s, %d shard%s) to %s\n", spec.arch.c_str(),
              dtype.c_str(), spec.shards, spec.shards == 1 ? "" : "s", dir.c_str());
  return kExitOk;
}

}  // namespace pdserve::cli
