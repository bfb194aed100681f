// End-to-end test of `afd serve` with the official `openai` npm client.
// Usage: node e2e.mjs BASE_URL MODEL_ID [API_KEY]
// Exercises chat and completions, streaming and not, usage, logprobs, stop and errors.
// Exits non-zero on the first failed check; prints "N passed, 0 failed" at the end.
import OpenAI from "openai";
import assert from "node:assert/strict";
import Ajv from "ajv";
import addFormats from "ajv-formats";

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

// Structured outputs on a random-weight model: at temperature 1 only the constraint can make
// every answer parse and validate.
const ajv = new Ajv({ strict: false });
addFormats(ajv);
const personSchema = {
  type: "object",
  properties: {
    name: { type: "string", minLength: 1, maxLength: 6 },
    age: { type: "integer", minimum: 0, maximum: 120 },
    score: { type: "number", minimum: -1, maximum: 1 },
    tags: { type: "array", items: { enum: ["a", "b", "c"] }, maxItems: 3 },
    ok: { type: "boolean" },
    kind: { anyOf: [{ type: "null" }, { const: "x" }] },
    day: { type: "string", format: "date" },
  },
  required: ["name", "age", "ok", "day"],
  additionalProperties: false,
};
const validPerson = ajv.compile(personSchema);

await check("response_format json_schema: every seed's answer validates (temperature 1)", async () => {
  for (let seed = 0; seed < 12; seed++) {
    const r = await client.chat.completions.create({
      model, messages: [{ role: "user", content: "Describe a person." }], max_tokens: 400, temperature: 1, seed,
      response_format: { type: "json_schema", json_schema: { name: "person", schema: personSchema, strict: true } },
    });
    assert.equal(r.choices[0].finish_reason, "stop", `seed ${seed}: ${r.choices[0].message.content}`);
    const v = JSON.parse(r.choices[0].message.content);
    assert.ok(validPerson(v), `seed ${seed}: ${JSON.stringify(validPerson.errors)} in ${r.choices[0].message.content}`);
  }
});

await check("response_format json_schema, streamed; completions endpoint too", async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Describe a person." }], max_tokens: 400, temperature: 1, seed: 99,
    stream: true, response_format: { type: "json_schema", json_schema: { name: "person", schema: personSchema } },
  });
  let text = "", finish = null;
  for await (const chunk of stream) for (const c of chunk.choices) {
    text += c.delta.content ?? "";
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(finish, "stop");
  assert.ok(validPerson(JSON.parse(text)), text);
  const c = await client.completions.create({
    model, prompt: "A person:", max_tokens: 400, temperature: 1, seed: 7,
    response_format: { type: "json_schema", json_schema: { name: "person", schema: personSchema } },
  });
  assert.ok(validPerson(JSON.parse(c.choices[0].text)), c.choices[0].text);
});

await check("guided_choice and guided_regex", async () => {
  for (let seed = 0; seed < 4; seed++) {
    const c = await client.chat.completions.create({
      model, messages: [{ role: "user", content: "Pick one." }], max_tokens: 20, temperature: 1, seed,
      guided_choice: ["red", "green", "blue sky"],
    });
    assert.ok(["red", "green", "blue sky"].includes(c.choices[0].message.content), c.choices[0].message.content);
    const r = await client.completions.create({
      model, prompt: "Code:", max_tokens: 30, temperature: 1, seed, guided_regex: "[a-c]{2,4}-[0-9]{2}",
    });
    assert.match(r.choices[0].text, /^[a-c]{2,4}-[0-9]{2}$/);
  }
});

const tools = [
  { type: "function", function: { name: "get_weather", description: "Weather in a city",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 8 }, unit: { enum: ["C", "F"] } },
                  required: ["city", "unit"], additionalProperties: false } } },
  { type: "function", function: { name: "get_time", parameters: { type: "object", properties: {}, additionalProperties: false } } },
];
const validWeather = ajv.compile(tools[0].function.parameters);

await check("tools: tool_choice required and named, non-streaming", async () => {
  for (let seed = 0; seed < 4; seed++) {
    const r = await client.chat.completions.create({
      model, messages: [{ role: "user", content: "Weather in Paris?" }], max_tokens: 300, temperature: 1, seed,
      tools, tool_choice: "required", parallel_tool_calls: false,
    });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, "tool_calls", JSON.stringify(m));
    assert.equal(m.tool_calls.length, 1);
    assert.equal(m.tool_calls[0].type, "function");
    assert.ok(m.tool_calls[0].id.startsWith("call_"));
    const args = JSON.parse(m.tool_calls[0].function.arguments);
    if (m.tool_calls[0].function.name === "get_weather") assert.ok(validWeather(args), m.tool_calls[0].function.arguments);
    else assert.deepEqual(args, {});
  }
  const named = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Weather?" }], max_tokens: 300, temperature: 1, seed: 3,
    tools, tool_choice: { type: "function", function: { name: "get_weather" } },
  });
  assert.equal(named.choices[0].message.tool_calls[0].function.name, "get_weather");
  assert.ok(validWeather(JSON.parse(named.choices[0].message.tool_calls[0].function.arguments)));
});

await check("tools: streamed tool_calls deltas, then a tool result in the history", async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Weather in Paris?" }], max_tokens: 300, temperature: 1, seed: 11,
    tools, tool_choice: { type: "function", function: { name: "get_weather" } }, stream: true,
  });
  const calls = [];
  let finish = null;
  for await (const chunk of stream) for (const c of chunk.choices) {
    for (const tc of c.delta.tool_calls ?? []) {
      if (tc.id) calls[tc.index] = { id: tc.id, name: tc.function.name, arguments: "" };
      calls[tc.index].arguments += tc.function?.arguments ?? "";
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(finish, "tool_calls");
  assert.equal(calls.length, 1);
  assert.equal(calls[0].name, "get_weather");
  assert.ok(validWeather(JSON.parse(calls[0].arguments)), calls[0].arguments);
  const next = await client.chat.completions.create({
    model, max_tokens: 5, temperature: 0, tools,
    messages: [{ role: "user", content: "Weather in Paris?" },
               { role: "assistant", content: null, tool_calls: [{ id: calls[0].id, type: "function",
                 function: { name: calls[0].name, arguments: calls[0].arguments } }] },
               { role: "tool", tool_call_id: calls[0].id, content: "18 C, sunny" }],
  });
  assert.equal(typeof next.choices[0].message.content === "string" || next.choices[0].message.tool_calls !== undefined, true);
});

await check("structured outputs: bad schemas, regexes and tool choices are 400 naming the problem", async () => {
  const cases = [
    [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object", if: {} } } } }, /if/],
    [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "integer", minimum: 5, maximum: 1 } } } }, /no integer satisfies/],
    [{ guided_regex: "(a)\\1" }, /guided_regex/],
    [{ tools, tool_choice: { type: "function", function: { name: "nope" } } }, /nope/],
    [{ tools: [tools[0], tools[0]] }, /unique/],
    [{ tools: [{ type: "function", function: { name: "f", parameters: [] } }] }, /parameters/],
    [{ guided_choice: ["a"], response_format: { type: "json_object" } }, /both/],
  ];
  for (const [extra, re] of cases) {
    await assert.rejects(client.chat.completions.create({ model, messages: [{ role: "user", content: "x" }], ...extra }), (e) => {
      assert.equal(e.status, 400);
      assert.match(e.message, re);
      return true;
    });
  }
});

console.log(`${passed} passed, 0 failed`);
