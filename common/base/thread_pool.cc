#include "common/base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pdserve {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// How long an idle worker spins before it sleeps. Long enough to bridge the gaps between the
// parallel loops of a forward pass and between decode steps, short enough to free the core soon.
constexpr auto kSpinTime = std::chrono::microseconds(200);

}  // namespace

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(num_threads > 0 ? num_threads
                                   : std::max(1u, std::thread::hardware_concurrency())) {
  shares_.reset(new Share[num_threads_]);
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Run(absl::FunctionRef<void(int)> fn) {
  if (num_threads_ == 1) {
    fn(0);
    return;
  }
  job_ = &fn;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  fn(0);
  // Spin briefly (workers finish within microseconds of us when the split is even), then yield
  // so an oversubscribed machine still lets the stragglers run.
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 4096) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
  job_ = nullptr;
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  const int64_t units = (n + grain - 1) / grain;
  const int64_t parts = std::min<int64_t>(units, num_threads_);
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  Run([&](int t) {
    if (t >= parts) return;
    const int64_t begin = std::min(n, (units * t / parts) * grain);
    const int64_t end = std::min(n, (units * (t + 1) / parts) * grain);
    if (begin < end) fn(begin, end);
  });
}

void ThreadPool::ParallelForDynamic(int64_t n, int64_t grain,
                                    absl::FunctionRef<void(int64_t, int64_t)> fn) {
  Dynamic(n, grain, nullptr, fn);
}

void ThreadPool::ParallelForDynamic(int64_t n, int64_t grain, absl::FunctionRef<void()> first,
                                    absl::FunctionRef<void(int64_t, int64_t)> fn) {
  Dynamic(n, grain, &first, fn);
}

void ThreadPool::Dynamic(int64_t n, int64_t grain, const absl::FunctionRef<void()>* first,
                         absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (grain < 1) grain = 1;
  const int64_t units = n > 0 ? (n + grain - 1) / grain : 0;
  if (units <= 1 || num_threads_ == 1 || units > INT32_MAX) {
    // Inline, or (shares are packed in 32 bits each; no loop here comes near) a static split.
    if (first != nullptr) (*first)();
    if (units > INT32_MAX) {
      ParallelFor(n, grain, fn);
    } else if (n > 0) {
      fn(0, n);
    }
    return;
  }
  const int parts = static_cast<int>(std::min<int64_t>(units, num_threads_));
  // Chunks of up to 1/8 of a share, and smaller as a share runs out (half of what is left of it
  // to its owner, a quarter to a thief), so the last ones are a unit or two and the threads
  // reach the barrier together: with 1/8-share chunks to the end they reached it 1-10 us apart
  // in a batch-1 decode step, which ran 1-2.5% faster with these (bench/RESULTS.md).
  const int64_t chunk = std::max<int64_t>(1, units / (8 * parts));
  auto pack = [](int64_t front, int64_t back) {
    return static_cast<uint64_t>(front) << 32 | static_cast<uint64_t>(back);
  };
  for (int p = 0; p < parts; ++p) {
    shares_[p].left.store(pack(units * p / parts, units * (p + 1) / parts), std::memory_order_relaxed);
  }
  // Claims up to `chunk` units of share p, from its front or its back; false when it is empty.
  auto claim = [&](int p, bool front, int64_t* begin, int64_t* end) {
    std::atomic<uint64_t>& left = shares_[p].left;
    uint64_t cur = left.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t f = static_cast<int64_t>(cur >> 32), b = static_cast<int64_t>(cur & 0xFFFFFFFFu);
      if (f >= b) return false;
      const int64_t c = std::min(chunk, std::max<int64_t>(1, (b - f) / (front ? 2 : 4)));
      const uint64_t next = front ? pack(f + c, b) : pack(f, b - c);
      if (left.compare_exchange_weak(cur, next, std::memory_order_relaxed)) {
        *begin = front ? f : b - c;
        *end = front ? f + c : b;
        return true;
      }
    }
  };
  // The shares' ranges reach fn through Run's release/acquire of the job; the CAS only has to
  // hand each unit out once.
  alignas(64) std::atomic<bool> first_done{first == nullptr};
  Run([&](int t) {
    if (t == 0 && first != nullptr) {
      (*first)();
      first_done.store(true, std::memory_order_release);
    }
    // As Run's wait: spin briefly, then yield, so a caller preempted in the set-up gets its core.
    for (int spins = 0; !first_done.load(std::memory_order_acquire); ++spins) {
      if (spins < 4096) {
        CpuRelax();
      } else {
        std::this_thread::yield();
      }
    }
    int64_t b, e;
    if (t < parts) {
      while (claim(t, true, &b, &e)) fn(b * grain, std::min(n, e * grain));
    }
    for (int i = 1; i <= parts; ++i) {
      const int victim = (t + i) % parts;
      while (claim(victim, false, &b, &e)) fn(b * grain, std::min(n, e * grain));
    }
  });
}

void ThreadPool::ForEachItem(int64_t n, absl::FunctionRef<void(int, int64_t)> fn) {
  const int threads = num_threads_;
  if (threads == 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(0, i);
    return;
  }
  // Thread t's items left: [front, back) of its sequence t, t + T, ..., packed front << 32 | back
  // so that its owner (front) and a thief (back) claim by one CAS.
  auto pack = [](int64_t front, int64_t back) {
    return static_cast<uint64_t>(front) << 32 | static_cast<uint64_t>(back);
  };
  const int64_t per_thread_max = (n + threads - 1) / threads;
  if (per_thread_max > INT32_MAX) {  // No loop here comes near; a fixed deal.
    Run([&](int t) {
      for (int64_t i = t; i < n; i += threads) fn(t, i);
    });
    return;
  }
  for (int t = 0; t < threads; ++t) {
    shares_[t].left.store(pack(0, n > t ? (n - t + threads - 1) / threads : 0), std::memory_order_relaxed);
  }
  auto claim = [&](int owner, bool front, int64_t* k) {
    std::atomic<uint64_t>& left = shares_[owner].left;
    uint64_t cur = left.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t f = static_cast<int64_t>(cur >> 32), b = static_cast<int64_t>(cur & 0xFFFFFFFFu);
      if (f >= b) return false;
      if (left.compare_exchange_weak(cur, front ? pack(f + 1, b) : pack(f, b - 1), std::memory_order_relaxed)) {
        *k = front ? f : b - 1;
        return true;
      }
    }
  };
  Run([&](int t) {
    int64_t k;
    while (claim(t, true, &k)) fn(t, t + k * threads);
    for (int d = 1; d < threads; ++d) {
      const int owner = (t + d) % threads;
      while (claim(owner, false, &k)) fn(t, owner + k * threads);
    }
  });
}

void ThreadPool::WorkerLoop(int index) {
  // Generation 0 is the pool's state at construction; loading it here instead could miss a job
  // posted before this thread first ran.
  uint64_t seen = 0;
  for (;;) {
    // Spin, then sleep, until a new generation appears.
    auto spin_start = std::chrono::steady_clock::now();
    uint64_t current;
    int spins = 0;
    while ((current = generation_.load(std::memory_order_acquire)) == seen) {
      CpuRelax();
      if (++spins % 64 == 0 && std::chrono::steady_clock::now() - spin_start > kSpinTime) {
        std::unique_lock<std::mutex> lock(mu_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_seq_cst) != seen; });
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
        spin_start = std::chrono::steady_clock::now();
      }
    }
    seen = current;
    if (stop_.load(std::memory_order_acquire)) return;
    (*job_)(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace pdserve
