// TEST INFRASTRUCTURE, never linked into the pdserve binary: the host execution layer that runs
// our CUDA kernel bodies (written in dialect.h) on the CPU, so CI checks their logic against the
// CPU kernels without a GPU.
//
// A launch runs the grid's blocks one after another. A block's threads are fibers (ucontext) of
// the calling thread, each with its own stack (so a thread's private variables, loops and
// branches behave as on the device), switched only where a device thread could be held back:
// `sync()` is a barrier of the block, `shfl_xor` goes through a per-warp slot array between two
// barriers of the warp. That makes a run deterministic and cheap (no OS threads). Dynamic shared
// memory is a per-block buffer filled with NaN bytes before each block (a read of shared memory
// no thread wrote shows up as NaN). When no fiber can go on (some thread skipped a sync or a
// shuffle, a hang or undefined behaviour on a GPU too) the launch aborts, naming the barrier.
// What it does not model: memory ordering without a sync, warp-divergent shuffles (every lane
// must take part, as with a full mask), timing and occupancy.
#ifndef PDSERVE_KERNELS_CUDA_HOST_EXEC_H_
#define PDSERVE_KERNELS_CUDA_HOST_EXEC_H_

#include <cstddef>
#include <cstdint>
#include <functional>

namespace pdserve::cuda::host {

struct Grid {
  int x = 1, y = 1, z = 1;
};

class BlockRunner;  // host_exec.cc

class HostCtx {
 public:
  HostCtx(BlockRunner* runner, int thread) : runner_(runner), thread_(thread) {}
  int thread() const { return thread_; }
  int threads() const;
  int block(int axis) const;
  int blocks(int axis) const;
  void sync();
  float shfl_xor(float v, int mask);
  int shfl_xor(int v, int mask);
  template <typename T>
  T* shared() {
    return reinterpret_cast<T*>(SharedBase());
  }

 private:
  unsigned char* SharedBase();
  uint32_t Exchange(uint32_t bits, int mask);
  BlockRunner* runner_;
  int thread_;
};

// Runs body(ctx) for every thread of every block of `grid`. threads: a positive multiple of 32.
void Launch(Grid grid, int threads, size_t shared_bytes, const std::function<void(HostCtx&)>& body);

}  // namespace pdserve::cuda::host

#endif  // PDSERVE_KERNELS_CUDA_HOST_EXEC_H_
