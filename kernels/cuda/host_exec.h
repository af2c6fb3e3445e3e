// TEST INFRASTRUCTURE, never linked into the pdserve binary: the host execution layer that runs
// our CUDA kernel bodies (written in dialect.h) on the CPU, so CI checks their logic against the
// CPU kernels without a GPU.
//
// A launch runs the grid's blocks one after another; a block's threads are real host threads (so
// a thread's private variables, loops and branches behave as on the device), `sync()` is a
// barrier of the block, `shfl_xor` goes through a per-warp slot array between two barriers of the
// warp, and dynamic shared memory is a per-block buffer filled with NaN bytes before each block
// (a read of shared memory no thread wrote shows up as NaN). A barrier that waits more than 60 s
// aborts with a message: some thread skipped a sync or a shuffle, which is a hang or undefined
// behaviour on a GPU too. What it does not model: memory ordering without a sync, warp-divergent
// shuffles (every lane must take part, as with a full mask), timing and occupancy.
#ifndef PDSERVE_KERNELS_CUDA_HOST_EXEC_H_
#define PDSERVE_KERNELS_CUDA_HOST_EXEC_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace pdserve::cuda::host {

struct Grid {
  int x = 1, y = 1, z = 1;
};

class Barrier {
 public:
  explicit Barrier(int parties);
  ~Barrier();
  void Wait();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// What a block's threads share.
struct BlockState {
  BlockState(int threads, size_t shared_bytes);
  Barrier block_barrier;
  std::vector<std::unique_ptr<Barrier>> warp_barriers;
  std::vector<uint32_t> warp_slots;  // kWarpSize per warp.
  std::vector<unsigned char> shared;  // 16-byte aligned (see Shared()).
  int block[3] = {0, 0, 0};
  Grid grid;
  int threads = 0;
  unsigned char* Shared() { return shared.data(); }
};

class HostCtx {
 public:
  HostCtx(BlockState* s, int thread) : s_(s), thread_(thread) {}
  int thread() const { return thread_; }
  int threads() const { return s_->threads; }
  int block(int axis) const { return s_->block[axis]; }
  int blocks(int axis) const { return axis == 0 ? s_->grid.x : axis == 1 ? s_->grid.y : s_->grid.z; }
  void sync() { s_->block_barrier.Wait(); }
  float shfl_xor(float v, int mask);
  int shfl_xor(int v, int mask);
  template <typename T>
  T* shared() {
    return reinterpret_cast<T*>(s_->Shared());
  }

 private:
  uint32_t Exchange(uint32_t bits, int mask);
  BlockState* s_;
  int thread_;
};

// Runs body(ctx) for every thread of every block of `grid`. threads: a positive multiple of 32.
void Launch(Grid grid, int threads, size_t shared_bytes, const std::function<void(HostCtx&)>& body);

}  // namespace pdserve::cuda::host

#endif  // PDSERVE_KERNELS_CUDA_HOST_EXEC_H_
