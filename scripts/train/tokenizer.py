"""Byte-level BPE for afd's trained tiny models: training, the Hugging Face files, encoding.

Layout of the vocabulary (vocab_size V): ids 0..255 the 256 byte tokens (GPT-2's byte-to-
unicode alphabet), then the merges in the order learned, then the six special tokens at
V-6..V-1. The pre-tokenizer is the one afd's own generated tokenizers use (Qwen2's split
regex, Isolated, then ByteLevel without its own regex); the training text is ASCII only, so
Python's ASCII character classes below split it exactly as \\p{L} / \\p{N} do.
"""

import json
import re

SPECIALS = ("<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>", "<|system|>", "<|pad|>")

# Qwen2's split pattern (the tokenizer.json text) and its ASCII equivalent for Python's re.
SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLIT_ASCII = re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*"
                          r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CHAT_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if tools %}{{- '<|system|>To call a function, answer with <tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call>. The functions:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + tool | tojson }}{%- endfor %}{{- '\\n</tools>' }}{%- endif %}\n"
    "{%- for message in messages %}\n"
    "{%- if message.content is string %}{%- set content = message.content %}\n"
    "{%- else %}{%- set ns = namespace(text='') %}\n"
    "{%- for part in message.content %}{%- if part.type == 'text' %}"
    "{%- set ns.text = ns.text + part.text %}{%- endif %}{%- endfor %}\n"
    "{%- set content = ns.text %}{%- endif %}\n"
    "{%- if message.role == 'system' %}{{- '<|system|>' + content | trim }}\n"
    "{%- elif message.role == 'user' %}{{- '<|user|>' + content | trim }}\n"
    "{%- elif message.role == 'assistant' %}{{- '<|assistant|>' + content | trim }}\n"
    "{%- if message.tool_calls %}{%- for call in message.tool_calls %}"
    "{%- set args = call.function.arguments %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' + "
    "(args if args is string else args | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}{%- endif %}{{- '<|eos|>' }}\n"
    "{%- elif message.role == 'tool' %}{{- '<|user|><tool_response>\\n' + content | trim + "
    "'\\n</tool_response>' }}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}\n")


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def split_pieces(text):
    return _SPLIT_ASCII.findall(text)


def train_bpe(texts, vocab_size):
    """-> list of merges (a, b) as byte-level strings; deterministic for the same texts."""
    n_merges = vocab_size - 256 - len(SPECIALS)
    b2u = bytes_to_unicode()
    counts = {}
    for t in texts:
        for p in split_pieces(t):
            counts[p] = counts.get(p, 0) + 1
    words = [[b2u[b] for b in w.encode()] for w in counts]
    freq = list(counts.values())
    pairs, where = {}, {}
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] = pairs.get((a, b), 0) + freq[i]
            where.setdefault((a, b), set()).add(i)
    merges = []
    for _ in range(n_merges):
        if not pairs:
            raise ValueError("corpus too small for the vocabulary size")
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]  # ties: the larger pair string
        merges.append(best)
        a, b = best
        ab = a + b
        for i in where.pop(best, ()):
            w, f = words[i], freq[i]
            for x, y in zip(w, w[1:]):  # remove the word's old pairs
                pairs[(x, y)] -= f
                if pairs[(x, y)] == 0:
                    del pairs[(x, y)]
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(ab)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for x, y in zip(out, out[1:]):
                pairs[(x, y)] = pairs.get((x, y), 0) + f
                where.setdefault((x, y), set()).add(i)
        pairs.pop(best, None)
    return merges


class Tokenizer:
    def __init__(self, merges, vocab_size):
        self.vocab_size = vocab_size
        self.b2u = bytes_to_unicode()
        u2b = {u: b for b, u in self.b2u.items()}
        self.tokens = [self.b2u[b] for b in range(256)] + [a + b for a, b in merges]
        assert len(self.tokens) == vocab_size - len(SPECIALS), (len(self.tokens), vocab_size)
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.ranks = {m: r for r, m in enumerate(merges)}
        self.merges = merges
        self.special = {s: vocab_size - len(SPECIALS) + k for k, s in enumerate(SPECIALS)}
        self.bytes_of = [bytes(u2b[c] for c in t) for t in self.tokens]
        self._cache = {}

    def _bpe(self, piece):
        ids = self._cache.get(piece)
        if ids is not None:
            return ids
        w = [self.b2u[b] for b in piece.encode()]
        while len(w) > 1:
            best, br = None, None
            for k in range(len(w) - 1):
                r = self.ranks.get((w[k], w[k + 1]))
                if r is not None and (br is None or r < br):
                    best, br = k, r
            if best is None:
                break
            w = w[:best] + [w[best] + w[best + 1]] + w[best + 2:]
        ids = [self.ids[t] for t in w]
        self._cache[piece] = ids
        return ids

    def encode(self, text):
        """Plain text (no special-token parsing) -> ids."""
        out = []
        for p in split_pieces(text):
            out.extend(self._bpe(p))
        return out

    def encode_chat(self, user, assistant):
        """The chat template's rendering of one user turn and the assistant's answer."""
        s = self.special
        return ([s["<|bos|>"], s["<|user|>"]] + self.encode(user.strip()) + [s["<|assistant|>"]] +
                self.encode(assistant.strip()) + [s["<|eos|>"]])

    def decode(self, ids):
        inv = {v: k for k, v in self.special.items()}
        out = b""
        for i in ids:
            out += inv[i].encode() if i in inv else self.bytes_of[i]
        return out.decode("utf-8", errors="replace")

    @property
    def bos(self):
        return self.special["<|bos|>"]

    @property
    def eos(self):
        return self.special["<|eos|>"]

    def write(self, out_dir, model_max_length):
        added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": True} for s, i in self.special.items()]
        tj = {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": SPLIT_REGEX}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False,
                      "vocab": {t: i for i, t in enumerate(self.tokens)},
                      "merges": [a + " " + b for a, b in self.merges]},
        }
        dec = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": True} for s, i in self.special.items()}
        cfg = {
            "add_bos_token": True, "add_eos_token": False, "add_prefix_space": False,
            "added_tokens_decoder": dec,
            "additional_special_tokens": ["<|user|>", "<|assistant|>", "<|system|>"],
            "bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>", "unk_token": None,
            "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
            "model_max_length": model_max_length, "split_special_tokens": False,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
        with open(f"{out_dir}/tokenizer.json", "w") as f:
            json.dump(tj, f, indent=1, ensure_ascii=False)
            f.write("\n")
        with open(f"{out_dir}/tokenizer_config.json", "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")

    @staticmethod
    def read(model_dir):
        with open(f"{model_dir}/tokenizer.json") as f:
            tj = json.load(f)
        merges = [tuple(m.split(" ")) for m in tj["model"]["merges"]]
        return Tokenizer(merges, len(tj["model"]["vocab"]) + len(tj["added_tokens"]))
