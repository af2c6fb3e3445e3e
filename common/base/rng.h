// Deterministic, platform-independent random numbers. std:: distributions are implementation-
// defined, so model files and sampling would differ between standard libraries; these do not.
#ifndef PDSERVE_COMMON_BASE_RNG_H_
#define PDSERVE_COMMON_BASE_RNG_H_

#include <cmath>
#include <cstdint>

namespace pdserve {

// SplitMix64 finaliser: a good 64-bit mix, used as a counter-based generator.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform double in [0, 1) from the counter pair (key, counter): the same pair always gives the
// same number, whatever was drawn before. The sampler keys it by (seed, output position), which
// is what makes a seeded request independent of its batch.
inline double CounterUniform(uint64_t key, uint64_t counter) {
  const uint64_t bits = Mix64(Mix64(key) ^ (counter * 0xd1b54a32d192ed03ull));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// Uniform float in [-1, 1) (24 bits) from (stream, i): element i of a synthetic weight matrix
// (ModelWeights::Synthetic). Its device twin is cuda::FillValue, equal to the bit.
inline float SymmetricUniform24(uint64_t stream, uint64_t i) {
  const uint64_t z = Mix64(stream + i * 0x9e3779b97f4a7c15ull);
  return static_cast<float>(z >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

// Sequential generator for fixtures (make-model weights).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Standard normal by Box-Muller (one value per call; simple and reproducible).
  double Normal() {
    double u1 = Uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BASE_RNG_H_
