// TEST INFRASTRUCTURE (see host_exec.h): the context switch between host_exec's fibers.
//
// On x86-64 a switch saves the callee-saved registers, MXCSR and the x87 control word on the
// fiber's own stack and swaps stack pointers, with no system call. glibc's swapcontext also saves
// and restores the signal mask with a system call on every switch, which made ~85% of the
// host-executed CUDA suites' time (perf, 2026-12-07; one test case went from 6.1 s to 0.12 s with
// this switch); elsewhere the fallback is still ucontext. A fiber's entry function must never return: it switches away for good instead.
#ifndef PDSERVE_KERNELS_CUDA_HOST_FIBER_H_
#define PDSERVE_KERNELS_CUDA_HOST_FIBER_H_

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace pdserve::cuda::host {

struct FiberContext {
#if defined(__x86_64__)
  void* sp = nullptr;  // Where the saved registers lie on the fiber's stack.
#else
  ucontext_t uc;
#endif
};

// Prepares `fiber` to run entry() on [stack, stack + size) at its first FiberSwitch into it.
void FiberInit(FiberContext& fiber, char* stack, size_t size, void (*entry)());

// Saves the running context in `from` and resumes `to`.
void FiberSwitch(FiberContext& from, FiberContext& to);

}  // namespace pdserve::cuda::host

#endif  // PDSERVE_KERNELS_CUDA_HOST_FIBER_H_
