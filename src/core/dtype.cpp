#include "core/dtype.h"

#include <array>

namespace afd {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f8_e4m3: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::f8_e4m3: return "F8_E4M3";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
  }
  return "?";
}

bool dtype_from_name(std::string_view n, DType* out) {
  static constexpr std::pair<std::string_view, DType> kNames[] = {
      {"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16}, {"F8_E4M3", DType::f8_e4m3},
      {"I32", DType::i32}, {"I64", DType::i64}, {"U8", DType::u8}};
  for (auto& [name, t] : kNames) {
    if (n == name) { *out = t; return true; }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;
  if (a >= 0x477ff000u) return sign | 0x7c00;  // rounds to >= 65520: inf
  float af = f32_from_bits(a);
  if (af < 6.103515625e-05f) {  // subnormal half: grid 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(af * 16777216.0f));
  }
  a += 0xfffu + ((a >> 13) & 1u);
  uint32_t exp = (a >> 23) - 112;
  return sign | static_cast<uint16_t>((exp << 10) | ((a >> 13) & 0x3ffu));
}

namespace {
std::array<float, 256> make_fp8_table() {
  std::array<float, 256> t{};
  for (int v = 0; v < 256; ++v) {
    int sign = v & 0x80, exp = (v >> 3) & 0xf, mant = v & 7;
    float x;
    if (exp == 15 && mant == 7) x = NAN;
    else if (exp == 0) x = std::ldexp(static_cast<float>(mant), -9);
    else x = std::ldexp(1.0f + mant / 8.0f, exp - 7);
    t[v] = sign ? -x : x;
  }
  return t;
}
const std::array<float, 256> kFp8Table = make_fp8_table();
}  // namespace

float fp8_e4m3_to_f32(uint8_t v) { return kFp8Table[v]; }

}  // namespace afd
