// TEST INFRASTRUCTURE (see host_exec.h): never part of the pdserve binary.
#include "kernels/cuda/host_exec.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/cuda/dialect.h"
#include "kernels/cuda/host_fiber.h"

#if defined(__SANITIZE_ADDRESS__)
#define PD_HOST_EXEC_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PD_HOST_EXEC_ASAN 1
#endif
#endif
#if defined(PD_HOST_EXEC_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace pdserve::cuda::host {
namespace {

// Room for a kernel body's registers-as-locals, the std::function call and sanitizer redzones.
constexpr size_t kFiberStack = 256 * 1024;

// Fiber stacks outlive a launch (each launch would otherwise allocate and fault in threads x
// 256 KiB): a thread's launches reuse them.
std::unique_ptr<char[]> TakeStack();
void GiveBackStack(std::unique_ptr<char[]> stack);

// PDSERVE_HOST_EXEC_ORDER=reverse starts every thread in the reversed order (ctest runs the
// host-executed suites once more that way: a race that the forward order hides, a read of what
// a later thread writes, then fails their comparisons with the CPU twins).
ScheduleOrder DefaultOrder() {
  const char* order = std::getenv("PDSERVE_HOST_EXEC_ORDER");
  return order != nullptr && std::strcmp(order, "reverse") == 0 ? ScheduleOrder::kReverse
                                                                : ScheduleOrder::kForward;
}
thread_local ScheduleOrder g_order = DefaultOrder();

// Words one lane hands in for an mma: a[4], b[2], c[4].
constexpr int kMmaWords = 10;

struct Barrier {
  const char* name = "";
  int parties = 0;
  int arrived = 0;
  uint64_t generation = 0;
};

}  // namespace

class BlockRunner {
 public:
  BlockRunner(Grid grid, int threads, size_t shared_bytes,
              const std::function<void(HostCtx&)>* body)
      : grid_(grid),
        threads_(threads),
        shared_bytes_(shared_bytes),
        shared_(shared_bytes + kSharedGuardBytes),
        warp_slots_(threads),
        mma_slots_(static_cast<size_t>(threads) * kMmaWords),
        fibers_(threads),
        body_(body) {
    block_barrier_.name = "sync()";
    block_barrier_.parties = threads;
    warp_barriers_.resize(threads / kWarpSize);
    for (Barrier& b : warp_barriers_) {
      b.name = "a warp shuffle";
      b.parties = kWarpSize;
    }
    for (Fiber& f : fibers_) f.stack = TakeStack();
  }
  ~BlockRunner() {
    for (Fiber& f : fibers_) GiveBackStack(std::move(f.stack));
  }

  void RunBlock(int x, int y, int z) {
    block_[0] = x;
    block_[1] = y;
    block_[2] = z;
    std::memset(shared_.data(), 0xff, shared_.size());
    block_barrier_.arrived = 0;
    for (Barrier& b : warp_barriers_) b.arrived = 0;
    for (Fiber& f : fibers_) {
      f.done = false;
      f.waiting = nullptr;
      FiberInit(f.ctx, f.stack.get(), kFiberStack, &BlockRunner::Entry);
    }
    for (;;) {
      bool all_done = true, progressed = false;
      for (int k = 0; k < threads_; ++k) {
        const int i = g_order == ScheduleOrder::kReverse ? threads_ - 1 - k : k;
        Fiber& f = fibers_[i];
        if (f.done) continue;
        all_done = false;
        if (f.waiting != nullptr && f.waiting->generation == f.generation) continue;
        f.waiting = nullptr;
        current_ = i;
        SwitchToFiber(f);
        progressed = true;
      }
      if (all_done) {
        CheckSharedGuard();
        return;
      }
      if (!progressed) Deadlock();
    }
  }

  // The calling fiber waits at `b` until all its parties arrive.
  void Wait(Barrier& b) {
    if (++b.arrived == b.parties) {
      b.arrived = 0;
      ++b.generation;
      return;
    }
    Fiber& f = fibers_[current_];
    f.waiting = &b;
    f.generation = b.generation;
    SwitchToScheduler(f, /*exiting=*/false);
  }

