// TEST INFRASTRUCTURE (see host_fiber.h): never part of the pdserve binary.
#include "kernels/cuda/host_fiber.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)

// pd_host_fiber_switch(save_sp, load_sp): pushes rbp, rbx, r12-r15 and an 8-byte slot holding
// MXCSR (low 4 bytes) and the x87 control word, stores rsp in *save_sp, then loads load_sp and
// pops the same frame from it. A new fiber's frame returns into pd_host_fiber_start, which calls
// the entry function that FiberInit left in r12 (with the stack 16-byte aligned at the call).
asm(R"(
  .text
  .p2align 4
  .globl pd_host_fiber_switch
  .hidden pd_host_fiber_switch
  .type pd_host_fiber_switch, @function
pd_host_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size pd_host_fiber_switch, .-pd_host_fiber_switch

  .p2align 4
  .globl pd_host_fiber_start
  .hidden pd_host_fiber_start
  .type pd_host_fiber_start, @function
pd_host_fiber_start:
  callq *%r12
  ud2
  .size pd_host_fiber_start, .-pd_host_fiber_start
)");

extern "C" void pd_host_fiber_switch(void** save_sp, void* load_sp);
extern "C" void pd_host_fiber_start();

namespace pdserve::cuda::host {

void FiberInit(FiberContext& fiber, char* stack, size_t size, void (*entry)()) {
  // The return address sits 24 bytes under the 16-aligned top, so that after `ret` rsp is
  // 16-aligned and pd_host_fiber_start's call enters entry() as the ABI wants (rsp % 16 == 8).
  const uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t{15};
  auto* frame = reinterpret_cast<uint64_t*>(top - 24 - 7 * 8);
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  // frame[0]: MXCSR and the x87 control word; [1..6]: r15, r14, r13, r12, rbx, rbp (all zero but
  // r12, the entry); [7]: the return address.
  std::memset(frame, 0, 8 * 8);
  std::memcpy(&frame[0], &mxcsr, sizeof(mxcsr));
  std::memcpy(reinterpret_cast<char*>(&frame[0]) + 4, &fpucw, sizeof(fpucw));
  frame[4] = reinterpret_cast<uintptr_t>(entry);
  frame[7] = reinterpret_cast<uintptr_t>(&pd_host_fiber_start);
  fiber.sp = frame;
}

void FiberSwitch(FiberContext& from, FiberContext& to) { pd_host_fiber_switch(&from.sp, to.sp); }

}  // namespace pdserve::cuda::host

#else  // Not x86-64: ucontext, with its system call a switch.

namespace pdserve::cuda::host {

void FiberInit(FiberContext& fiber, char* stack, size_t size, void (*entry)()) {
  getcontext(&fiber.uc);
  fiber.uc.uc_stack.ss_sp = stack;
  fiber.uc.uc_stack.ss_size = size;
  fiber.uc.uc_link = nullptr;
  makecontext(&fiber.uc, entry, 0);
}

void FiberSwitch(FiberContext& from, FiberContext& to) { swapcontext(&from.uc, &to.uc); }

}  // namespace pdserve::cuda::host

#endif
