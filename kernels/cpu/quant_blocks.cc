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

// Q4_K/Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
void ScaleMin(int j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
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
    ScaleMin(2 * pair, scales, &sc, &mn);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
    ScaleMin(2 * pair + 1, scales, &sc, &mn);
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

}  // namespace

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
