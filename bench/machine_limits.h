// This machine's limits, measured in the same run as the benchmark they judge: memory read
// bandwidth (what bounds decode), OpenBLAS sgemm rate and the peak of each dot-product
// instruction (what bounds prefill). Shared machines are noisy, so figures are reported as
// ratios against these.
#ifndef PDSERVE_BENCH_MACHINE_LIMITS_H_
#define PDSERVE_BENCH_MACHINE_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace pdserve {
class ThreadPool;
}

namespace pdserve::bench {

// Bytes/s of a multi-threaded read (an XOR of every 32 bytes) of a `bytes`-sized buffer (make it
// far larger than the last level cache). Best of `repeats` passes. With `prefetch`, each thread also prefetches 8 KiB ahead
// as the linear kernel does: software prefetch keeps more lines in flight than the hardware
// prefetcher alone, so the plain read can be slower than the decode it is meant to bound.
double ReadBandwidth(ThreadPool* pool, size_t bytes, int repeats, bool prefetch);

// The same read over a buffer kept between passes, for a reference taken between a benchmark's
// steps: on a shared host the memory's rate moves by half within seconds (bench/RESULTS.md,
// "A reference read between the steps"), so a ratio against a read taken before or after the run
// moves with it.
class ReadProbe {
 public:
  // Allocates `bytes` and touches it from the pool's threads.
  ReadProbe(ThreadPool* pool, size_t bytes);
  ~ReadProbe();
  ReadProbe(const ReadProbe&) = delete;
  ReadProbe& operator=(const ReadProbe&) = delete;
  // Bytes/s of one pass over the buffer.
  double Pass(bool prefetch);

 private:
  ThreadPool* pool_;
  size_t bytes_;
  std::byte* buf_;
};

// Bytes/s of one pass over `regions` where they are (a model's weights where its runner reads
// them, LLMEngine::decode_weight_memory), each thread reading its share of every region in turn,
// plain or prefetching as ReadBandwidth. On a VM two allocations can read up to 30% apart in one
// process, so a decode step is also judged against the memory its own weights sit in.
double ReadRegions(ThreadPool* pool, absl::Span<const absl::Span<const std::byte>> regions,
                   bool prefetch);

// Flop/s of OpenBLAS sgemm on n x n x n with `threads` threads. Best of `repeats`.
double SgemmFlops(int threads, int64_t n, int repeats);

// Peak flop/s of one dot-product instruction over all of `pool`'s threads: 12 independent
// accumulators per thread, operands in registers, best of `repeats`. A product-add counts 2 flops.
// 0 where this CPU (or build) lacks the instruction.
enum class DotInstruction {
  kFmaF32Avx2,    // VFMADD231PS ymm: the f32 path below 8 rows, and the bf16 path's AVX2 twin
  kFmaF32Avx512,  // VFMADD231PS zmm: the f32 path from 8 rows
  kDpBf16,        // VDPBF16PS zmm (AVX512-BF16): the bf16 path
  kAmxBf16,       // TDPBF16PS (AMX-BF16, 4 C tiles): the bf16 path with PDSERVE_AMX=1
};
inline constexpr int kNumDotInstructions = 4;
const char* DotInstructionName(DotInstruction i);
double DotInstructionPeak(ThreadPool* pool, DotInstruction instruction, int repeats);

// "AMD EPYC 7B13" etc. from /proc/cpuinfo.
std::string CpuModel();

}  // namespace pdserve::bench

#endif  // PDSERVE_BENCH_MACHINE_LIMITS_H_
