#include "common/kvcache/disk_tier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include <xxhash.h>

#include "common/base/strings.h"

namespace pdserve {
namespace {

constexpr char kMagic[8] = {'P', 'D', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr char kSuffix[] = ".kvb";
constexpr char kTempSuffix[] = ".tmp";

struct Header {
  char magic[8];
  uint64_t payload_bytes;
  uint64_t checksum;  // XXH3-64 of the payload.
  uint64_t key[4];    // model.lo, model.hi, block.lo, block.hi.
  uint64_t reserved;
};
static_assert(sizeof(Header) == DiskTier::kHeaderBytes);

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool ParseHex16(std::string_view s, uint64_t* v) {
  if (s.size() != 16) return false;
  *v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    *v = *v << 4 | static_cast<uint64_t>(d);
  }
  return true;
}

std::string KeyName(const KvTierKey& k) {
  return Str(Hex16(k.model.hi), Hex16(k.model.lo), Hex16(k.block.hi), Hex16(k.block.lo));
}

bool ParseKeyName(std::string_view name, KvTierKey* k) {
  return name.size() == 64 && ParseHex16(name.substr(0, 16), &k->model.hi) &&
         ParseHex16(name.substr(16, 16), &k->model.lo) && ParseHex16(name.substr(32, 16), &k->block.hi) &&
         ParseHex16(name.substr(48, 16), &k->block.lo);
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Writes all of `bytes` at `offset`; false on any error (errno set).
bool WriteAll(int fd, const void* bytes, size_t n, off_t offset) {
  const auto* p = static_cast<const uint8_t*>(bytes);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, offset);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
    offset += w;
  }
  return true;
}

// Reads exactly n bytes at `offset`; false on an error or a short file.
bool ReadAll(int fd, void* bytes, size_t n, off_t offset) {
  auto* p = static_cast<uint8_t*>(bytes);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, offset);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    offset += r;
  }
  return true;
}

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options) {
  const std::string& dir = options.path;
  if (dir.empty()) return absl::InvalidArgumentError(Str(options.flag, ": needs a directory"));
  if (options.budget_bytes <= 0) {
    return absl::InvalidArgumentError(Str(options.flag, "-gib: the byte budget must be > 0"));
  }
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InvalidArgumentError(Str(options.flag, ": cannot make '", dir, "': ", std::strerror(errno)));
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(Str(options.flag, ": '", dir, "' is not a directory"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(Str(options.flag, ": '", dir, "' is not writable: ", std::strerror(errno)));
  }
  auto tier = std::unique_ptr<DiskTier>(new DiskTier(options));
  // The index from what is there: each block's file by name and size, oldest use first (mtime,
  // which a load refreshes); a temporary file is a write a killed process left: removed.
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    return absl::InvalidArgumentError(Str(options.flag, ": cannot read '", dir, "': ", std::strerror(errno)));
  }
  struct Found {
    KvTierKey key;
    int64_t bytes;
    int64_t mtime_ns;
  };
  std::vector<Found> found;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const std::string path = Str(dir, "/", name);
    if (EndsWith(name, kTempSuffix)) {
      ::unlink(path.c_str());
      continue;
    }
    KvTierKey key;
    if (!EndsWith(name, kSuffix) || !ParseKeyName(name.substr(0, name.size() - 4), &key)) continue;
    struct stat fs {};
    if (::stat(path.c_str(), &fs) != 0 || !S_ISREG(fs.st_mode)) continue;
    found.push_back({key, static_cast<int64_t>(fs.st_size),
                     static_cast<int64_t>(fs.st_mtim.tv_sec) * 1000000000 + fs.st_mtim.tv_nsec});
  }
  ::closedir(d);
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime_ns < b.mtime_ns; });
  std::lock_guard<std::mutex> lock(tier->mu_);
  for (const Found& f : found) {
    tier->lru_.push_back(f.key);
    tier->index_[f.key] = Entry{f.bytes, std::prev(tier->lru_.end())};
    tier->bytes_ += f.bytes;
  }
  tier->MakeRoomLocked(0);  // A smaller budget than last time: the oldest go.
  return tier;
}

std::string DiskTier::PathOf(const KvTierKey& key) const {
  return Str(options_.path, "/", KeyName(key), kSuffix);
}

bool DiskTier::Contains(const KvTierKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.contains(key);
}

void DiskTier::ForgetLocked(KvTierKey key, bool unlink) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  index_.erase(it);
  removed_.push_back(key);
  if (removed_.size() > kMaxRemovedKept) removed_.pop_front();
  if (unlink) ::unlink(PathOf(key).c_str());
}

