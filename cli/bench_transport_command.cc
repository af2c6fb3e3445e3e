// pdserve bench-transport: KV page transfer bandwidth through a real KvTransport (a sender and a
// receiver transport in this process, talking over loopback for tcp), judged in the same run
// against a plain loopback TCP stream and memcpy. Every run checks that the bytes landed: the
// receiver's checksum equals the sender's and the destination pool equals the source.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "bench/link_limits.h"
#include "cli/cli_util.h"
#include "cli/kv_transfer_timing.h"
#include "cli/commands.h"
#include "common/base/strings.h"
#include "common/transport/kv_transport.h"
#include "nlohmann/json.hpp"

namespace pdserve::cli {

int BenchTransportCommand(int argc, char** argv) {
  const char* cmd = "bench-transport";
  std::string transport = "tcp", format = "text";
  int64_t bytes = 256 << 20, page_bytes = 24576, pages_per_submit = 64, repeats = 3;
  int64_t socket_chunk = 1 << 20;
  FlagSet flags("bench-transport",
                "KV page transfer bandwidth against a plain loopback TCP stream and memcpy, "
                "measured in the same run.");
  flags.String("transport", &transport,
               "tcp, ucx or local (ucx: UCX_TLS picks UCX's transports, e.g. sm or tcp)");
  flags.Int("bytes", &bytes, "bytes of KV pages per transfer");
  flags.Int("page-bytes", &page_bytes,
            "bytes per page (24576: one layer's K and V of a 16-token block of the SmolLM-shaped "
            "model, f32)");
  flags.Int("pages-per-submit", &pages_per_submit, "pages handed to the transport per Submit");
  flags.Int("socket-chunk", &socket_chunk, "write size of the plain loopback stream");
  flags.Int("repeats", &repeats, "timed transfers; the best is reported");
  flags.String("format", &format, "text or json");
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  auto usage = [&](const std::string& m) {
    return ReportError(cmd, absl::InvalidArgumentError(m), kExitUsage);
  };
  if (transport != "tcp" && transport != "local" && transport != "ucx") {
    return usage("--transport: must be tcp, ucx or local");
  }
  if (format != "text" && format != "json") return usage("--format: must be text or json");
  if (page_bytes < 64 || page_bytes > (64 << 20)) return usage("--page-bytes: must be in [64, 64 MiB]");
  if (bytes < page_bytes || bytes > (int64_t{4} << 30)) {  // Two pools of this size are allocated.
    return usage("--bytes: must be at least --page-bytes and at most 4 GiB");
  }
  if (pages_per_submit < 1) return usage("--pages-per-submit: must be >= 1");
  if (socket_chunk < 4096) return usage("--socket-chunk: must be >= 4096");
  if (repeats < 1) return usage("--repeats: must be >= 1");

  const size_t n = static_cast<size_t>(bytes / page_bytes * page_bytes);
  std::vector<uint8_t> src(n), dst(n, 0);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  KvTransportOptions o;
  o.layout = "bench=1";
  auto sender = CreateKvTransport(transport, o);
  if (!sender.ok()) return ReportError(cmd, sender.status());
  auto receiver = CreateKvTransport(transport, o);
  if (!receiver.ok()) return ReportError(cmd, receiver.status());
  if (absl::Status s = (*sender)->RegisterPool(src.data(), n); !s.ok()) return ReportError(cmd, s);
  if (absl::Status s = (*receiver)->RegisterPool(dst.data(), n); !s.ok()) return ReportError(cmd, s);

  // Interleave the three measurements so they see the same machine.
  double kv = 0, stream = 0, copy = 0;
  int64_t pages = 0;
  for (int64_t r = 0; r < repeats; ++r) {
    auto run = TimeKvTransfer(**sender, **receiver, static_cast<uint64_t>(r + 1), n,
                              static_cast<size_t>(page_bytes), static_cast<size_t>(pages_per_submit));
    if (!run.ok()) return ReportError(cmd, run.status());
    if (r == 0 && std::memcmp(src.data(), dst.data(), n) != 0) {
      return ReportError(cmd, absl::DataLossError("the destination pool differs from the source"));
    }
    kv = std::max(kv, static_cast<double>(run->bytes) / run->seconds);
    pages = run->pages;
    auto bw = bench::LoopbackStreamBandwidth(n, static_cast<size_t>(socket_chunk), 1);
    if (!bw.ok()) return ReportError(cmd, bw.status());
    stream = std::max(stream, *bw);
    copy = std::max(copy, bench::MemcpyBandwidth(n, 1));
  }
  const double gb = 1e9;
  if (format == "json") {
    nlohmann::json j = {{"transport", transport},
                        {"transport_detail", (*receiver)->description()},
                        {"bytes", n},
                        {"page_bytes", page_bytes},
                        {"pages", pages},
                        {"kv_gb_s", kv / gb},
                        {"socket_gb_s", stream / gb},
                        {"memcpy_gb_s", copy / gb},
                        {"kv_socket_ratio", kv / stream},
                        {"kv_memcpy_ratio", kv / copy}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("KV transfer (%s): %lld pages of %lld bytes, %.1f MiB: %.2f GB/s\n",
                transport == "ucx" ? (*receiver)->description().c_str() : transport.c_str(),
                static_cast<long long>(pages), static_cast<long long>(page_bytes), n / 1048576.0,
                kv / gb);
    std::printf("plain loopback TCP stream (%lld-byte writes): %.2f GB/s  -> KV/stream %.2f\n",
                static_cast<long long>(socket_chunk), stream / gb, kv / stream);
    std::printf("memcpy: %.2f GB/s  -> KV/memcpy %.2f\n", copy / gb, kv / copy);
  }
  return kExitOk;
}

}  // namespace pdserve::cli
