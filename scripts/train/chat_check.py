"""Asks a running afd server the held-out chat questions and measures how English the answers are.

  /usr/bin/python3 scripts/train/chat_check.py --url http://127.0.0.1:8000 --words MODEL/chat_eval.json [--json OUT]

For each held-out word W (a word whose synsets were not trained on): POST /v1/chat/completions
with "What does W mean?", greedy (temperature 0), max_tokens 32. An answer word is a maximal
run of ASCII letters (with an inner apostrophe); it counts as English when its lower case is in
Debian's /usr/share/dict/words (package wamerican). Also asks /v1/completions to continue a few
sentence openings. Prints every answer and the share of English words.
"""

import argparse
import json
import re
import sys
import urllib.request

OPENINGS = ["The ship entered the", "She was known for her", "A large animal that", "He decided to",
            "The meaning of the word is"]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--words", required=True)
    ap.add_argument("--dict", default="/usr/share/dict/words")
    ap.add_argument("--json")
    a = ap.parse_args()
    english = {w.strip().lower() for w in open(a.dict, encoding="utf-8", errors="ignore")}
    spec = json.load(open(a.words))
    rows, n_words, n_english = [], 0, 0
    for w in spec["words"]:
        q = spec["question"].format(w=w)
        r = post(a.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": q}], "max_tokens": 32,
                                                   "temperature": 0})
        text = r["choices"][0]["message"]["content"]
        ws = re.findall(r"[A-Za-z]+(?:'[A-Za-z]+)?", text)
        ok = [x for x in ws if x.lower() in english]
        n_words += len(ws)
        n_english += len(ok)
        rows.append({"question": q, "answer": text, "words": len(ws), "english": len(ok)})
        print(f"{q}\n  -> {text}")
    cont = []
    for o in OPENINGS:
        r = post(a.url + "/v1/completions", {"prompt": o, "max_tokens": 24, "temperature": 0})
        cont.append({"prompt": o, "completion": r["choices"][0]["text"]})
        print(f"{o} ... {r['choices'][0]['text']}")
    share = n_english / max(n_words, 1)
    print(f"english words: {n_english} of {n_words} = {share:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"english_share": share, "words": n_words, "english": n_english, "chat": rows,
                       "continuations": cont}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