std::vector<BlockHash> DiskTier::Held(const BlockHash& model) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<BlockHash> out;
  for (const KvTierKey& k : lru_) {
    if (k.model == model) out.push_back(k.block);
  }
  return out;
}

void DiskTier::TakeRemoved(std::vector<KvTierKey>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  out->insert(out->end(), removed_.begin(), removed_.end());
  removed_.clear();
}

void DiskTier::MakeRoomLocked(int64_t incoming) {
  while (!lru_.empty() && bytes_ + incoming > options_.budget_bytes) {
    ForgetLocked(lru_.front(), /*unlink=*/true);
    ++stats_.evictions;
  }
}

absl::Status DiskTier::Store(const KvTierKey& key, absl::Span<const uint8_t> block) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t file_bytes = static_cast<int64_t>(kHeaderBytes + block.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.contains(key)) return absl::OkStatus();
    if (file_bytes > options_.budget_bytes) {
      return absl::ResourceExhaustedError(Str(options_.flag, ": a block of ", file_bytes,
                                              " bytes is larger than the budget"));
    }
  }
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.payload_bytes = block.size();
  h.checksum = XXH3_64bits(block.data(), block.size());
  KvTierKeyWords(key, h.key);
  // Written whole under a temporary name, then renamed: the block's name never names a part.
  const std::string final_path = PathOf(key);
  const std::string temp_path = Str(final_path, ".", ::getpid(), ".", temp_counter_.fetch_add(1), kTempSuffix);
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && WriteAll(fd, &h, sizeof h, 0) && WriteAll(fd, block.data(), block.size(), sizeof h);
  const int write_errno = errno;
  if (fd >= 0 && ::close(fd) != 0) ok = false;
  if (ok && ::rename(temp_path.c_str(), final_path.c_str()) != 0) ok = false;
  if (!ok) {
    ::unlink(temp_path.c_str());
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.errors;
    return absl::UnavailableError(Str(options_.flag, ": cannot write a block: ", std::strerror(write_errno)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  MakeRoomLocked(file_bytes);
  lru_.push_back(key);
  index_[key] = Entry{file_bytes, std::prev(lru_.end())};
  bytes_ += file_bytes;
  ++stats_.stores;
  stats_.store_bytes += static_cast<int64_t>(block.size());
  stats_.store_seconds += Since(start);
  return absl::OkStatus();
}

absl::Status DiskTier::Load(const KvTierKey& key, absl::Span<uint8_t> out) {
  const auto start = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!index_.contains(key)) {
      ++stats_.misses;
      return absl::NotFoundError("not in the disk tier");
    }
  }
  const std::string path = PathOf(key);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {  // Evicted meanwhile (another engine shares the tier): a miss.
    std::lock_guard<std::mutex> lock(mu_);
    ForgetLocked(key, /*unlink=*/false);
    ++stats_.misses;
    return absl::NotFoundError("not in the disk tier");
  }
  Header h{};
  const char* problem = nullptr;
  if (fd < 0) {
    problem = "cannot be opened";
  } else if (!ReadAll(fd, &h, sizeof h, 0) || std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
    problem = "has no block header";
  } else if (!KvTierKeyWordsMatch(key, h.key)) {
    problem = "holds another key";
  } else if (h.payload_bytes != out.size()) {
    problem = "is of another size";
  } else if (!ReadAll(fd, out.data(), out.size(), sizeof h)) {
    problem = "is truncated";
  } else if (XXH3_64bits(out.data(), out.size()) != h.checksum) {
    problem = "fails its checksum";
  }
  if (fd >= 0) {
    if (problem == nullptr) ::futimens(fd, nullptr);  // Its use, for the order after a restart.
    ::close(fd);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (problem != nullptr) {
    ForgetLocked(key, /*unlink=*/true);
    ++stats_.corrupt;
    ++stats_.misses;
    return absl::DataLossError(Str("disk tier: the block's file ", problem));
  }
  auto it = index_.find(key);
  if (it != index_.end()) lru_.splice(lru_.end(), lru_, it->second.lru);
  ++stats_.loads;
  stats_.load_bytes += static_cast<int64_t>(out.size());
  stats_.load_seconds += Since(start);
  return absl::OkStatus();
}

KvTierStats DiskTier::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  KvTierStats s = stats_;
  s.blocks = static_cast<int64_t>(index_.size());
  s.bytes = bytes_;
  return s;
}

}  // namespace pdserve
