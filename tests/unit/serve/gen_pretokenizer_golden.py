#!/usr/bin/python3
# Golden pre-tokenizer splits from real tokenizers' regular expressions, produced by
# python3-regex (which supports \p{L} / \p{N} and Unicode \s like the Oniguruma engine of
# HF tokenizers). afd runs the same patterns with PCRE2 (src/serve/text/tokenizer_regex.cpp)
# and is checked against this file.
# Run: /usr/bin/python3 tests/unit/serve/gen_pretokenizer_golden.py > tests/unit/serve/data/pretokenizer_golden.json
import json
import regex

PATTERNS = {
    "gpt2": r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    # DeepSeek-V3's third Split (after \p{N}{1,3} and a CJK run split).
    "deepseek_v3": r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    # GPT-4o (o200k).
    "o200k": r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}

TEXTS = [
    "Hello world",
    "I'm sure they'll say it's fine, WE'LL SEE. Don't.",
    "The year 2024 had 366 days; pi ~ 3.14159.",
    "  leading and trailing spaces   ",
    "line one\nline two\r\n\r\nline   three\n\n\n  indented",
    "tabs\tand\t\tmore\t",
    "héllo wörld, ça va? Straße",
    "你好世界，今天天气很好。",
    "emoji 👋🏽 and 🎉🎉!",
    "...!!! ?!?  --> <|im_end|>",
    "def f(x):\n    return x**2  # square\n",
    "हिन्दी भाषा",
    "مرحبا بالعالم",
    "subscript ₂ roman Ⅻ fraction ½",
    "nbsp\u00a0here and ideographic\u3000space",
    "'s 'S 'quote' 'll 'LL '",
    "a\n\n\nb  \n c \r\n",
    "12345678901 x1y22z333",
    " ",
    "\n",
    "mixed123abc 4five",
    "email: someone@example.com, url: https://x.y/z?q=1&r=2",
    "   \n",
    "x  \n y",
    "next\u0085line, mongolian\u180eseparator, zero\u200bwidth",
    "long s: it\u017fs \u212a'S 'K HE'\u017ft",
    "CamelCaseWords and ALLCAPS'S with marks: nai\u0308ve e\u0301te\u0301",
    "#include <vector> -- x->y a/b/c\r\n",
]


def isolated(pattern, text):
    """HF Split with behavior Isolated: the matches and the gaps between them, in order."""
    pieces, prev = [], 0
    for m in regex.finditer(pattern, text):
        pieces += [text[prev:m.start()], m.group()]
        prev = m.end()
    pieces.append(text[prev:])
    return [p for p in pieces if p]


out = {"patterns": PATTERNS, "cases": []}
for t in TEXTS:
    case = {"text": t}
    for name, p in PATTERNS.items():
        case[name] = isolated(p, t)
        assert "".join(case[name]) == t, (name, t)
    out["cases"].append(case)
print(json.dumps(out, ensure_ascii=False, indent=1))