  // No slack past a launch's dynamic shared memory: the guard after it (NaN bytes, as the rest)
  // must be untouched when the block ends, or the launch aborts; a read of it reads NaN.
  static constexpr size_t kSharedGuardBytes = 256;
  void CheckSharedGuard() const {
    for (size_t i = shared_bytes_; i < shared_.size(); ++i) {
      if (shared_[i] != 0xff) {
        std::fprintf(stderr,
                     "host_exec: block (%d, %d, %d) wrote past its %zu bytes of dynamic shared "
                     "memory (at byte %zu)\n",
                     block_[0], block_[1], block_[2], shared_bytes_, i);
        std::abort();
      }
    }
  }

  Grid grid_;
  int threads_;
  int block_[3] = {0, 0, 0};
  size_t shared_bytes_;
  std::vector<unsigned char> shared_;
  std::vector<uint32_t> warp_slots_;
  std::vector<uint32_t> mma_slots_;
  Barrier block_barrier_;
  std::vector<Barrier> warp_barriers_;

 private:
  struct Fiber {
    FiberContext ctx;
    std::unique_ptr<char[]> stack;
    bool done = false;
    const Barrier* waiting = nullptr;
    uint64_t generation = 0;
    void* fake_stack = nullptr;
  };

  static thread_local BlockRunner* running_;

  static void Entry() {
    BlockRunner* self = running_;
#if defined(PD_HOST_EXEC_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &self->scheduler_bottom_, &self->scheduler_size_);
#endif
    Fiber& f = self->fibers_[self->current_];
    HostCtx ctx(self, self->current_);
    (*self->body_)(ctx);
    f.done = true;
    self->SwitchToScheduler(f, /*exiting=*/true);
  }

  void SwitchToFiber(Fiber& f) {
    running_ = this;
#if defined(PD_HOST_EXEC_ASAN)
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f.stack.get(), kFiberStack);
#endif
    FiberSwitch(scheduler_, f.ctx);
#if defined(PD_HOST_EXEC_ASAN)
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  }

  void SwitchToScheduler(Fiber& f, bool exiting) {
#if defined(PD_HOST_EXEC_ASAN) && defined(__x86_64__)
    if (exiting) {
      // This fiber's stack is reused by later ones, but its last frames (Entry's, this one) never
      // return: their redzones would stay poisoned. Every deeper frame returned and unpoisoned
      // its own. (glibc's swapcontext, used elsewhere, has ASan clear the whole stack itself.)
      char* sp;
      asm volatile("movq %%rsp, %0" : "=r"(sp));
      ASAN_UNPOISON_MEMORY_REGION(sp, f.stack.get() + kFiberStack - sp);
    }
#endif
#if defined(PD_HOST_EXEC_ASAN)
    __sanitizer_start_switch_fiber(exiting ? nullptr : &f.fake_stack, scheduler_bottom_,
                                   scheduler_size_);
#endif
    // An exiting fiber's context is saved but never resumed: RunBlock starts it afresh.
    FiberSwitch(f.ctx, scheduler_);
#if defined(PD_HOST_EXEC_ASAN)
    __sanitizer_finish_switch_fiber(f.fake_stack, &scheduler_bottom_, &scheduler_size_);
#endif
  }

  [[noreturn]] void Deadlock() {
    const Barrier* b = nullptr;
    int waiting = 0;
    for (const Fiber& f : fibers_) {
      if (!f.done && f.waiting != nullptr) {
        b = f.waiting;
        ++waiting;
      }
    }
    std::fprintf(stderr,
                 "host_exec: block (%d, %d, %d) cannot go on: %d threads wait at %s (%d of %d "
                 "arrived), the others finished: some thread skipped a sync() or a shuffle\n",
                 block_[0], block_[1], block_[2], waiting, b ? b->name : "?", b ? b->arrived : 0,
                 b ? b->parties : 0);
    std::abort();
  }

  std::vector<Fiber> fibers_;
  const std::function<void(HostCtx&)>* body_;
  FiberContext scheduler_;
  int current_ = 0;
  const void* scheduler_bottom_ = nullptr;
  size_t scheduler_size_ = 0;
};

