#include "cli/kv_transfer_timing.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/base/strings.h"

namespace pdserve::cli {

using Clock = std::chrono::steady_clock;

absl::StatusOr<KvTransferRun> TimeKvTransfer(KvTransport& sender, KvTransport& receiver,
                                             uint64_t tag, size_t bytes, size_t page_bytes,
                                             size_t pages_per_submit) {
  const size_t n_pages = bytes / page_bytes;
  std::vector<PageCopy> pages(n_pages);
  for (size_t i = 0; i < n_pages; ++i) pages[i] = {i * page_bytes, i * page_bytes, page_bytes};
  const auto start = Clock::now();
  if (absl::Status s = receiver.Expect(tag, {{0, n_pages * page_bytes}}); !s.ok()) return s;
  for (size_t i = 0; i < n_pages; i += pages_per_submit) {
    const size_t n = std::min(pages_per_submit, n_pages - i);
    if (absl::Status s = sender.Submit(receiver.endpoint(), tag, {pages.data() + i, n}); !s.ok()) {
      return s;
    }
  }
  std::atomic<bool> finished{false};
  absl::StatusOr<TransferStats> sent = absl::UnknownError("unfinished");
  sender.Finish(receiver.endpoint(), tag, [&](absl::StatusOr<TransferStats> s) {
    sent = std::move(s);
    finished = true;
  });
  TransferPoll poll;
  for (;;) {
    poll = receiver.Poll(tag);
    if (poll.state != TransferState::kPending) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  receiver.Release(tag);
  while (!finished) std::this_thread::sleep_for(std::chrono::microseconds(100));
  if (poll.state != TransferState::kDone) return poll.status;
  if (!sent.ok()) return sent.status();
  if (poll.stats.bytes != static_cast<int64_t>(n_pages * page_bytes) ||
      poll.stats.checksum != sent->checksum) {
    return absl::DataLossError(Str("transfer ", tag, ": receiver got ", poll.stats.bytes,
                                   " bytes with checksum ", poll.stats.checksum, ", sender sent ",
                                   sent->bytes, " with ", sent->checksum));
  }
  return KvTransferRun{secs, poll.stats.bytes, poll.stats.pages};
}


}  // namespace pdserve::cli
