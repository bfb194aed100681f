#include "model/safetensors.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/cpu_features.h"

namespace afd {

using json = nlohmann::json;

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // checked for overflow by the parser
  return n;
}

namespace {

Status bad(const std::string& source, const std::string& what) { return corrupt_data(source + ": " + what); }

// A JSON number that is a non-negative integer fitting in uint64.
bool as_u64(const json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

Status parse_tensor(const std::string& source, const std::string& name, const json& e, uint64_t data_size,
                    SafetensorsTensor* t) {
  const std::string where = "tensor '" + name + "'";
  if (!e.is_object()) return bad(source, where + ": header entry is not an object");
  t->name = name;

  auto it = e.find("dtype");
  if (it == e.end() || !it->is_string()) return bad(source, where + ": missing or non-string 'dtype'");
  const auto& dt = it->get_ref<const std::string&>();
  if (!dtype_from_name(dt, &t->dtype)) {
    return not_supported(source + ": " + where + ": unknown dtype '" + dt +
                         "' (supported: F32, F16, BF16, F8_E4M3, I32, I64, U8)");
  }

  it = e.find("shape");
  if (it == e.end() || !it->is_array()) return bad(source, where + ": missing or non-array 'shape'");
  if (it->size() > 8) return bad(source, where + ": shape has " + std::to_string(it->size()) + " dimensions (max 8)");
  const std::string shape_text = it->dump();
  uint64_t numel = 1;
  for (const json& d : *it) {
    uint64_t v = 0;
    if (!as_u64(d, &v) || v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return bad(source, where + ": shape entry " + d.dump() + " is not a non-negative integer");
    }
    t->shape.push_back(static_cast<int64_t>(v));
    if (__builtin_mul_overflow(numel, v, &numel) || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return bad(source, where + ": shape " + shape_text + " overflows the element count");
    }
  }

  it = e.find("data_offsets");
  if (it == e.end() || !it->is_array() || it->size() != 2) {
    return bad(source, where + ": missing 'data_offsets' or not a [begin, end] pair");
  }
  if (!as_u64((*it)[0], &t->begin) || !as_u64((*it)[1], &t->end)) {
    return bad(source, where + ": data_offsets " + it->dump() + " are not non-negative integers");
  }
  if (t->begin > t->end) return bad(source, where + ": data_offsets " + it->dump() + " have begin > end");
  if (t->end > data_size) {
    return bad(source, where + ": data_offsets " + it->dump() + " run past the end of the data section (" +
                           std::to_string(data_size) + " bytes; file truncated?)");
  }
  uint64_t expect = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t->dtype)), &expect) ||
      expect != t->end - t->begin) {
    return bad(source, where + ": data_offsets " + it->dump() + " span " + std::to_string(t->end - t->begin) +
                           " bytes but dtype " + dt + " x shape " + shape_text + " needs " +
                           std::to_string(numel) + " x " + std::to_string(dtype_size(t->dtype)) + " bytes");
  }
  return Status();
}

}  // namespace

Result<SafetensorsHeader> parse_safetensors(std::span<const uint8_t> bytes, const std::string& source) {
  SafetensorsHeader h;
  if (bytes.size() < 8) {
    return bad(source, "file is " + std::to_string(bytes.size()) + " bytes, too short for the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<size_t>(i)];
  if (n > kSafetensorsMaxHeaderLen) {
    return bad(source, "header length " + std::to_string(n) + " exceeds the " +
                           std::to_string(kSafetensorsMaxHeaderLen) + "-byte limit");
  }
  if (n > bytes.size() - 8) {
    return bad(source, "header length " + std::to_string(n) + " runs past the end of the file (" +
                           std::to_string(bytes.size()) + " bytes; truncated?)");
  }
  if (n < 2) return bad(source, "header length " + std::to_string(n) + " is too short for a JSON object");
  h.header_len = n;
  h.data_offset = 8 + n;
  h.data_size = bytes.size() - h.data_offset;

  const char* text = reinterpret_cast<const char*>(bytes.data() + 8);
  // Duplicate top-level keys would silently shadow each other in the DOM; catch them here.
  std::set<std::string> keys;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth == 1 && ev == json::parse_event_t::key && parsed.is_string()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!keys.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  json root = json::parse(text, text + n, cb, /*allow_exceptions=*/false);
  if (root.is_discarded()) return bad(source, "header (" + std::to_string(n) + " bytes) is not valid JSON");
  if (!root.is_object()) return bad(source, "header is JSON but not an object");
  if (!duplicate.empty()) return bad(source, "header names '" + duplicate + "' twice");

  h.tensors.reserve(root.size());
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return bad(source, "'__metadata__' is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) return bad(source, "'__metadata__' value for '" + m.key() + "' is not a string");
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    SafetensorsTensor t;
    AFD_RETURN_IF_ERROR(parse_tensor(source, it.key(), *it, h.data_size, &t));
    h.tensors.push_back(std::move(t));
  }

  // Overlap check over tensors sorted by their byte ranges (empty tensors overlap nothing).
  std::vector<const SafetensorsTensor*> by_offset;
  for (const auto& t : h.tensors) {
    if (t.end > t.begin) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto* a = by_offset[i - 1];
    const auto* b = by_offset[i];
    if (b->begin < a->end) {
      return bad(source, "tensors '" + a->name + "' [" + std::to_string(a->begin) + ", " + std::to_string(a->end) +
                             ") and '" + b->name + "' [" + std::to_string(b->begin) + ", " + std::to_string(b->end) +
                             ") overlap");
    }
  }
  return h;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  AFD_ASSIGN_OR_RETURN(f.file_, MappedFile::open(path));
  AFD_ASSIGN_OR_RETURN(f.header_, parse_safetensors(std::span<const uint8_t>(f.file_.data(), f.file_.size()), path));
  return f;
}

// F16C path for f16 tensors (exact, like the scalar conversion); chosen at run time.
__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(const uint8_t* src, size_t n, float* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = f16_to_f32(h);
  }
}

void tensor_to_f32(DType dt, const uint8_t* src, size_t n, float* dst) {
  switch (dt) {
    case DType::f32: std::memcpy(dst, src, n * 4); break;
    case DType::bf16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      break;
    case DType::f16:
      if (cpu_features().f16c) {
        f16_to_f32_f16c(src, n, dst);
        break;
      }
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
      break;
    default: break;
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string t = "[";
  for (size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + std::to_string(shape[i]);
  return t + "]";
}

}  // namespace afd
