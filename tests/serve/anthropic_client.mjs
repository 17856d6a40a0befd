// Drives `baton serve` with the official @anthropic-ai/sdk package as a real
// client: messages.create, the SDK's stream helper (its events and final
// message), countTokens, a stop sequence, a conversation with tools and a
// tool_result turn, and refusals as the SDK's error classes. Prints one JSON
// object with what it received; exits 1 when the client throws or a check
// fails. Run by tests/test_cli_serve_anthropic.cpp
// (AnthropicServe.OfficialAnthropicNodeClient), which compares the text with
// the OpenAI route's.
//
//   node anthropic_client.mjs --base-url http://127.0.0.1:PORT --model NAME --api-key KEY
//                             [--max-tokens N]
import Anthropic from "@anthropic-ai/sdk";
import { check, parseArgs, run } from "./common.mjs";

function args() {
  const flags = { "--base-url": "baseURL", "--model": "model", "--api-key": "apiKey", "--max-tokens": "maxTokens#" };
  const a = parseArgs(flags, { maxTokens: 30 });
  if (!a.baseURL || !a.model || !a.apiKey) throw new Error("--base-url, --model and --api-key are required");
  return a;
}

function textOf(message) {
  return message.content.filter((b) => b.type === "text").map((b) => b.text).join("");
}

// The SDK's error for a request that must fail: its class, status and body.
async function refusal(promise) {
  try {
    await promise;
  } catch (e) {
    check(e instanceof Anthropic.APIError, `an APIError, got ${e}`);
    return { class: e.constructor.name, status: e.status, type: e.error?.error?.type, message: e.error?.error?.message };
  }
  throw new Error("check failed: the request was accepted");
}

async function main() {
  const a = args();
  const client = new Anthropic({ baseURL: a.baseURL, apiKey: a.apiKey, maxRetries: 0, timeout: 60_000 });
  const out = {};
  const request = {
    model: a.model,
    max_tokens: a.maxTokens,
    temperature: 0,
    system: "You are a storyteller.",
    messages: [{ role: "user", content: "Tell me a story about a dog." }],
  };

  const message = await client.messages.create(request);
  check(message.type === "message" && message.role === "assistant", "message type and role");
  check(message.id.startsWith("msg_"), "message id");
  check(message.model === a.model, "model");
  check(["end_turn", "max_tokens"].includes(message.stop_reason), `stop_reason ${message.stop_reason}`);
  out.create = { text: textOf(message), stop_reason: message.stop_reason, usage: message.usage,
                 blocks: message.content.map((b) => b.type) };

  // The stream helper: every event in order, the text events, the final message.
  const stream = client.messages.stream(request);
  const events = [];
  let streamed = "";
  stream.on("text", (delta) => { streamed += delta; });
  for await (const event of stream) events.push(event.type);
  const final = await stream.finalMessage();
  check(events[0] === "message_start" && events[events.length - 1] === "message_stop", "stream's first and last");
  check(streamed === textOf(final), "text events add up to the final message");
  out.stream = { events, text: streamed, final_text: textOf(final), stop_reason: final.stop_reason, usage: final.usage };

  const { max_tokens, ...countRequest } = request;
  out.count_tokens = (await client.messages.countTokens(countRequest)).input_tokens;

  // A stop sequence from the greedy text ends the next answer before it.
  const words = out.create.text.split(" ").filter((w) => w.length >= 3);
  if (words.length >= 2) {
    const seq = words[1];
    const stopped = await client.messages.create({ ...request, stop_sequences: [seq] });
    out.stop = { sequence: seq, text: textOf(stopped), stop_reason: stopped.stop_reason,
                 stop_sequence: stopped.stop_sequence };
  }

  // Tools and a tool_result turn in the history: the request shape of a
  // tool_use round trip is accepted and answered.
  const tools = [{
    name: "get_weather",
    description: "The weather in a city now",
    input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  }];
  const history = [
    { role: "user", content: "What is the weather in Paris?" },
    { role: "assistant", content: [
      { type: "text", text: "Let me look." },
      { type: "tool_use", id: "toolu_01", name: "get_weather", input: { city: "Paris" } },
    ] },
    { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_01", content: "21C and sunny" }] },
  ];
  const answer = await client.messages.create({
    model: a.model, max_tokens: 8, temperature: 0, tools, tool_choice: { type: "auto" }, messages: history,
  });
  check(answer.type === "message", "tool round trip answered");
  out.tools = {
    stop_reason: answer.stop_reason,
    // The whole prompt: what was computed plus what the prefix cache reused.
    input_tokens: answer.usage.input_tokens + (answer.usage.cache_read_input_tokens ?? 0),
    count_with_tools: (await client.messages.countTokens({ model: a.model, tools, messages: history })).input_tokens,
    count_without_tools: (await client.messages.countTokens({ model: a.model, messages: history })).input_tokens,
  };

  out.errors = {
    bad_model: await refusal(client.messages.create({ ...request, model: "no-such-model" })),
    no_max_tokens: await refusal(client.messages.create({ model: a.model, messages: request.messages })),
    bad_key: await refusal(new Anthropic({ baseURL: a.baseURL, apiKey: "wrong", maxRetries: 0 }).messages.create(request)),
  };

  process.stdout.write(JSON.stringify(out) + "\n");
}

run("anthropic_client", main);
