// pdserve: one binary, one subcommand per job (like `vllm serve`). Flags are parsed in cli/ only.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/synchronization/mutex.h"
#include "cli/commands.h"

extern "C" char* openblas_get_corename();

namespace {

constexpr char kUsage[] =
    "usage: pdserve <command> [flags]\n"
    "\n"
    "commands:\n"
    "  serve         router, prefill and decode in one process (the embedded default)\n"
    "  router        the public gRPC endpoint over prefill and decode workers\n"
    "  prefill       a prefill worker\n"
    "  decode        a decode worker\n"
    "  generate      generate a completion for one prompt on the local CPU engine\n"
    "  make-model    write a random model in the Hugging Face layout\n"
    "  train-tokenizer train a byte-level BPE tokenizer on a text file\n"
    "  tokenize      encode text with a model's tokenizer.json\n"
    "  detokenize    decode token ids (optionally as a stream)\n"
    "  chat-template render conversations with a model's chat template\n"
    "  kv-calc       KV cache memory math for a config.json\n"
    "  gguf          inspect, dequantize or quantize (q8_0) a GGUF file\n"
    "  bench         serving benchmark against a router: TTFT/TPOT/ITL/E2E, throughput, goodput\n"
    "  bench-engine  engine throughput against this machine's bandwidth and sgemm rate\n"
    "  profile       step costs and KV transfer of this machine, fitted for the capacity planner\n"
    "  simulate      a prefill/decode deployment on a virtual clock, with a profile's step costs\n"
    "  plan          the prefill/decode split with the most goodput for latency targets (simulated)\n"
    "  bench-transport KV page transfer bandwidth against a loopback TCP stream and memcpy\n"
    "\n"
    "`pdserve <command> --help` lists a command's flags.\n";

// Debian 12's OpenBLAS 0.3.21 does not know CPUs newer than it (Sapphire Rapids, Zen 4) and falls
// back to its generic "Prescott" kernels, 3-4x slower. The core type is read when the library
// loads, so the only fix from inside is to set it and start again.
void FixOpenBlasCoreType(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  if (std::strcmp(openblas_get_corename(), "Prescott") != 0) return;
  const char* core = nullptr;
  if (__builtin_cpu_supports("avx512f")) {
    core = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2")) {
    core = "Haswell";
  }
  if (core == nullptr) return;
  setenv("OPENBLAS_CORETYPE", core, 1);
  execv("/proc/self/exe", argv);  // Returns only on failure: then carry on as we are.
}

}  // namespace

int main(int argc, char** argv) {
  FixOpenBlasCoreType(argv);
  // Debian 12's Abseil is built without NDEBUG, so every absl::Mutex lock (gRPC's, a few a
  // message) also takes one process-wide lock to keep a graph for deadlock detection: ~3% of a
  // router's CPU. Debug bookkeeping with no place in a server.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  pdserve::cli::InstallStopSignalHandler();
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::printf("pdserve %s\n", PDSERVE_VERSION);
    return 0;
  }
  const std::string command = argv[1];
  int sub_argc = argc - 2;
  char** sub_argv = argv + 2;
  using namespace pdserve::cli;
  // The tiers drain on a stop signal (their own watchers); every other command just stops.
  if (command != "serve" && command != "router" && command != "prefill" && command != "decode") {
    StartExitOnStopSignal(argv[1]);
  }
  if (command == "generate") return GenerateCommand(sub_argc, sub_argv);
  if (command == "serve") return ServeCommand(sub_argc, sub_argv);
  if (command == "router") return RouterCommand(sub_argc, sub_argv);
  if (command == "prefill") return PrefillCommand(sub_argc, sub_argv);
  if (command == "decode") return DecodeCommand(sub_argc, sub_argv);
  if (command == "make-model") return MakeModelCommand(sub_argc, sub_argv);
  if (command == "train-tokenizer") return TrainTokenizerCommand(sub_argc, sub_argv);
  if (command == "kv-calc") return KvCalcCommand(sub_argc, sub_argv);
  if (command == "gguf") return GgufCommand(sub_argc, sub_argv);
  if (command == "tokenize") return TokenizeCommand(sub_argc, sub_argv);
  if (command == "detokenize") return DetokenizeCommand(sub_argc, sub_argv);
  if (command == "chat-template") return ChatTemplateCommand(sub_argc, sub_argv);
  if (command == "bench-engine") return BenchEngineCommand(sub_argc, sub_argv);
  if (command == "profile") return ProfileCommand(sub_argc, sub_argv);
  if (command == "simulate") return SimulateCommand(sub_argc, sub_argv);
  if (command == "plan") return PlanCommand(sub_argc, sub_argv);
  if (command == "bench-transport") return BenchTransportCommand(sub_argc, sub_argv);
  if (command == "bench") return BenchCommand(sub_argc, sub_argv);
  std::fprintf(stderr, "pdserve: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
