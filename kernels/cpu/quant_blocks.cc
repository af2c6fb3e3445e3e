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

void Q32(GgmlType type, const uint8_t* b, float* out) {
  const float d = F16ToF32(U16(b));
  int8_t q[32];
  BlockCodes32(type, b, q);
  for (int l = 0; l < 32; ++l) out[l] = d * static_cast<float>(q[l]);
}

// Q4_K and Q5_K: sub-block s of 32 is fma(d * scale_s, code, -(dmin * min_s)).
void Q45K(GgmlType type, const uint8_t* b, float* out) {
  const float d = F16ToF32(U16(b)), dmin = F16ToF32(U16(b + 2));
  uint8_t q[256];
  BlockCodesK(type, b, q);
  for (int s = 0; s < 8; ++s) {
    int sc, mn;
    KQuantScaleMin(s, b + 4, &sc, &mn);
    const float ds = d * static_cast<float>(sc), ms = dmin * static_cast<float>(mn);
    for (int l = 0; l < 32; ++l) out[32 * s + l] = std::fma(ds, static_cast<float>(q[32 * s + l]), -ms);
  }
}

// Q6_K: element e is (d * scale[e / 16]) * (code - 32).
void Q6K(const uint8_t* b, float* out) {
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = F16ToF32(U16(b + 208));
  uint8_t q[256];
  BlockCodesK(GgmlType::kQ6_K, b, q);
  for (int e = 0; e < 256; ++e) {
    out[e] = (d * static_cast<float>(sc[e / 16])) * static_cast<float>(q[e] - 32);
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

// llama.cpp's make_qx_quants for rmse_type 1 (weights x^2), no importance matrix: symmetric
// codes in [-nmax, nmax - 1] stored as code + nmax in L, the scale from a weighted least-squares
// fit over 19 grids around nmax / max (the largest |x| keeping its sign). n <= 32.
float FitSymmetricScale(int n, int nmax, const float* x, uint8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < 1e-15f) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  auto fit = [&](float iscale, float* sum_lx, float* sum_l2, uint8_t* codes) {
    *sum_lx = 0;
    *sum_l2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1);
      if (codes != nullptr) codes[i] = static_cast<uint8_t>(l + nmax);
      const float w = x[i] * x[i];
      *sum_lx += w * x[i] * static_cast<float>(l);
      *sum_l2 += w * static_cast<float>(l) * static_cast<float>(l);  // (w * l) * l, as llama.cpp's.
    }
  };
  float sum_lx, sum_l2;
  fit(-static_cast<float>(nmax) / max, &sum_lx, &sum_l2, L);
  float scale = sum_l2 != 0 ? sum_lx / sum_l2 : 0.0f;
  float best = scale * sum_lx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    const float iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    fit(iscale, &sum_lx, &sum_l2, nullptr);
    if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
      fit(iscale, &sum_lx, &sum_l2, L);
      scale = sum_lx / sum_l2;
      best = scale * sum_lx;
    }
  }
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

void BlockCodes32(GgmlType type, const uint8_t* b, int8_t* q) {
  if (type == GgmlType::kQ8_0) {
    std::memcpy(q, b + 2, 32);
    return;
  }
  if (type == GgmlType::kQ5_0) {  // As Q4_0, with bit l of qh the fifth bit of element l.
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    for (int l = 0; l < 16; ++l) {
      const int lo = (b[6 + l] & 0xF) | (((qh >> l) & 1) << 4);
      const int hi = (b[6 + l] >> 4) | (((qh >> (l + 16)) & 1) << 4);
      q[l] = static_cast<int8_t>(lo - 16);
      q[l + 16] = static_cast<int8_t>(hi - 16);
    }
    return;
  }
  for (int l = 0; l < 16; ++l) {  // Q4_0: low nibbles are elements 0..15, high 16..31.
    q[l] = static_cast<int8_t>((b[2 + l] & 0xF) - 8);
    q[l + 16] = static_cast<int8_t>((b[2 + l] >> 4) - 8);
  }
}

void BlockCodesK(GgmlType type, const uint8_t* b, uint8_t* q) {
  if (type == GgmlType::kQ6_K) {
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b + 64 * h;
      const uint8_t* qh = b + 128 + 32 * h;
      uint8_t* o = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        o[l] = static_cast<uint8_t>((ql[l] & 0xF) | ((qh[l] & 3) << 4));
        o[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
        o[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
        o[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
      }
    }
    return;
  }
  const bool fifth = type == GgmlType::kQ5_K;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = fifth ? b + 48 : b + 16;
  for (int p = 0; p < 4; ++p) {
    for (int l = 0; l < 32; ++l) {
      int lo = qs[32 * p + l] & 0xF, hi = qs[32 * p + l] >> 4;
      if (fifth) {
        lo |= ((qh[l] >> (2 * p)) & 1) << 4;
        hi |= ((qh[l] >> (2 * p + 1)) & 1) << 4;
      }
      q[64 * p + l] = static_cast<uint8_t>(lo);
      q[64 * p + 32 + l] = static_cast<uint8_t>(hi);
    }
  }
}

void DequantizeBlock(GgmlType type, const uint8_t* b, float* out) {
  switch (type) {
    case GgmlType::kF32: std::memcpy(out, b, 4); return;
    case GgmlType::kF16: *out = F16ToF32(U16(b)); return;
    case GgmlType::kBF16: *out = Bf16ToF32(U16(b)); return;
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0: return Q32(type, b, out);
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: return Q45K(type, b, out);
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
      // Clamped before the conversion: the same codes for finite x (|x / d| <= 127 then), and
      // defined for a subnormal block's infinite 1 / d or a NaN weight.
      const float scaled = std::min(127.0f, std::max(-127.0f, src[l] * id));
      out[2 + l] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(scaled)));
    }
  }
}

