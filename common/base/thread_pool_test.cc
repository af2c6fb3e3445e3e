#include "common/base/thread_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

TEST(ThreadPoolTest, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 5, 64, 1000, 1001}) {
      for (int64_t grain : {1, 4, 16}) {
        for (bool dynamic : {false, true}) {
          std::vector<std::atomic<int>> hits(n);
          auto fn = [&](int64_t b, int64_t e) {
            if (e < n) EXPECT_EQ(e % grain, 0);
            EXPECT_EQ(b % grain, 0);
            for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
          };
          if (dynamic) {
            pool.ParallelForDynamic(n, grain, fn);
          } else {
            pool.ParallelFor(n, grain, fn);
          }
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << dynamic;
          }
        }
      }
    }
  }
}

TEST(ThreadPoolTest, ParallelForDynamicHandsASlowThreadsShareToTheOthers) {
  // The worker sleeps in every chunk it takes; the caller, done with its own share, takes the
  // rest of the worker's share from its back.
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  constexpr int64_t n = 1000;
  std::vector<std::atomic<int>> hits(n);
  std::atomic<int64_t> by_caller{0};
  pool.ParallelForDynamic(n, 1, [&](int64_t b, int64_t e) {
    if (std::this_thread::get_id() == caller) {
      by_caller += e - b;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
  EXPECT_GT(by_caller.load(), 3 * n / 4);
}

TEST(ThreadPoolTest, RunReachesEveryThreadManyTimes) {
  ThreadPool pool(4);
  std::vector<int> counts(4, 0);
  for (int round = 0; round < 20000; ++round) pool.Run([&](int t) { ++counts[t]; });
  for (int c : counts) EXPECT_EQ(c, 20000);
}

TEST(ThreadPoolTest, WorkersWakeAfterSleeping) {
  ThreadPool pool(3);
  std::atomic<int> sum{0};
  pool.Run([&](int t) { sum += t; });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // Workers are asleep by now.
  pool.Run([&](int t) { sum += t; });
  EXPECT_EQ(sum.load(), 6);
}

// Jobs posted while workers are going to sleep: gaps around the pool's spin time (200 us), so
// that over the rounds a job lands in every part of a worker's way from spinning into its wait.
// A lost wake-up would leave Run waiting for ever (the test's timeout).
TEST(ThreadPoolTest, JobsPostedAsWorkersFallAsleepAreRun) {
  ThreadPool pool(3);
  std::vector<int> counts(3, 0);
  constexpr int kRounds = 1500;
  for (int round = 0; round < kRounds; ++round) {
    pool.Run([&](int t) { ++counts[t]; });
    std::this_thread::sleep_for(std::chrono::microseconds(150 + (round * 37) % 120));
  }
  for (int c : counts) EXPECT_EQ(c, kRounds);
}

}  // namespace
}  // namespace pdserve
