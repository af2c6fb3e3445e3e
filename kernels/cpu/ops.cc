#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/simd.h"

namespace pdserve::kernels {

float Dot(const float* a, const float* b, int64_t n) {
  return DotF32<F32Row>(a, reinterpret_cast<const uint8_t*>(b), n);
}

double LogSumExp(const float* x, int64_t n) {
  int64_t i = 0;
  float max = -INFINITY;
#if PDSERVE_AVX2
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
  max = HorizontalMax(vmax);
#endif
  for (; i < n; ++i) max = std::max(max, x[i]);
  double sum = 0;
  i = 0;
#if PDSERVE_AVX2
  const __m256 vm = _mm256_set1_ps(max);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(lo, hi));
  sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
  for (; i < n; ++i) sum += ExpScalar(x[i] - max);
  return max + std::log(sum);
}

void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  const float mean_sq = Dot(x, x, n) / static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(mean_sq + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
}

void ApplyRope(float* x, int64_t head_dim, const float* cos_sin) {
  const int64_t half = head_dim / 2;
  const float* c = cos_sin;
  const float* s = cos_sin + half;
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i];
    const float x2 = x[i + half];
    x[i] = x1 * c[i] - x2 * s[i];
    x[i + half] = x2 * c[i] + x1 * s[i];
  }
}

void RopeCosSin(const RopeParams& p, int64_t head_dim, int64_t position, float* out) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    double inv_freq = 1.0 / std::pow(p.theta, static_cast<double>(2 * i) / head_dim);
    double pos = static_cast<double>(position);
    if (p.type == 1) {
      pos /= p.factor;
    } else if (p.type == 3) {
      inv_freq = inv_freq / static_cast<double>(p.freq_factors[i]);
    } else if (p.type == 2) {
      // Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, smooth in between.
      const double low_freq_wavelen = p.original_max_position / p.low_freq_factor;
      const double high_freq_wavelen = p.original_max_position / p.high_freq_factor;
      const double wavelen = 2.0 * M_PI / inv_freq;
      if (wavelen > low_freq_wavelen) {
        inv_freq = inv_freq / p.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth = (p.original_max_position / wavelen - p.low_freq_factor) /
                              (p.high_freq_factor - p.low_freq_factor);
        inv_freq = (1.0 - smooth) * inv_freq / p.factor + smooth * inv_freq;
      }
    }
    const double angle = pos * inv_freq;
    out[i] = static_cast<float>(std::cos(angle));
    out[half + i] = static_cast<float>(std::sin(angle));
  }
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
#if PDSERVE_AVX2
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = Exp8(_mm256_xor_ps(g, sign));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + ExpScalar(-gate[i])) * up[i];
}

void AddInPlace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void EmbeddingRow(const MatrixRef& table, int64_t id, float* out) {
  const int64_t n = table.cols;
  if (table.quantized()) return DequantizeRow(table.quant_type, table.row(id), out, n);
  switch (table.dtype) {
    case DType::kF32:
      std::memcpy(out, table.row(id), n * sizeof(float));
      break;
    case DType::kBF16: {
      const uint16_t* r = static_cast<const uint16_t*>(table.row(id));
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToF32(r[i]);
      break;
    }
    case DType::kF16: {
      const uint16_t* r = static_cast<const uint16_t*>(table.row(id));
      for (int64_t i = 0; i < n; ++i) out[i] = F16ToF32(r[i]);
      break;
    }
  }
}

}  // namespace pdserve::kernels