void QuantizeRowQ5_0(const float* src, void* dst, int64_t n) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / 32; ++i, src += 32, out += 22) {
    float amax = 0, max = 0;  // The element of largest magnitude, with its sign (the first).
    for (int l = 0; l < 32; ++l) {
      if (amax < std::fabs(src[l])) {
        amax = std::fabs(src[l]);
        max = src[l];
      }
    }
    const float d = max / -16;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    const uint16_t h = F32ToF16(d);
    std::memcpy(out, &h, 2);
    uint32_t qh = 0;
    for (int l = 0; l < 16; ++l) {
      // Two roundings, as llama.cpp's: the product to float, then + 16.5 truncated to 0..31.
      // Clamped before the conversion (the same codes for finite x; a subnormal d's infinite
      // 1 / d or a NaN weight would otherwise make it undefined).
      auto code = [](float v) {
        return static_cast<int>(std::min(31.0f, std::max(0.0f, v + 16.5f)));
      };
      const int c0 = code(src[l] * id), c1 = code(src[16 + l] * id);
      out[6 + l] = static_cast<uint8_t>((c0 & 0xF) | ((c1 & 0xF) << 4));
      qh |= static_cast<uint32_t>((c0 >> 4) & 1) << l;
      qh |= static_cast<uint32_t>((c1 >> 4) & 1) << (l + 16);
    }
    std::memcpy(out + 2, &qh, 4);
  }
}

bool EncodeRow(GgmlType type, const float* src, void* dst, int64_t n) {
  switch (type) {
    case GgmlType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return true;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = type == GgmlType::kF16 ? F32ToF16(src[i]) : F32ToBf16(src[i]);
        std::memcpy(static_cast<uint8_t*>(dst) + 2 * i, &h, 2);
      }
      return true;
    case GgmlType::kQ8_0: QuantizeRowQ8_0(src, dst, n); return true;
    case GgmlType::kQ5_0: QuantizeRowQ5_0(src, dst, n); return true;
    case GgmlType::kQ4_K: QuantizeRowQ4_K(src, dst, n); return true;
    case GgmlType::kQ6_K: QuantizeRowQ6_K(src, dst, n); return true;
    default: return false;
  }
}

void QuantizeRowQ6_K(const float* src, void* dst, int64_t n) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / 256; ++b, src += 256, out += 210) {
    uint8_t L[256];
    float scales[16];
    float max_scale = 0, max_abs = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = FitSymmetricScale(16, 32, src + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > max_abs) {
        max_abs = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    std::memset(out, 0, 210);
    if (max_abs < 1e-15f) continue;  // d = 0 (f16 zero), every code and scale zero.
    // The 16 scales as int8 against the block's d (the largest keeps its sign as -128).
    const float iscale = -128.0f / max_scale;
    const uint16_t dh = F32ToF16(1 / iscale);
    std::memcpy(out + 208, &dh, 2);
    const float d = F16ToF32(dh);
    int8_t* sc = reinterpret_cast<int8_t*>(out + 192);
    for (int j = 0; j < 16; ++j) {
      sc[j] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scales[j])));
      const float dj = d * static_cast<float>(sc[j]);
      if (dj == 0) continue;
      for (int i = 0; i < 16; ++i) {
        L[16 * j + i] = static_cast<uint8_t>(std::clamp(NearestInt(src[16 * j + i] / dj), -32, 31) + 32);
      }
    }
    // Pack: per half of 128, low nibbles of elements l and l+64 in ql[l], of l+32 and l+96 in
    // ql[l+32]; the two high bits of l, l+32, l+64, l+96 in qh[l] (bits 0-1, 2-3, 4-5, 6-7).
    for (int h = 0; h < 2; ++h) {
      const uint8_t* q = L + 128 * h;
      uint8_t* ql = out + 64 * h;
      uint8_t* qh = out + 128 + 32 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((q[l] & 0xF) | ((q[l + 64] & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((q[l + 32] & 0xF) | ((q[l + 96] & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((q[l] >> 4) | ((q[l + 32] >> 4) << 2) | ((q[l + 64] >> 4) << 4) |
                                     ((q[l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace pdserve::kernels
