// TEST INFRASTRUCTURE (see host_exec.h): never part of the pdserve binary.
#include "kernels/cuda/host_exec.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "kernels/cuda/dialect.h"

namespace pdserve::cuda::host {

struct Barrier::State {
  std::mutex mu;
  std::condition_variable cv;
  int parties = 0;
  int waiting = 0;
  uint64_t generation = 0;
};

Barrier::Barrier(int parties) : state_(new State) { state_->parties = parties; }
Barrier::~Barrier() = default;

void Barrier::Wait() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  const uint64_t gen = s.generation;
  if (++s.waiting == s.parties) {
    s.waiting = 0;
    ++s.generation;
    s.cv.notify_all();
    return;
  }
  if (!s.cv.wait_for(lock, std::chrono::seconds(60), [&] { return s.generation != gen; })) {
    std::fprintf(stderr,
                 "host_exec: a barrier waited 60 s (%d of %d threads arrived): some thread skipped "
                 "a sync() or a shuffle\n",
                 s.waiting, s.parties);
    std::abort();
  }
}

BlockState::BlockState(int threads_in, size_t shared_bytes)
    : block_barrier(threads_in),
      warp_slots(static_cast<size_t>(threads_in)),
      shared(shared_bytes + 16),
      threads(threads_in) {
  for (int w = 0; w < threads_in / kWarpSize; ++w) {
    warp_barriers.push_back(std::make_unique<Barrier>(kWarpSize));
  }
}

uint32_t HostCtx::Exchange(uint32_t bits, int mask) {
  const int warp = thread_ / kWarpSize, lane = thread_ % kWarpSize;
  uint32_t* slots = &s_->warp_slots[static_cast<size_t>(warp) * kWarpSize];
  slots[lane] = bits;
  s_->warp_barriers[warp]->Wait();
  const uint32_t got = slots[(lane ^ mask) & (kWarpSize - 1)];
  s_->warp_barriers[warp]->Wait();  // Nobody overwrites a slot before every lane has read.
  return got;
}

float HostCtx::shfl_xor(float v, int mask) { return BitsFloat(Exchange(FloatBits(v), mask)); }
int HostCtx::shfl_xor(int v, int mask) {
  return static_cast<int>(Exchange(static_cast<uint32_t>(v), mask));
}

void Launch(Grid grid, int threads, size_t shared_bytes, const std::function<void(HostCtx&)>& body) {
  if (threads <= 0 || threads % kWarpSize != 0 || grid.x < 1 || grid.y < 1 || grid.z < 1) {
    std::fprintf(stderr, "host_exec: bad launch (%d threads, grid %d x %d x %d)\n", threads, grid.x,
                 grid.y, grid.z);
    std::abort();
  }
  BlockState state(threads, shared_bytes);
  state.grid = grid;
  // Thread 0 prepares each block (indices, NaN-filled shared memory) between two barriers.
  auto run = [&](int t) {
    HostCtx ctx(&state, t);
    for (int z = 0; z < grid.z; ++z) {
      for (int y = 0; y < grid.y; ++y) {
        for (int x = 0; x < grid.x; ++x) {
          if (t == 0) {
            state.block[0] = x;
            state.block[1] = y;
            state.block[2] = z;
            std::memset(state.shared.data(), 0xff, state.shared.size());
          }
          state.block_barrier.Wait();
          body(ctx);
          state.block_barrier.Wait();
        }
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) pool.emplace_back(run, t);
  for (std::thread& th : pool) th.join();
}

}  // namespace pdserve::cuda::host
