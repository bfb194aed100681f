#include "serve/text/tokenizer_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <optional>

#include "serve/text/unicode.h"

namespace afd::serve {
namespace {

// Oniguruma's Unicode sets for the escapes PCRE2 reads differently.
// \s: White_Space (PCRE2's \s also takes U+180E).
constexpr std::string_view kSpace =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
// \w: Letter | Mark | Number | Connector_Punctuation (PCRE2's is Letter | Number | '_').
constexpr std::string_view kWord = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
// \h: a hexadecimal digit (PCRE2's \h is horizontal white space).
constexpr std::string_view kHex = "0-9A-Fa-f";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<const char*>(buf), n);
}

std::string shorten(std::string_view s) {
  return s.size() <= 120 ? std::string(s) : std::string(s.substr(0, 117)) + "...";
}

// One reusable match block per thread (one ovector pair is all find_all reads).
pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(md); }
  };
  thread_local Holder h;
  return h.md;
}

}  // namespace

Result<std::string> onig_to_pcre2(std::string_view p) {
  auto refuse = [&](const std::string& what) -> Status {
    return not_supported("regex '" + shorten(p) + "': " + what + " (Oniguruma and PCRE2 read it differently)");
  };
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  size_t class_body = 0;  // index of the first character of the current class body
  const size_t n = p.size();
  size_t i = 0;
  while (i < n) {
    char c = p[i];
    if (c == '\\' && i + 1 < n) {
      char d = p[i + 1];
      std::string_view set;
      bool negated = d == 'S' || d == 'W' || d == 'H';
      switch (d) {
        case 's': case 'S': set = kSpace; break;
        case 'w': case 'W': set = kWord; break;
        case 'h': case 'H': set = kHex; break;
        default: break;
      }
      if (d == 'Q') {  // \Q...\E: literal text, copied as is
        size_t end = p.find("\\E", i + 2);
        size_t stop = end == std::string_view::npos ? n : end + 2;
        out.append(p.substr(i, stop - i));
        i = stop;
        continue;
      }
      if (set.empty()) {
        out += c;
        out += d;
        i += 2;
        continue;
      }
      if (in_class) {
        if (negated) {
          if (d == 'S') {
            out += "\\S";  // differs from Oniguruma only at U+180E
          } else {
            return refuse(std::string("\\") + d + " inside a character class");
          }
        } else {
          out.append(set);
        }
      } else {
        out += negated ? "[^" : "[";
        out.append(set);
        out += ']';
      }
      i += 2;
      continue;
    }
    if (in_class) {
      if (c == '[') {
        if (i + 1 < n && p[i + 1] == ':') {  // POSIX [:name:]
          size_t end = p.find(":]", i + 2);
          if (end == std::string_view::npos) return refuse("unterminated POSIX class");
          out.append(p.substr(i, end + 2 - i));
          i = end + 2;
          continue;
        }
        return refuse("a nested character class");
      }
      if (c == '&' && i + 1 < n && p[i + 1] == '&') return refuse("character class intersection '&&'");
      if (c == ']' && i != class_body) in_class = false;
      out += c;
      ++i;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < n && p[i] == '^') {
        out += '^';
        ++i;
      }
      class_body = i;
      continue;
    }
    out += c;
    ++i;
  }
  return out;
}

Result<std::shared_ptr<const Regex>> Regex::compile(std::string_view pattern, bool literal) {
  std::shared_ptr<Regex> r(new Regex());
  r->source_ = std::string(pattern);
  if (literal) {
    if (pattern.empty()) return invalid_argument("an empty String pattern matches nothing useful");
    r->translated_ = r->source_;
  } else {
    AFD_ASSIGN_OR_RETURN(r->translated_, onig_to_pcre2(pattern));
  }
  if (utf8_invalid_offset(r->translated_) != std::string_view::npos)
    return invalid_argument("regex '" + shorten(pattern) + "' is not valid UTF-8");
  uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(r->translated_.data()), r->translated_.size(), opts,
                                   &err, &off, nullptr);
  if (!code)
    return invalid_argument("regex '" + shorten(pattern) + "' does not compile: " + pcre2_message(err) +
                            " at offset " + std::to_string(off) + " of '" + shorten(r->translated_) + "'");
  r->code_ = code;
  r->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  pcre2_match_context* mc = pcre2_match_context_create(nullptr);
  if (!mc) return resource_exhausted("regex: cannot allocate a PCRE2 match context");
  pcre2_set_match_limit(mc, kMatchLimit);
  pcre2_set_heap_limit(mc, kHeapLimitKiB);
  r->mctx_ = mc;
  return std::shared_ptr<const Regex>(std::move(r));
}

Regex::~Regex() {
  pcre2_match_context_free(static_cast<pcre2_match_context*>(mctx_));
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

Status Regex::match_error(int rc) const {
  if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT)
    return out_of_range("tokenizer regex '" + shorten(source_) + "' ran past its limit (" + pcre2_message(rc) +
                        "); the pattern backtracks catastrophically on this text");
  return internal_error("tokenizer regex '" + shorten(source_) + "': " + pcre2_message(rc));
}

namespace {

// One match attempt from start. The JIT fast path (pcre2_jit_match, which skips the
// argument and UTF checks; text is valid UTF-8 by contract) serves unanchored searches;
// a JIT stack overflow is retried in the interpreter, which has the heap limit.
int run_match(const pcre2_code* code, pcre2_match_context* mc, bool jit, std::string_view text, size_t start,
              uint32_t opts, pcre2_match_data* md) {
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = jit && opts == 0 ? pcre2_jit_match(code, subject, text.size(), start, 0, md, mc)
                            : pcre2_match(code, subject, text.size(), start, opts | PCRE2_NO_UTF_CHECK, md, mc);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
    rc = pcre2_match(code, subject, text.size(), start, opts | PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, mc);
  return rc;
}

}  // namespace

Status Regex::find_all(std::string_view text, std::vector<Span>* out) const {
  auto* code = static_cast<const pcre2_code*>(code_);
  auto* mc = static_cast<pcre2_match_context*>(mctx_);
  pcre2_match_data* md = thread_match_data();
  if (!md) return resource_exhausted("regex: cannot allocate PCRE2 match data");
  const size_t n = text.size();
  size_t start = 0;
  std::optional<size_t> last_end;
  while (start <= n) {
    int rc = run_match(code, mc, jit_, text, start, 0, md);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return match_error(rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t s = ov[0], e = ov[1];
    if (s == e && last_end && *last_end == e) {
      size_t len = 1;
      if (start < n) utf8_decode(text, start, &len);
      start += len;
      continue;
    }
    out->emplace_back(s, e);
    start = e;
    last_end = e;
  }
  return Status();
}

Result<bool> Regex::matches_at(std::string_view text, size_t pos) const {
  pcre2_match_data* md = thread_match_data();
  if (!md) return resource_exhausted("regex: cannot allocate PCRE2 match data");
  int rc = run_match(static_cast<const pcre2_code*>(code_), static_cast<pcre2_match_context*>(mctx_), jit_, text, pos,
                     PCRE2_ANCHORED, md);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) return match_error(rc);
  return true;
}

}  // namespace afd::serve
