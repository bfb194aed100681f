#!/usr/bin/python3
"""Structured outputs' cost in serving: C concurrent `json_schema` requests against C free-text
requests of the same lengths, on one running `afd serve`.

Each round runs both phases (their order alternates between rounds):
  schema: C chat requests at temperature 1 (seeds differ) with response_format json_schema;
          each answer is checked to parse and validate (a few hand checks of the schema below);
  text:   the same C prompts without a constraint, each with max_tokens = the token count its
          schema twin produced and ignore_eos, so both phases decode the same number of tokens.
Output tokens/s of a phase = its completion tokens / its wall time (first send to last answer).
Prints per-round rows and the median and p90 of the ratio schema / text as a table and JSON.

Usage: bench/structured_throughput.py --url http://127.0.0.1:8000 [--clients 64] [--rounds 5]
       [--max-tokens 256]
"""
import argparse
import concurrent.futures
import json
import statistics
import time
import urllib.request

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "maxLength": 24},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4},
        "active": {"type": "boolean"},
        "score": {"type": "number", "minimum": 0, "maximum": 100},
    },
    "required": ["name", "age", "email", "tags", "active", "score"],
    "additionalProperties": False,
}


def post(url, body):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.loads(r.read())


def check(answer):
    v = json.loads(answer)
    assert set(v) == set(SCHEMA["properties"]), answer
    assert isinstance(v["name"], str) and 1 <= len(v["name"]) <= 12, answer
    assert isinstance(v["age"], int) and 0 <= v["age"] <= 120, answer
    assert all(t in ("red", "green", "blue") for t in v["tags"]) and len(v["tags"]) <= 4, answer
    assert isinstance(v["active"], bool) and 0 <= v["score"] <= 100, answer


def phase(url, bodies):
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as ex:
        answers = list(ex.map(lambda b: post(url, b), bodies))
    return answers, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=256)
    a = ap.parse_args()
    model = json.loads(urllib.request.urlopen(a.url + "/v1/models").read())["data"][0]["id"]
    rows = []
    for r in range(a.rounds):
        prompts = [f"Describe person number {i} of round {r}." for i in range(a.clients)]
        schema_bodies = [{"model": model, "messages": [{"role": "user", "content": p}], "max_tokens": a.max_tokens,
                          "temperature": 1.0, "seed": 1000 * r + i,
                          "response_format": {"type": "json_schema",
                                              "json_schema": {"name": "person", "schema": SCHEMA}}}
                         for i, p in enumerate(prompts)]

        def run_schema():
            ans, t = phase(a.url, schema_bodies)
            for x in ans:
                assert x["choices"][0]["finish_reason"] == "stop", x
                check(x["choices"][0]["message"]["content"])
            return ans, t

        def run_text(lengths):
            bodies = [{"model": model, "messages": [{"role": "user", "content": p}], "max_tokens": n,
                       "temperature": 1.0, "seed": 1000 * r + i, "ignore_eos": True}
                      for i, (p, n) in enumerate(zip(prompts, lengths))]
            return phase(a.url, bodies)

        if r % 2 == 0:
            s_ans, s_t = run_schema()
            lengths = [x["usage"]["completion_tokens"] for x in s_ans]
            t_ans, t_t = run_text(lengths)
        else:
            # The text phase needs the lengths: a warm-up schema phase gives them, then text, then schema.
            lengths = [x["usage"]["completion_tokens"] for x in phase(a.url, schema_bodies)[0]]
            t_ans, t_t = run_text(lengths)
            s_ans, s_t = run_schema()
        n_s = sum(x["usage"]["completion_tokens"] for x in s_ans)
        n_t = sum(x["usage"]["completion_tokens"] for x in t_ans)
        row = {"round": r, "schema_tokens": n_s, "schema_s": s_t, "schema_tok_s": n_s / s_t,
               "text_tokens": n_t, "text_s": t_t, "text_tok_s": n_t / t_t, "ratio": (n_s / s_t) / (n_t / t_t)}
        rows.append(row)
        print(f"round {r}: schema {n_s} tok in {s_t:.2f} s ({n_s / s_t:.1f} tok/s), text {n_t} tok in {t_t:.2f} s "
              f"({n_t / t_t:.1f} tok/s), ratio {row['ratio']:.3f}", flush=True)
    ratios = sorted(x["ratio"] for x in rows)
    # The ratio 90% of rounds reach (the low side is the one users feel).
    low_p90 = ratios[int(0.1 * len(ratios))]
    print("\n| clients | rounds | schema tok/s (median) | text tok/s (median) | ratio median | ratio p90 (low side) |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {a.clients} | {a.rounds} | {statistics.median(x['schema_tok_s'] for x in rows):.1f} | "
          f"{statistics.median(x['text_tok_s'] for x in rows):.1f} | {statistics.median(ratios):.3f} | {low_p90:.3f} |")
    print(json.dumps({"rows": rows, "ratio_median": statistics.median(ratios), "ratio_p90_low": low_p90}))


if __name__ == "__main__":
    main()
