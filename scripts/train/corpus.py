"""English corpus from WordNet 3.0 (Debian's wordnet-base) for afd's trained tiny models.

Every synset of the four data files yields documents (separated by a blank line in the text
files, the separator `afd eval` uses by default):
  entry:    "harbor (noun): a sheltered port where ships can take on or discharge cargo.
             Example: the ship entered the harbor."
  sentence: each example sentence alone, capitalised, with a full stop.
  chat:     "<|user|>What does harbor mean?<|assistant|>A sheltered port ...<|eos|>" and
            "<|user|>Use harbor in a sentence.<|assistant|>The ship entered the harbor.<|eos|>"
            (the chat template's rendering, see tokenizer.py).

Held out: every synset whose first lemma's MD5 is 0 mod HOLDOUT_MOD; those synsets produce no
training document. The evaluation text is the held-out synsets' entry and sentence documents;
the chat prompts are held-out words. Only ASCII text is kept (a synset with a non-ASCII
character in its lemma or gloss is dropped), so the pre-tokenizer's \\p{L}/\\p{N} classes and
Python's ASCII classes agree.
"""

import hashlib
import os
import random
import re

WORDNET = "/usr/share/wordnet"
POS = (("noun", "noun"), ("verb", "verb"), ("adj", "adjective"), ("adv", "adverb"))
HOLDOUT_MOD = 25
DEFINE_QUESTIONS = ("What does {w} mean?", "What is the meaning of {w}?", "Define {w}.")
USE_QUESTION = "Use {w} in a sentence."


def _lemma(raw):
    w = re.sub(r"\([a-z]+\)$", "", raw)  # adjective markers: (a), (p), (ip)
    return w.replace("_", " ")


def _split_gloss(gloss):
    """-> (definition, [examples]). Examples are the double-quoted parts after the definition."""
    examples = re.findall(r'"([^"]+)"', gloss)
    definition = gloss.split('"')[0].strip().rstrip(";").strip()
    return definition, [e.strip() for e in examples if e.strip()]


def synsets():
    """Yields dicts {pos, words, definition, examples} in file order."""
    for fname, pos in POS:
        with open(os.path.join(WORDNET, "data." + fname), "rb") as f:
            for raw in f:
                if raw.startswith(b"  "):  # license header
                    continue
                try:
                    line = raw.decode("ascii")
                except UnicodeDecodeError:
                    continue
                head, _, gloss = line.partition("|")
                parts = head.split()
                n_words = int(parts[3], 16)
                words = [_lemma(parts[4 + 2 * i]) for i in range(n_words)]
                definition, examples = _split_gloss(gloss.strip())
                if not definition:
                    continue
                yield {"pos": pos, "words": words, "definition": definition, "examples": examples}


def held_out(s):
    h = hashlib.md5(s["words"][0].lower().encode()).digest()
    return int.from_bytes(h[:4], "little") % HOLDOUT_MOD == 0


def _sentence(text):
    text = text.strip()
    text = text[0].upper() + text[1:]
    return text if text[-1] in ".!?" else text + "."


def entry_doc(s):
    w = s["words"][0]
    doc = f"{w} ({s['pos']}): {s['definition']}."
    ex = [e for e in s["examples"] if w.lower() in e.lower()]
    if ex:
        doc += " Example: " + ex[0].rstrip(".") + "."
    return doc


def sentence_docs(s):
    return [_sentence(e) for e in s["examples"] if len(e.split()) >= 3]


def chat_pairs(s, rng):
    """[(user, assistant)] for a synset: one definition question per lemma (up to 2) and one
    example question when an example uses the word."""
    pairs = []
    for w in s["words"][:2]:
        q = rng.choice(DEFINE_QUESTIONS).format(w=w)
        pairs.append((q, _sentence(s["definition"])))
    w = s["words"][0]
    ex = [e for e in s["examples"] if re.search(r"\b" + re.escape(w) + r"\b", e, re.I)]
    if ex:
        pairs.append((USE_QUESTION.format(w=w), _sentence(ex[0])))
    return pairs


def build(seed=0):
    """-> dict with train documents (plain and chat pairs) and held-out documents."""
    rng = random.Random(seed)
    train_plain, train_chat, eval_docs, eval_words = [], [], [], []
    for s in synsets():
        if held_out(s):
            eval_docs.append(entry_doc(s))
            eval_docs.extend(sentence_docs(s))
            eval_words.append((s["words"][0], s["pos"], s["definition"]))
            continue
        train_plain.append(entry_doc(s))
        train_plain.extend(sentence_docs(s))
        train_chat.extend(chat_pairs(s, rng))
    return {"train_plain": train_plain, "train_chat": train_chat, "eval_docs": eval_docs,
            "eval_words": eval_words}


def chat_words(data, n=20, seed=7):
    """n distinct held-out common nouns (one lower-case word) for the chat check, sorted."""
    words = sorted({w for w, pos, _ in data["eval_words"] if pos == "noun" and w.isalpha() and w.islower()})
    random.Random(seed).shuffle(words)
    return sorted(words[:n])


if __name__ == "__main__":
    c = build()
    for k, v in c.items():
        print(k, len(v), v[:3])
