// The AMX-BF16 instructions behind linear_bf16_amx.h's kernel, and the switch that lets the bf16
// path use them (linear_bf16.h: AmxEnabled).
#include "kernels/cpu/linear_bf16_amx.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/base/log.h"
#include "common/base/rng.h"
#include "kernels/cpu/linear_bf16.h"
#include "kernels/cpu/simd.h"  // PDSERVE_AVX2

#if PDSERVE_AVX2
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace pdserve::kernels {

#if PDSERVE_AVX2

#define PD_AMX __attribute__((target("amx-tile,amx-bf16")))

namespace {

// The intrinsics take tile numbers as literals (GCC pastes them into the assembly text), so each
// operation the kernel uses is spelled out per tile. GCC's ldtilecfg and tileloadd name only a
// pointer as their operand: a compiler barrier before each makes sure the bytes they read are
// written.
#define PD_MEMORY_BARRIER() __asm__ volatile("" ::: "memory")
struct HardwareTiles {
  PD_AMX static void Configure(const amx::TileConfig& cfg) {
    PD_MEMORY_BARRIER();
    _tile_loadconfig(&cfg);
  }
  template <int T>
  static void Zero();
  template <int T>
  static void Load(const void* p, int64_t stride);
  template <int C, int A, int B>
  static void Dot();
  template <int T>
  static void Store(void* p, int64_t stride);
  PD_AMX static void Release() { _tile_release(); }
};

#define PD_TILE(N)                                                                     \
  template <>                                                                          \
  PD_AMX inline void HardwareTiles::Zero<N>() {                                        \
    _tile_zero(N);                                                                     \
  }                                                                                    \
  template <>                                                                          \
  PD_AMX inline void HardwareTiles::Load<N>(const void* p, int64_t stride) {           \
    PD_MEMORY_BARRIER();                                                               \
    _tile_loadd(N, p, stride);                                                         \
  }                                                                                    \
  template <>                                                                          \
  PD_AMX inline void HardwareTiles::Store<N>(void* p, int64_t stride) {                \
    _tile_stored(N, p, stride);                                                        \
  }
PD_TILE(0)
PD_TILE(1)
PD_TILE(2)
PD_TILE(3)
PD_TILE(4)
PD_TILE(5)
PD_TILE(6)
PD_TILE(7)
#undef PD_TILE

#define PD_DOT(C, A, B)                              \
  template <>                                        \
  PD_AMX inline void HardwareTiles::Dot<C, A, B>() { \
    _tile_dpbf16ps(C, A, B);                         \
  }
PD_DOT(0, 2, 3)
PD_DOT(1, 2, 4)
PD_DOT(0, 5, 6)
PD_DOT(1, 5, 7)
#undef PD_DOT
static_assert(amx::kC0 == 0 && amx::kC1 == 1 && amx::kA == 2 && amx::kB0 == 3 && amx::kB1 == 4 &&
              amx::kATail == 5 && amx::kB0Tail == 6 && amx::kB1Tail == 7);

// The CPU has AMX-TILE and AMX-BF16 (CPUID.(7,0):EDX bits 24 and 22), and Linux lets this
// process use the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, feature 18).
bool AmxUsable() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if ((edx & (1u << 24)) == 0 || (edx & (1u << 22)) == 0) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
}

// Whether TDPBF16PS gives the kBf16PanelsAmx order's bits on this CPU: the AMX path against the
// scalar reference on normal values, products that underflow, denormal inputs, zeros of both
// signs and sums that cancel, every tail shape (~1 ms).
bool AmxMatchesReference() {
  SplitMix64 rng(19);
  for (int64_t k : {1, 31, 32, 33, 100}) {
    for (int64_t m : {1, 7, 17}) {
      const int64_t n = 37;
      std::vector<uint16_t> x(m * k), w(n * k);
      for (auto* v : {&x, &w}) {
        for (size_t i = 0; i < v->size(); ++i) {
          float f = static_cast<float>(rng.Normal());
          switch (rng.Next() % 8) {
            case 0: f *= 1e-20f; break;                                 // Underflow.
            case 1: f = Bf16ToF32(1 + rng.Next() % 0x7f); break;        // Denormal.
            case 2: f = i > 0 ? -Bf16ToF32((*v)[i - 1]) : 0.0f; break;  // Cancels.
            case 3: f = rng.Next() % 2 == 0 ? 0.0f : -0.0f; break;
            default: break;
          }
          (*v)[i] = F32ToBf16(f);
        }
      }
      const MatrixRef rows{DType::kBF16, w.data(), n, k};
      std::vector<uint16_t> packed(Bf16PanelsBytes(n, k) / 2);
      const MatrixRef p = PackBf16Panels(rows, packed.data(), MatrixLayout::kBf16PanelsAmx);
      std::vector<float> amx(m * n), ref(m * n);
      internal::LinearBf16ColumnsAmx(x.data(), m, k, p, amx.data(), n, 0, n);
      LinearBf16Reference(x.data(), m, k, p, ref.data(), n, 0, n);
      if (std::memcmp(amx.data(), ref.data(), amx.size() * sizeof(float)) != 0) return false;
    }
  }
  return true;
}

// On wherever the CPU has it (PDSERVE_AMX=0 or PDSERVE_KERNEL_ISA=avx2 turn it off), once the
// hardware has given the reference's bits.
bool DecideAmx() {
  const char* flag = std::getenv("PDSERVE_AMX");
  const char* isa = std::getenv("PDSERVE_KERNEL_ISA");
  if ((flag != nullptr && std::strcmp(flag, "0") == 0) ||
      (isa != nullptr && std::strcmp(isa, "avx2") == 0)) {
    return false;
  }
  if (!AmxSupported()) return false;
  if (!AmxMatchesReference()) {
    PD_LOG(Warning) << "AMX-BF16 does not give its order's bits on this CPU: not used";
    return false;
  }
  PD_LOG(Info) << "bf16 compute: AMX-BF16 tiles";
  return true;
}

}  // namespace

bool AmxSupported() {
  static const bool usable = AmxUsable();
  return usable;
}

bool AmxEnabled() {
  static const bool enabled = DecideAmx();
  return enabled;
}

namespace internal {
void LinearBf16ColumnsAmx(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                          int64_t ldy, int64_t n_begin, int64_t n_end, bool accumulate) {
  amx::Columns<HardwareTiles>(xb, m, ldx, w, y, ldy, n_begin, n_end, accumulate);
}
}  // namespace internal

#else  // No AVX2 build: no AMX either.

bool AmxSupported() { return false; }
bool AmxEnabled() { return false; }
namespace internal {
void LinearBf16ColumnsAmx(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                          int64_t ldy, int64_t n_begin, int64_t n_end, bool accumulate) {
  LinearBf16Reference(xb, m, ldx, w, y, ldy, n_begin, n_end, accumulate);
}
}  // namespace internal

#endif  // PDSERVE_AVX2

}  // namespace pdserve::kernels
