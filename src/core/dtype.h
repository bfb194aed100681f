// Element types and scalar conversions: bf16, fp16, fp8 e4m3 (OCP "e4m3fn": no inf,
// NaN = 0x7f/0xff, max finite 448). Vectorised conversions live in kernels/.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace afd {

enum class DType : uint8_t { f32, f16, bf16, f8_e4m3, i32, i64, u8 };

// Bytes per element.
size_t dtype_size(DType t);
// Safetensors/HF spelling: "F32", "F16", "BF16", "F8_E4M3", "I32", "I64", "U8".
const char* dtype_name(DType t);
// Parses the safetensors spelling; returns false for an unknown name.
bool dtype_from_name(std::string_view name, DType* out);

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

struct bf16 {
  uint16_t bits = 0;
};

// Round to nearest even; NaN stays NaN.
inline bf16 f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}
inline float bf16_to_f32(bf16 h) { return f32_from_bits(static_cast<uint32_t>(h.bits) << 16); }
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }
// Rounds a float through bf16 and back.
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// IEEE half. Exact for every half value.
float f16_to_f32(uint16_t h);
// Round to nearest even, overflow to inf.
uint16_t f32_to_f16(float f);

// FP8 e4m3fn.
constexpr float kFp8E4M3Max = 448.0f;
// Round to nearest even; saturates to +-448 (the AFD dispatch path scales first, so
// saturation only clips outliers); NaN -> 0x7f with the sign.
inline uint8_t f32_to_fp8_e4m3(float f) {
  uint32_t u = f32_bits(f);
  uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;
  float af = f32_from_bits(a);
  if (af >= 448.0f) return sign | 0x7e;
  if (af < 0.015625f) {  // below 2^-6: subnormal grid of 2^-9
    int m = static_cast<int>(std::nearbyint(af * 512.0f));  // 0..8; 8 encodes 2^-6 exactly
    return sign | static_cast<uint8_t>(m);
  }
  a += 0x7ffffu + ((a >> 20) & 1u);  // round mantissa to 3 bits, nearest even
  int exp = static_cast<int>(a >> 23) - 127 + 7;
  uint32_t mant = (a >> 20) & 7u;
  if (exp > 15 || (exp == 15 && mant == 7)) return sign | 0x7e;
  return sign | static_cast<uint8_t>((exp << 3) | mant);
}
float fp8_e4m3_to_f32(uint8_t v);

}  // namespace afd
