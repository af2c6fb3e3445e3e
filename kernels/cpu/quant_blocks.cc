#include "kernels/cpu/quant_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/dtype.h"

namespace pdserve::kernels {
namespace {

uint16_t U16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void Q8_0(const uint8_t* b, float* out) {
  const float d = F16ToF32(U16(b));
  const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int l = 0; l < 32; ++l) out[l] = d * static_cast<float>(q[l]);
}

void Q4_0(const uint8_t* b, float* out) {
  const float d = F16ToF32(U16(b));
  const uint8_t* q = b + 2;
  for (int l = 0; l < 16; ++l) {
    out[l] = d * static_cast<float>((q[l] & 0xF) - 8);
    out[l + 16] = d * static_cast<float>((q[l] >> 4) - 8);
  }
}

// Q4_K and Q5_K (qh null for Q4_K).
void Q45K(const uint8_t* b, const uint8_t* qh, const uint8_t* qs, float* out) {
  const float d = F16ToF32(U16(b)), dmin = F16ToF32(U16(b + 2));
  const uint8_t* scales = b + 4;
  for (int pair = 0; pair < 4; ++pair) {
    int sc, mn;
    KQuantScaleMin(2 * pair, scales, &sc, &mn);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
    KQuantScaleMin(2 * pair + 1, scales, &sc, &mn);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
    const uint8_t* q = qs + 32 * pair;
    for (int l = 0; l < 32; ++l) {
      int lo = q[l] & 0xF, hi = q[l] >> 4;
      if (qh != nullptr) {
        lo += ((qh[l] >> (2 * pair)) & 1) << 4;
        hi += ((qh[l] >> (2 * pair + 1)) & 1) << 4;
      }
      out[64 * pair + l] = std::fma(d1, static_cast<float>(lo), -m1);
      out[64 * pair + 32 + l] = std::fma(d2, static_cast<float>(hi), -m2);
    }
  }
}

void Q6K(const uint8_t* b, float* out) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = F16ToF32(U16(b + 208));
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      out[l] = (d * static_cast<float>(sc[is])) * static_cast<float>(q1);
      out[l + 32] = (d * static_cast<float>(sc[is + 2])) * static_cast<float>(q2);
      out[l + 64] = (d * static_cast<float>(sc[is + 4])) * static_cast<float>(q3);
      out[l + 96] = (d * static_cast<float>(sc[is + 6])) * static_cast<float>(q4);
    }
    out += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

int NearestInt(float v) { return static_cast<int>(std::nearbyint(v)); }

// llama.cpp's make_qkx2_quants for n = 32, nmax = 15, rmin -1, rdelta 0.1, 20 steps, squared
// error: the scale of a sub-block (its codes in L) and minus its min in *the_min.
float FitScaleMin(const float* x, const float* weights, uint8_t* L, float* the_min) {
  constexpr int n = 32, nmax = 15, nstep = 20;
  constexpr float rmin = -1.0f, rdelta = 0.1f;
  float min = x[0], max = x[0];
  float sum_w = weights[0], sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += weights[i];
    sum_x += weights[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::memset(L, 0, n);
    *the_min = -min;
    return 0.0f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(NearestInt(iscale * (x[i] - min)), 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best += weights[i] * diff * diff;
  }
  uint8_t aux[n];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * (x[i] - min)), 0, nmax);
      aux[i] = static_cast<uint8_t>(l);
      sum_l += weights[i] * l;
      sum_l2 += weights[i] * l * l;
      sum_xl += weights[i] * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float err = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * aux[i] + this_min - x[i];
        err += weights[i] * diff * diff;
      }
      if (err < best) {
        std::memcpy(L, aux, n);
        best = err;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

}  // namespace

void QuantizeRowQ4_K(const float* src, void* dst, int64_t n) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / 256; ++b, src += 256, out += 144) {
    uint8_t L[256];
    float scales[8], mins[8], weights[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      const float* x = src + 32 * j;
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += x[l] * x[l];
      const float av_x = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[l]);
      scales[j] = FitScaleMin(x, weights, L + 32 * j, &mins[j]);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t* sc = out + 4;
    std::memset(sc, 0, 12);
    for (int j = 0; j < 8; ++j) {
      const int ls = std::min(63, NearestInt(inv_scale * scales[j]));
      const int lm = std::min(63, NearestInt(inv_min * mins[j]));
      if (j < 4) {
        sc[j] = static_cast<uint8_t>(ls);
        sc[j + 4] = static_cast<uint8_t>(lm);
      } else {
        sc[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
        sc[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
        sc[j] |= static_cast<uint8_t>((lm >> 4) << 6);
      }
    }
    const uint16_t d = F32ToF16(max_scale / 63.f), dmin = F32ToF16(max_min / 63.f);
    std::memcpy(out, &d, 2);
    std::memcpy(out + 2, &dmin, 2);
    // The codes again, against the scales as they were stored.
    for (int j = 0; j < 8; ++j) {
      int s, mn;
      KQuantScaleMin(j, sc, &s, &mn);
      const float dj = F16ToF32(d) * static_cast<float>(s);
      if (dj == 0) continue;
      const float dm = F16ToF32(dmin) * static_cast<float>(mn);
      for (int l = 0; l < 32; ++l) {
        L[32 * j + l] = static_cast<uint8_t>(std::clamp(NearestInt((src[32 * j + l] + dm) / dj), 0, 15));
      }
    }
    uint8_t* q = out + 16;
    for (int j = 0; j < 256; j += 64) {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
      q += 32;
    }
  }
}

void DequantizeBlock(GgmlType type, const uint8_t* b, float* out) {
  switch (type) {
    case GgmlType::kF32: std::memcpy(out, b, 4); return;
    case GgmlType::kF16: *out = F16ToF32(U16(b)); return;
    case GgmlType::kBF16: *out = Bf16ToF32(U16(b)); return;
    case GgmlType::kQ8_0: return Q8_0(b, out);
    case GgmlType::kQ4_0: return Q4_0(b, out);
    case GgmlType::kQ4_K: return Q45K(b, nullptr, b + 16, out);
    case GgmlType::kQ5_K: return Q45K(b, b + 16, b + 48, out);
    case GgmlType::kQ6_K: return Q6K(b, out);
  }
}

void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n) {
  const int64_t qk = GgmlBlockElements(type), bytes = GgmlBlockBytes(type);
  const uint8_t* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n / qk; ++i) DequantizeBlock(type, p + i * bytes, dst + i * qk);
}

void QuantizeRowQ8_0(const float* src, void* dst, int64_t n) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / 32; ++i, src += 32, out += 34) {
    float amax = 0;
    for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(src[l]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    const uint16_t h = F32ToF16(d);
    std::memcpy(out, &h, 2);
    for (int l = 0; l < 32; ++l) {
      // Two roundings, as llama.cpp's: the product to float, then roundf (halves away from 0).
      const float scaled = src[l] * id;
      out[2 + l] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(scaled)));
    }
  }
}

}  // namespace pdserve::kernels
