// Drives `baton serve` with the official openai package as a real client:
// models, non-streaming and streaming completions and chat completions, a
// chat completion with a json_schema response_format, and one refused request. Prints one JSON object with what it received; exits 1
// when the client throws or a stream is malformed. Run by
// tests/test_cli_serve.cpp (OfficialOpenAiNodeClient), which compares the text
// with `baton run`.
//
//   node openai_client.mjs --base-url http://127.0.0.1:PORT/v1 --model NAME
//                          [--prompt TEXT] [--max-tokens N] [--api-key KEY]
import OpenAI from "openai";
import { check, parseArgs, run } from "./common.mjs";

function args() {
  const flags = {
    "--base-url": "baseURL", "--model": "model", "--prompt": "prompt", "--max-tokens": "maxTokens#",
    "--api-key": "apiKey",
  };
  const a = parseArgs(flags, { prompt: "Once upon a time", maxTokens: 30, apiKey: "unused" });
  if (!a.baseURL || !a.model) throw new Error("--base-url and --model are required");
  return a;
}

async function main() {
  const a = args();
  const client = new OpenAI({ baseURL: a.baseURL, apiKey: a.apiKey, maxRetries: 0, timeout: 60_000 });
  const out = {};

  const models = await client.models.list();
  out.models = models.data.map((m) => m.id);

  // Completions, whole and streamed (greedy: both must equal `baton run`).
  const comp = await client.completions.create({
    model: a.model, prompt: a.prompt, max_tokens: a.maxTokens, temperature: 0,
  });
  check(comp.object === "text_completion", "completion object");
  out.completion = { text: comp.choices[0].text, finish_reason: comp.choices[0].finish_reason, usage: comp.usage };

  const compStream = await client.completions.create({
    model: a.model, prompt: a.prompt, max_tokens: a.maxTokens, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const chunk of compStream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  check(finish !== null, "completion stream finish_reason");
  check(usage !== null, "completion stream usage");
  out.completion_stream = { text, finish_reason: finish, usage, chunks };

  // Chat, whole and streamed with a fixed seed.
  const messages = [
    { role: "system", content: "You are a storyteller." },
    { role: "user", content: "Tell me a story about a dog." },
  ];
  const chat = await client.chat.completions.create({
    model: a.model, messages, max_tokens: a.maxTokens, temperature: 0.7, seed: 11,
  });
  check(chat.object === "chat.completion", "chat object");
  check(chat.choices[0].message.role === "assistant", "chat role");
  out.chat = { text: chat.choices[0].message.content, finish_reason: chat.choices[0].finish_reason, usage: chat.usage };

  const chatStream = await client.chat.completions.create({
    model: a.model, messages, max_tokens: a.maxTokens, temperature: 0.7, seed: 11,
    stream: true, stream_options: { include_usage: true },
  });
  let ctext = "", cfinish = null, cusage = null, role = null, cchunks = 0;
  for await (const chunk of chatStream) {
    cchunks++;
    if (chunk.usage) cusage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) ctext += c.delta.content;
      if (c.finish_reason) cfinish = c.finish_reason;
    }
  }
  check(role === "assistant", "chat stream role");
  check(cfinish !== null, "chat stream finish_reason");
  out.chat_stream = { text: ctext, finish_reason: cfinish, usage: cusage, chunks: cchunks };

  // Structured output: a json_schema response_format at temperature 1; the
  // gtest checks that the content is JSON that follows the schema.
  const schema = {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 8 },
      age: { type: "integer", minimum: 0 },
      pet: { enum: ["cat", "dog", null] },
    },
    required: ["name", "age", "pet"],
    additionalProperties: false,
  };
  const structured = await client.chat.completions.create({
    model: a.model, messages, max_tokens: 400, temperature: 1, seed: 5,
    response_format: { type: "json_schema", json_schema: { name: "person", schema, strict: true } },
  });
  out.structured = {
    schema, content: structured.choices[0].message.content, finish_reason: structured.choices[0].finish_reason,
  };

  // A refusal comes back as the client's APIError with the status.
  try {
    await client.completions.create({ model: "no-such-model", prompt: "x", max_tokens: 1 });
    out.bad_model_status = 200;
  } catch (e) {
    check(e instanceof OpenAI.APIError, "APIError for an unknown model");
    out.bad_model_status = e.status;
    out.bad_model_code = e.code;
  }

  process.stdout.write(JSON.stringify(out) + "\n");
}

run("openai_client", main);
