// End-to-end test of `afd serve` with the official `openai` npm client.
// Usage: node e2e.mjs BASE_URL MODEL_ID [API_KEY]
// Exercises chat and completions, streaming and not, usage, logprobs, stop and errors.
// Exits non-zero on the first failed check; prints "N passed, 0 failed" at the end.
import OpenAI from "openai";
import assert from "node:assert/strict";

const [baseURL, model, apiKey = "none"] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });
let passed = 0;
async function check(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok   ${name}`);
  } catch (e) {
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
    console.log(`${passed} passed, 1 failed`);
    process.exit(1);
  }
}

await check("models.list", async () => {
  const models = await client.models.list();
  assert.equal(models.data[0].id, model);
});

await check("chat, non-streaming", async () => {
  const r = await client.chat.completions.create({
    model, messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello there!" }],
    max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, "assistant");
  assert.equal(typeof r.choices[0].message.content, "string");
  assert.ok(["stop", "length"].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(r.choices[0].logprobs.content.length, r.usage.completion_tokens);
  assert.equal(r.choices[0].logprobs.content[0].top_logprobs.length, 2);
});

await check("chat, greedy is deterministic", async () => {
  const req = { model, messages: [{ role: "user", content: "Count to three." }], max_tokens: 6, temperature: 0 };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
});

await check("chat, streaming with usage", async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Tell me a story." }], max_tokens: 12, temperature: 0.8, seed: 5,
    stream: true, stream_options: { include_usage: true }, logprobs: true,
  });
  let text = "", tokens = 0, finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta.content ?? "";
      tokens += c.logprobs?.content?.length ?? 0;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(chunks >= 2);
  assert.ok(usage, "usage chunk");
  assert.equal(tokens, usage.completion_tokens);
  assert.ok(["stop", "length"].includes(finish));
  assert.equal(typeof text, "string");
});

await check("completions, non-streaming from text and from token ids", async () => {
  const r = await client.completions.create({ model, prompt: "The engine reads", max_tokens: 5, temperature: 0, logprobs: 1 });
  assert.equal(r.object, "text_completion");
  assert.equal(typeof r.choices[0].text, "string");
  assert.equal(r.choices[0].logprobs.tokens.length, r.usage.completion_tokens);
  const ids = await client.completions.create({ model, prompt: [1, 300, 12], max_tokens: 3, temperature: 0 });
  assert.equal(ids.usage.prompt_tokens, 3);
  assert.ok(ids.usage.completion_tokens >= 1 && ids.usage.completion_tokens <= 3);
});

await check("completions, streaming", async () => {
  const stream = await client.completions.create({
    model, prompt: "Once upon a time", max_tokens: 10, temperature: 1.0, top_p: 0.9, top_k: 20, seed: 1,
    stream: true, stream_options: { include_usage: true },
  });
  let usage = null, text = "";
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) text += c.text;
  }
  assert.ok(usage && usage.completion_tokens >= 1 && usage.completion_tokens <= 10);
});

await check("bad requests are 400 with an error body", async () => {
  for (const body of [
    { model, prompt: "x", max_tokens: 0 },
    { model, prompt: "x", n: 2 },
    { model, prompt: "x", temperature: 7 },
    { model, prompt: [1, 10_000_000] },
  ]) {
    await assert.rejects(client.completions.create(body), (e) => {
      assert.equal(e.status, 400);
      assert.equal(typeof e.error?.message ?? e.message, "string");
      return true;
    });
  }
  await assert.rejects(client.chat.completions.create({ model, messages: [] }), (e) => e.status === 400);
});

console.log(`${passed} passed, 0 failed`);
