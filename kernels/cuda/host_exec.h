// TEST INFRASTRUCTURE, never linked into the pdserve binary: the host execution layer that runs
// our CUDA kernel bodies (written in dialect.h) on the CPU, so CI checks their logic against the
// CPU kernels without a GPU.
//
// A launch runs the grid's blocks one after another. A block's threads are fibers (host_fiber.h) of
// the calling thread, each with its own stack (so a thread's private variables, loops and
// branches behave as on the device), switched only where a device thread could be held back:
// `sync()` is a barrier of the block, `shfl_xor` goes through a per-warp slot array between two
// barriers of the warp; `mma_bf16` gathers the warp's fragments the same way and computes the
// 16x8 product for each lane (products of bf16 are exact in f32; each output's 16 products and
// its accumulator are summed in double and rounded once: the tensor cores' order is not
// specified, so tests hold mma results to the CPU twin within f32 rounding of such a sum, never
// bitwise). That makes a run deterministic and cheap (no OS threads). Dynamic shared memory is a
// per-block buffer filled with NaN bytes before each block (a read of shared memory no thread
// wrote shows up as NaN). When no fiber can go on (some thread skipped a sync or a shuffle, a hang
// or undefined behaviour on a GPU too) the launch aborts, naming the barrier.
//
// Races: between two barriers the fibers run one after another, in the order ScheduleOrder names
// (blocks too). A kernel whose threads race (one reads what another writes without a sync
// between, or two blocks touch one output) gives other results in another order, so a test that
// runs a kernel forward and reversed (ScopedScheduleOrder) and asserts the same bits finds it;
// PDSERVE_HOST_EXEC_ORDER=reverse makes reversed the default (ctest's *_reversed entries).
// What it does not model: memory ordering beyond that, warp-divergent shuffles (every lane must
// take part, as with a full mask), timing and occupancy.
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
  void mma_bf16(float* d, const uint32_t* a, const uint32_t* b);
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

// The order fibers (and blocks) run in between barriers, for the calling thread's launches.
enum class ScheduleOrder { kForward, kReverse };
class ScopedScheduleOrder {
 public:
  explicit ScopedScheduleOrder(ScheduleOrder order);
  ~ScopedScheduleOrder();
  ScopedScheduleOrder(const ScopedScheduleOrder&) = delete;
  ScopedScheduleOrder& operator=(const ScopedScheduleOrder&) = delete;

 private:
  ScheduleOrder previous_;
};

// Runs body(ctx) for every thread of every block of `grid`. threads: a positive multiple of 32.
void Launch(Grid grid, int threads, size_t shared_bytes, const std::function<void(HostCtx&)>& body);

}  // namespace pdserve::cuda::host

#endif  // PDSERVE_KERNELS_CUDA_HOST_EXEC_H_
