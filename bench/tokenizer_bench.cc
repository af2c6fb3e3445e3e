// Tokenizer encoding throughput on one core.
//
//   build/bench/tokenizer_bench DIR [DIR ...] [--text FILE] [--mb N]
//
// Without --text the input is generated mixed English: prose sentences from a fixed vocabulary,
// numbers, punctuation, contractions, some code and a little non-ASCII, in lines and paragraphs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/base/file_util.h"
#include "common/base/rng.h"
#include "common/tokenizer/tokenizer.h"

namespace {

std::string MixedEnglish(size_t bytes) {
  static const char* kWords[] = {
      "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
      "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
      "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
      "been", "if", "more", "when", "will", "would", "who", "so", "no", "model", "server",
      "request", "latency", "throughput", "prefill", "decode", "cache", "memory", "bandwidth",
      "scheduler", "tokens", "sequence", "worker", "cluster", "Kubernetes", "Prometheus",
      "performance", "architecture", "implementation", "understanding", "international"};
  static const char* kExtras[] = {"don't", "it's", "we've", "I'm", "they're", "2026", "3.14",
                                  "1,024", "(see below)", "e.g.", "naïve", "café", "—", "“quoted”"};
  static const char* kCode[] = {"for (int i = 0; i < n; ++i) sum += x[i];",
                                "def f(x): return x * 2", "if err != nil { return err }",
                                "{\"key\": [1, 2, 3]}"};
  pdserve::SplitMix64 rng(42);
  std::string out;
  while (out.size() < bytes) {
    const int sentences = 2 + static_cast<int>(rng.Next() % 5);
    for (int s = 0; s < sentences; ++s) {
      const int words = 5 + static_cast<int>(rng.Next() % 15);
      for (int w = 0; w < words; ++w) {
        std::string word = rng.Next() % 10 == 0 ? kExtras[rng.Next() % std::size(kExtras)]
                                                 : kWords[rng.Next() % std::size(kWords)];
        if (w == 0) word[0] = static_cast<char>(std::toupper(word[0]));
        out += word;
        out += w + 1 == words ? "" : (rng.Next() % 12 == 0 ? ", " : " ");
      }
      out += rng.Next() % 6 == 0 ? "? " : ". ";
    }
    out += "\n";
    if (rng.Next() % 5 == 0) {
      out += "    ";
      out += kCode[rng.Next() % std::size(kCode)];
      out += "\n";
    }
    if (rng.Next() % 3 == 0) out += "\n";
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> dirs;
  std::string text_file;
  double mb = 4;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--text") == 0 && i + 1 < argc) {
      text_file = argv[++i];
    } else if (std::strcmp(argv[i], "--mb") == 0 && i + 1 < argc) {
      mb = std::atof(argv[++i]);
    } else {
      dirs.push_back(argv[i]);
    }
  }
  if (dirs.empty()) {
    std::fprintf(stderr, "usage: tokenizer_bench DIR [DIR ...] [--text FILE] [--mb N]\n");
    return 2;
  }
  std::string text;
  if (!text_file.empty()) {
    auto t = pdserve::ReadFileToString(text_file);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
      return 1;
    }
    text = *t;
  } else {
    text = MixedEnglish(static_cast<size_t>(mb * (1 << 20)));
  }
  // Encode line by line, as a server encodes prompts (and as the cache would see them).
  std::vector<std::string_view> lines;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    lines.emplace_back(text.data() + pos, nl + 1 - pos > text.size() - pos ? text.size() - pos : nl + 1 - pos);
    pos = nl + 1;
  }
  for (const std::string& dir : dirs) {
    auto tok = pdserve::Tokenizer::Load(dir);
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s\n", dir.c_str(), std::string(tok.status().message()).c_str());
      return 1;
    }
    // Best of three passes: the machines are shared.
    size_t tokens = 0;
    double secs = 1e30;
    for (int pass = 0; pass < 3; ++pass) {
      tokens = 0;
      const auto start = std::chrono::steady_clock::now();
      for (std::string_view line : lines) tokens += (*tok)->Encode(line, false)->size();
      secs = std::min(secs, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::printf("%-60s %7.2f MB/s  %9.0f tokens/s  (%zu bytes, %zu tokens, %.2f s, 1 thread)\n",
                dir.c_str(), text.size() / secs / 1e6, tokens / secs, text.size(), tokens, secs);
  }
  return 0;
}
