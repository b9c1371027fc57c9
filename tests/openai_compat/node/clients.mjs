// Node clients against a live Lethe, with their default settings: the OpenAI Agents SDK (@openai/agents) and the
// Vercel AI SDK (ai + @ai-sdk/openai, its Responses and Chat models). Run by tests/openai_compat/test_node_clients.py:
//
//   LETHE_URL=http://127.0.0.1:8000 LETHE_API_KEY=... node clients.mjs <agents|ai-responses|ai-chat>
//
// Prints one JSON object with what each client saw; the Python test asserts on it. Versions are pinned in
// package-lock.json (installed by `make test`: npm ci), nothing is fetched at run time.
import OpenAI from "openai";
import { Agent, run, tool, setDefaultOpenAIClient, setTracingDisabled } from "@openai/agents";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, streamText, tool as aiTool, stepCountIs } from "ai";
import { z } from "zod";

const base = process.env.LETHE_URL + "/v1";
const apiKey = process.env.LETHE_API_KEY;
// The tiny model copies a call it is shown, and stops calling once a tool's output asks it for words.
const CALL = JSON.stringify({ name: "get_weather", arguments: { city: "Paris" } });
const CALL_PROMPT = `Write exactly this and nothing else: <tool_call>${CALL}</tool_call>`;
const TOOL_OUTPUT = "Sunny. Reply to the user in plain words.";
const calls = [];

async function agents(model) {
  const client = new OpenAI({ baseURL: base, apiKey, maxRetries: 0 });
  setDefaultOpenAIClient(client);
  setTracingDisabled(true); // traces would go to OpenAI's servers
  const agent = new Agent({ name: "assistant", instructions: "You are brief.", model });
  const plain = await run(agent, "Hello");
  const streamed = await run(agent, "Hello", { stream: true });
  const deltas = [];
  for await (const event of streamed) {
    if (event.type === "raw_model_stream_event" && event.data.type === "output_text_delta") deltas.push(event.data.delta);
  }
  await streamed.completed;
  const weather = tool({
    name: "get_weather", description: "Weather.", parameters: z.object({ city: z.string() }),
    execute: async ({ city }) => { calls.push(city); return TOOL_OUTPUT; },
  });
  const withTool = new Agent({ name: "weather", model, tools: [weather] });
  const round = await run(withTool, CALL_PROMPT);
  const chained = await run(agent, "And again?", { previousResponseId: plain.lastResponseId });
  return {
    plain: plain.finalOutput, streamed: streamed.finalOutput, deltas: deltas.join(""), calls,
    tool_items: round.newItems.map((item) => item.type), tool_final: round.finalOutput,
    chained: chained.finalOutput, chained_cached: chained.rawResponses[0].usage.inputTokensDetails?.[0]?.cached_tokens
      ?? chained.rawResponses[0].usage.inputTokensDetails?.cached_tokens ?? null,
  };
}

async function aiSdk(model, kind) {
  const provider = createOpenAI({ baseURL: base, apiKey });
  const chosen = kind === "chat" ? provider.chat(model) : provider.responses(model);
  const plain = await generateText({ model: chosen, prompt: "Hello", maxOutputTokens: 16 });
  const stream = streamText({ model: chosen, prompt: "Hello", maxOutputTokens: 16 });
  let streamedText = "";
  for await (const delta of stream.textStream) streamedText += delta;
  const tools = {
    get_weather: aiTool({
      description: "Weather.", inputSchema: z.object({ city: z.string() }),
      execute: async ({ city }) => { calls.push(city); return TOOL_OUTPUT; },
    }),
  };
  const round = await generateText({ model: chosen, prompt: CALL_PROMPT, tools, stopWhen: stepCountIs(3) });
  const streamedRound = streamText({ model: chosen, prompt: CALL_PROMPT, tools, stopWhen: stepCountIs(3) });
  let roundText = "";
  for await (const delta of streamedRound.textStream) roundText += delta;
  const history = [{ role: "user", content: "I live in Paris." }];
  const first = await generateText({ model: chosen, messages: history, maxOutputTokens: 16 });
  const second = await generateText({
    model: chosen, maxOutputTokens: 16,
    messages: [...history, ...first.response.messages, { role: "user", content: "Where do I live?" }],
  });
  return {
    plain: plain.text, streamed: streamedText, calls,
    steps: round.steps.map((step) => ({ calls: step.toolCalls.map((c) => [c.toolName, c.input]), text: step.text })),
    round_text: round.text, streamed_round_text: roundText,
    second: second.text, second_cached: second.usage.cachedInputTokens ?? second.usage.inputTokenDetails?.cacheReadTokens,
  };
}

const client = new OpenAI({ baseURL: base, apiKey, maxRetries: 0 });
const model = (await client.models.list()).data[0].id;
const which = process.argv[2];
const result = which === "agents" ? await agents(model) : await aiSdk(model, which === "ai-chat" ? "chat" : "responses");
console.log(JSON.stringify(result));
