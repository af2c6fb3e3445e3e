#include "common/base/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
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
        for (int kind : {0, 1, 2}) {  // Static, dynamic, dynamic with a set-up.
          std::vector<std::atomic<int>> hits(n);
          std::atomic<int> set_ups{0};
          auto fn = [&](int64_t b, int64_t e) {
            if (e < n) EXPECT_EQ(e % grain, 0);
            EXPECT_EQ(b % grain, 0);
            if (kind == 2) EXPECT_EQ(set_ups.load(), 1);
            for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
          };
          if (kind == 0) {
            pool.ParallelFor(n, grain, fn);
          } else if (kind == 1) {
            pool.ParallelForDynamic(n, grain, fn);
          } else {
            pool.ParallelForDynamic(n, grain, [&] { set_ups.fetch_add(1); }, fn);
            EXPECT_EQ(set_ups.load(), 1);
          }
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << kind;
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

TEST(ThreadPoolTest, ForEachItemRunsEachItemOnceInItsOwnersOrderWhenNoneIsLate) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1001}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::vector<std::vector<int64_t>> order(static_cast<size_t>(threads));
      std::mutex mu;
      pool.ForEachItem(n, [&](int t, int64_t i) {
        hits[static_cast<size_t>(i)].fetch_add(1);
        std::lock_guard<std::mutex> lock(mu);
        order[static_cast<size_t>(t)].push_back(i);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << threads << " " << i;
      // A thread's own items (t mod T) come first and in order.
      for (int t = 0; t < threads; ++t) {
        int64_t last = -1;
        for (int64_t i : order[static_cast<size_t>(t)]) {
          if (i % threads != t) break;
          EXPECT_GT(i, last);
          last = i;
        }
      }
    }
  }
}

TEST(ThreadPoolTest, ForEachItemHandsALateThreadsItemsToTheOthers) {
  // The worker sleeps in each item it takes (a thread the machine preempted); the caller, done
  // with its own items, takes the worker's from the back.
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  constexpr int64_t n = 200;
  std::vector<std::atomic<int>> hits(n);
  std::atomic<int64_t> by_caller{0};
  pool.ForEachItem(n, [&](int, int64_t i) {
    if (std::this_thread::get_id() == caller) {
      by_caller.fetch_add(1);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    hits[static_cast<size_t>(i)].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
  EXPECT_GT(by_caller.load(), 3 * n / 4);
}

TEST(ThreadPoolTest, ParallelForDynamicRunsTheSetUpOnTheCallerBeforeAnyChunk) {
  // The set-up is slow, so the workers are awake and waiting long before it ends; none may
  // start a chunk until it has.
  ThreadPool pool(4);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> set_up{false};
  std::atomic<int> chunks_before{0}, chunks{0};
  pool.ParallelForDynamic(
      64, 1,
      [&] {
        EXPECT_EQ(std::this_thread::get_id(), caller);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        set_up = true;
      },
      [&](int64_t, int64_t) {
        if (!set_up.load()) chunks_before.fetch_add(1);
        chunks.fetch_add(1);
      });
  EXPECT_EQ(chunks_before.load(), 0);
  EXPECT_GT(chunks.load(), 4);
}

TEST(ThreadPoolTest, ParallelForDynamicEndsInSmallChunks) {
  // Chunks shrink as the shares run out: the last ones taken are single units, so the threads
  // finish within a unit of each other.
  ThreadPool pool(2);
  constexpr int64_t n = 4096;
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // In the order they were taken.
  pool.ParallelForDynamic(n, 1, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(mu);
    ranges.emplace_back(b, e);
  });
  // The last claim is a unit; a thread records its chunk before it claims again, so only the
  // other thread's last chunk can be recorded after that one.
  ASSERT_GE(ranges.size(), 2u);
  const auto size = [&](size_t i) { return ranges[i].second - ranges[i].first; };
  EXPECT_EQ(std::min(size(ranges.size() - 1), size(ranges.size() - 2)), 1);
  int64_t largest = 0;
  for (const auto& [b, e] : ranges) largest = std::max(largest, e - b);
  EXPECT_LE(largest, n / 16);  // At most an eighth of a share.
  std::sort(ranges.begin(), ranges.end());
  int64_t covered = 0;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, covered);
    covered = e;
  }
  EXPECT_EQ(covered, n);
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
