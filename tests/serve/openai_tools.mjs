// Tool calling through the official openai package. Run by
// tests/test_cli_serve.cpp (OfficialOpenAiNodeClientTools).
//
//   node openai_tools.mjs --base-url http://127.0.0.1:PORT/v1 --model NAME
//     A chat with tools and a tool-call history, whole, streamed and through
//     the client's stream helper (which accumulates delta.tool_calls); prints
//     one JSON object with what came back.
//   node openai_tools.mjs --chunks FILE
//     FILE holds a chat stream's chunks, one JSON object a line (the server's
//     SSE payloads); the client's ChatCompletionStream accumulates them and
//     the final completion is printed.
// Exits 1 when the client throws or a check fails.
import { readFileSync } from "node:fs";
import OpenAI from "openai";
import { ChatCompletionStream } from "openai/lib/ChatCompletionStream";
import { check, parseArgs, run } from "./common.mjs";

function args() {
  const a = parseArgs({ "--base-url": "baseURL", "--model": "model", "--chunks": "chunks" });
  if (!a.chunks && (!a.baseURL || !a.model)) throw new Error("--base-url and --model, or --chunks, are required");
  return a;
}

const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather of a city.",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
}];

const messages = [
  { role: "user", content: "What is the weather in Paris?" },
  {
    role: "assistant", content: null,
    tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Paris\"}" } }],
  },
  { role: "tool", tool_call_id: "call_1", content: "{\"temp\": 19}" },
];

async function live(a) {
  const client = new OpenAI({ baseURL: a.baseURL, apiKey: "unused", maxRetries: 0, timeout: 60_000 });
  const params = { model: a.model, messages, tools, tool_choice: "auto", max_tokens: 60, temperature: 0, stop: ["."] };
  const out = {};

  const whole = await client.chat.completions.create(params);
  check(whole.object === "chat.completion", "chat object");
  const m = whole.choices[0].message;
  out.whole = { content: m.content, tool_calls: m.tool_calls ?? null, finish_reason: whole.choices[0].finish_reason };

  const stream = await client.chat.completions.create({ ...params, stream: true });
  let text = "", finish = null, calls = 0;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.delta.content) text += c.delta.content;
      if (c.delta.tool_calls) calls += c.delta.tool_calls.length;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  out.stream = { content: text, tool_call_deltas: calls, finish_reason: finish };

  const helper = client.chat.completions.stream(params);
  const final = await helper.finalChatCompletion();
  out.helper = { content: final.choices[0].message.content, finish_reason: final.choices[0].finish_reason };
  return out;
}

async function chunks(a) {
  const text = readFileSync(a.chunks);
  const body = new ReadableStream({
    start(c) {
      c.enqueue(new Uint8Array(text));
      c.close();
    },
  });
  const final = await ChatCompletionStream.fromReadableStream(body).finalChatCompletion();
  return final.choices[0];
}

async function main() {
  const a = args();
  const out = a.chunks ? await chunks(a) : await live(a);
  process.stdout.write(JSON.stringify(out) + "\n");
}

run("openai_tools", main);