thread_local BlockRunner* BlockRunner::running_ = nullptr;

namespace {
thread_local std::vector<std::unique_ptr<char[]>> t_free_stacks;
std::unique_ptr<char[]> TakeStack() {
  if (t_free_stacks.empty()) return std::unique_ptr<char[]>(new char[kFiberStack]);
  std::unique_ptr<char[]> stack = std::move(t_free_stacks.back());
  t_free_stacks.pop_back();
  return stack;
}
void GiveBackStack(std::unique_ptr<char[]> stack) { t_free_stacks.push_back(std::move(stack)); }
}  // namespace

int HostCtx::threads() const { return runner_->threads_; }
int HostCtx::block(int axis) const { return runner_->block_[axis]; }
int HostCtx::blocks(int axis) const {
  return axis == 0 ? runner_->grid_.x : axis == 1 ? runner_->grid_.y : runner_->grid_.z;
}
void HostCtx::sync() { runner_->Wait(runner_->block_barrier_); }
unsigned char* HostCtx::SharedBase() { return runner_->shared_.data(); }

uint32_t HostCtx::Exchange(uint32_t bits, int mask) {
  const int warp = thread_ / kWarpSize, lane = thread_ % kWarpSize;
  uint32_t* slots = &runner_->warp_slots_[static_cast<size_t>(warp) * kWarpSize];
  slots[lane] = bits;
  runner_->Wait(runner_->warp_barriers_[warp]);
  const uint32_t got = slots[(lane ^ mask) & (kWarpSize - 1)];
  runner_->Wait(runner_->warp_barriers_[warp]);  // Nobody overwrites a slot before all have read.
  return got;
}

void HostCtx::mma_bf16(float* d, const uint32_t* a, const uint32_t* b) {
  const int warp = thread_ / kWarpSize, lane = thread_ % kWarpSize;
  uint32_t* slots = &runner_->mma_slots_[static_cast<size_t>(warp) * kWarpSize * kMmaWords];
  uint32_t* mine = slots + lane * kMmaWords;
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  mine[4] = b[0];
  mine[5] = b[1];
  runner_->Wait(runner_->warp_barriers_[warp]);
  // The element of A at (row, k) and of B at (k, col), from the lanes that hold them.
  auto half = [](uint32_t word, int high) {
    return Bf16Float(static_cast<uint16_t>(high ? word >> 16 : word & 0xffffu));
  };
  auto a_at = [&](int row, int k) {
    const int holder = (row % 8) * 4 + (k % 8) / 2;
    const int reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return half(slots[holder * kMmaWords + reg], k & 1);
  };
  auto b_at = [&](int k, int col) {
    const int holder = col * 4 + (k % 8) / 2;
    return half(slots[holder * kMmaWords + 4 + (k >= 8 ? 1 : 0)], k & 1);
  };
  const int g = lane / 4, t = lane % 4;
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
    double sum = d[e];
    for (int k = 0; k < kMmaK; ++k) {
      sum += static_cast<double>(a_at(row, k)) * static_cast<double>(b_at(k, col));
    }
    out[e] = static_cast<float>(sum);
  }
  runner_->Wait(runner_->warp_barriers_[warp]);  // Every lane has read the others' fragments.
  for (int e = 0; e < 4; ++e) d[e] = out[e];
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
  BlockRunner runner(grid, threads, shared_bytes, &body);
  const bool reverse = g_order == ScheduleOrder::kReverse;
  for (int zi = 0; zi < grid.z; ++zi) {
    for (int yi = 0; yi < grid.y; ++yi) {
      for (int xi = 0; xi < grid.x; ++xi) {
        runner.RunBlock(reverse ? grid.x - 1 - xi : xi, reverse ? grid.y - 1 - yi : yi,
                        reverse ? grid.z - 1 - zi : zi);
      }
    }
  }
}

ScopedScheduleOrder::ScopedScheduleOrder(ScheduleOrder order) : previous_(g_order) {
  g_order = order;
}
ScopedScheduleOrder::~ScopedScheduleOrder() { g_order = previous_; }

}  // namespace pdserve::cuda::host
