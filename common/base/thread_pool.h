// A fixed pool of threads for the data-parallel loops of one model forward pass.
//
// The caller thread takes part (index 0), so ThreadPool(1) runs everything inline. Workers spin for
// a short while after each job (a forward pass issues ~5 jobs per layer, microseconds apart), then
// sleep on a condition variable so an idle server uses no CPU.
//
// Thread-safety: Run/ParallelFor must be called by one thread at a time (the owning scheduler
// thread); the pool is not reentrant (a job must not call Run).
#ifndef PDSERVE_COMMON_BASE_THREAD_POOL_H_
#define PDSERVE_COMMON_BASE_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace pdserve {

class ThreadPool {
 public:
  // num_threads >= 1 counts the caller; <= 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn(thread_index) once on each of the num_threads() threads; returns when all are done.
  void Run(absl::FunctionRef<void(int)> fn);

  // Splits [0, n) into at most num_threads() contiguous ranges whose boundaries are multiples of
  // `grain` (except the last), and runs fn(begin, end) for each non-empty range.
  void ParallelFor(int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> fn);

  // As ParallelFor, but balanced at run time, so a thread slowed by the machine does not hold the
  // others at the barrier: each thread takes chunks of at most n / (8 x threads) (multiples of
  // `grain`; half of what is left of its share when that is less, so they end at one grain) from
  // the front of its own contiguous share, in order, then steals chunks (a quarter of what is
  // left, at most as large) from the back of the others' shares until none is left. A thread's
  // chunks follow one another in memory, so a loop that streams (a matrix's columns) keeps one
  // stream per thread and its prefetches run into its own next chunk. fn may run many times per
  // thread: only for loops whose ranges are independent and need no per-call set-up.
  void ParallelForDynamic(int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> fn);
  // As above, the caller first running `first` while the workers wake: they take no chunk
  // before it returns (a loop's set-up, such as quantizing the x a matrix's columns read, then
  // costs max(set-up, wake-up) instead of their sum).
  void ParallelForDynamic(int64_t n, int64_t grain, absl::FunctionRef<void()> first,
                          absl::FunctionRef<void(int64_t, int64_t)> fn);

  // Runs fn(thread, i) once for each item i of [0, n). Thread t owns items t, t + T, t + 2T, ...
  // (T threads: a round-robin deal) and runs them in order; a thread done with its own takes the
  // last ones of the others. So a thread the machine preempts (gRPC's threads share the cores in
  // `serve`) leaves its items to the others instead of holding them at the barrier. For items of
  // uneven cost whose outputs are disjoint (attention's (row, head) items).
  void ForEachItem(int64_t n, absl::FunctionRef<void(int, int64_t)> fn);

 private:
  void Dynamic(int64_t n, int64_t grain, const absl::FunctionRef<void()>* first,
               absl::FunctionRef<void(int64_t, int64_t)> fn);
  void WorkerLoop(int index);

  const int num_threads_;
  std::vector<std::thread> workers_;
  // ParallelForDynamic's shares, one per thread: what is left of it as [front, back) in units,
  // packed front << 32 | back so the owner (front) and thieves (back) claim by one CAS.
  struct alignas(64) Share {
    std::atomic<uint64_t> left{0};
  };
  std::unique_ptr<Share[]> shares_;  // Also ForEachItem's: thread t's items left.
  // Three cache lines, so that the workers' spinning reads of one do not take from the caller
  // the line it is writing (a hand-off across cores costs a transfer per line it touches).
  // The current job: written by the caller before `generation_` is bumped, read by the workers
  // after they observe the bump (seq_cst, for the sleepers' handshake below; release/acquire
  // would do for the job itself); `stop_` only at destruction.
  alignas(64) const absl::FunctionRef<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  // Workers still running the job (the caller spins on it).
  alignas(64) std::atomic<int> pending_{0};
  // Sleeping workers. A worker counts itself under mu_ before it checks `generation_` and waits;
  // the caller bumps `generation_` before it reads the count (both seq_cst), so either the worker
  // sees the new job or the caller sees the sleeper and notifies under mu_: the caller takes the
  // mutex only when someone sleeps.
  alignas(64) std::atomic<int> sleepers_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BASE_THREAD_POOL_H_
