// Bounded load test of `afd serve`: C concurrent streaming clients for D seconds on
// loopback. Each client loops: a streaming request (chat or completion, alternating) with
// logprobs and stream_options.include_usage, checked strictly:
//   HTTP 200, every chunk parses, exactly one finish_reason, a usage chunk, `data: [DONE]`
//   last, and the number of streamed tokens (logprobs entries) == usage.completion_tokens.
// Prints TTFT / TPOT percentiles (client-side), throughput and failures as JSON and a table.
// Usage: node bench/load_test.mjs --url http://127.0.0.1:8000 [--clients 128] [--seconds 60]
//        [--max-tokens 32] [--model NAME] [--api-key K]
// Exit status 1 if any request failed or was truncated.
const args = Object.fromEntries(
  process.argv.slice(2).reduce((a, x, i, all) => (x.startsWith("--") ? [...a, [x.slice(2), all[i + 1]]] : a), []));
const url = args.url ?? "http://127.0.0.1:8000";
const clients = Number(args.clients ?? 128);
const seconds = Number(args.seconds ?? 60);
const maxTokens = Number(args["max-tokens"] ?? 32);
const headers = { "Content-Type": "application/json" };
if (args["api-key"]) headers.Authorization = `Bearer ${args["api-key"]}`;

const model = args.model ?? (await (await fetch(`${url}/v1/models`, { headers })).json()).data[0].id;
const prompts = [
  "Write a short story about a robot who learns to paint.",
  "Explain how a paged KV cache works.",
  "List three facts about the sea.",
  "What is the time per output token?",
];

const ttft = [], tpot = [], failures = [];
let okRequests = 0, tokens = 0;
const deadline = performance.now() + seconds * 1000;

async function oneRequest(id, n) {
  const chat = n % 2 === 0;
  const prompt = prompts[(id + n) % prompts.length];
  const body = chat
    ? { model, messages: [{ role: "user", content: prompt }], max_tokens: maxTokens, temperature: 0.8, seed: id * 1000 + n,
        stream: true, stream_options: { include_usage: true }, logprobs: true, ignore_eos: true }
    : { model, prompt, max_tokens: maxTokens, temperature: 0.8, seed: id * 1000 + n, stream: true,
        stream_options: { include_usage: true }, logprobs: 0, ignore_eos: true };
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/${chat ? "chat/completions" : "completions"}`, {
    method: "POST", headers, body: JSON.stringify(body) });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${(await res.text()).slice(0, 200)}`);
  const decoder = new TextDecoder();
  let buf = "", streamed = 0, first = 0, last = 0, usage = null, done = false, finishes = 0;
  for await (const part of res.body) {
    buf += decoder.decode(part, { stream: true });
    let k;
    while ((k = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (!ev.startsWith("data: ")) throw new Error(`bad SSE line: ${ev.slice(0, 80)}`);
      const data = ev.slice(6);
      if (done) throw new Error("data after [DONE]");
      if (data === "[DONE]") { done = true; continue; }
      const j = JSON.parse(data);
      if (j.error) throw new Error(`stream error: ${j.error.message}`);
      if (j.usage) usage = j.usage;
      for (const c of j.choices) {
        const n = chat ? (c.logprobs?.content?.length ?? 0) : (c.logprobs?.tokens?.length ?? 0);
        if (n > 0) {
          const now = performance.now();
          if (streamed === 0) first = now;
          last = now;
          streamed += n;
        }
        if (c.finish_reason) finishes++;
      }
    }
  }
  if (!done) throw new Error("truncated: no [DONE]");
  if (!usage) throw new Error("no usage chunk");
  if (finishes !== 1) throw new Error(`${finishes} finish_reason values`);
  if (streamed !== usage.completion_tokens) throw new Error(`streamed ${streamed} tokens, usage says ${usage.completion_tokens}`);
  if (usage.completion_tokens !== maxTokens) throw new Error(`ignore_eos request stopped at ${usage.completion_tokens}`);
  ttft.push(first - t0);
  if (streamed > 1) tpot.push((last - first) / (streamed - 1));
  tokens += streamed;
  okRequests++;
}

async function client(id) {
  for (let n = 0; performance.now() < deadline; n++) {
    try {
      await oneRequest(id, n);
    } catch (e) {
      failures.push(String(e.message ?? e));
    }
  }
}

const tStart = performance.now();
await Promise.all(Array.from({ length: clients }, (_, i) => client(i)));
const wall = (performance.now() - tStart) / 1000;
const pct = (xs, p) => {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const result = {
  clients, seconds, max_tokens: maxTokens, wall_s: +wall.toFixed(1), requests_ok: okRequests,
  requests_failed: failures.length, tokens, tokens_per_s: +(tokens / wall).toFixed(1),
  ttft_ms: { p50: pct(ttft, 50), p90: pct(ttft, 90), p99: pct(ttft, 99) },
  tpot_ms: { p50: pct(tpot, 50), p90: pct(tpot, 90), p99: pct(tpot, 99) },
  first_failures: failures.slice(0, 5),
};
for (const k of ["ttft_ms", "tpot_ms"]) for (const p in result[k]) result[k][p] = +result[k][p].toFixed(1);
console.log(JSON.stringify(result));
console.log(`clients ${clients}, ${wall.toFixed(1)} s: ${okRequests} ok, ${failures.length} failed, ${tokens} tokens (${result.tokens_per_s} tok/s)`);
console.log(`TTFT ms p50/p90/p99: ${result.ttft_ms.p50} / ${result.ttft_ms.p90} / ${result.ttft_ms.p99}`);
console.log(`TPOT ms p50/p90/p99: ${result.tpot_ms.p50} / ${result.tpot_ms.p90} / ${result.tpot_ms.p99}`);
process.exit(failures.length ? 1 : 0);
