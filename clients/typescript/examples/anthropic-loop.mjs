// An agent loop in the Anthropic Messages tool-use format, its tools run by toolpool.
//
// The model's turns are scripted (SCRIPT below) unless ANTHROPIC_API_KEY is set and @anthropic-ai/sdk is
// installed: then Claude (TOOLPOOL_EXAMPLE_MODEL, default claude-sonnet-4-5) plays them. Every tool_use
// block runs as a toolpool call; the loop stops when a call waits for a person's approval and says what to
// do. Run against make run:   node examples/anthropic-loop.mjs
import { Client, anthropicToolResult, runAnthropicToolUse } from "toolpool";

const TASK = "Look around the workspace, then create a build directory.";

// What the Messages API would answer, turn by turn (stop_reason and content blocks).
const SCRIPT = [
  { stop_reason: "tool_use", content: [
    { type: "text", text: "Let me look at the workspace first." },
    { type: "tool_use", id: "toolu_01", name: "run_shell", input: { command: "pwd; ls -la" } },
  ] },
  { stop_reason: "tool_use", content: [{ type: "tool_use", id: "toolu_02", name: "run_shell", input: { command: "uname -s; id -un" } }] },
  { stop_reason: "tool_use", content: [{ type: "tool_use", id: "toolu_03", name: "run_shell", input: { command: "mkdir -p build" } }] },
  { stop_reason: "end_turn", content: [{ type: "text", text: "The build directory is ready." }] },
];

async function model() {
  if (!process.env.ANTHROPIC_API_KEY) {
    let turn = 0;
    return async () => SCRIPT[turn++];
  }
  const { default: Anthropic } = await import("@anthropic-ai/sdk");
  const api = new Anthropic();
  const name = process.env.TOOLPOOL_EXAMPLE_MODEL ?? "claude-sonnet-4-5";
  return (messages, tools) => api.messages.create({ model: name, max_tokens: 1024, tools, messages });
}

const tp = new Client({ workspace: process.env.TOOLPOOL_EXAMPLE_WORKSPACE ?? "agent-demo" });
const create = await model();
const tools = await tp.anthropicTools();
const messages = [{ role: "user", content: TASK }];
const ran = [];
for (;;) {
  const turn = await create(messages, tools);
  messages.push({ role: "assistant", content: turn.content });
  if (turn.stop_reason !== "tool_use") {
    console.log(JSON.stringify({ done: true, ran }));
    break;
  }
  const results = [];
  let pending;
  for (const block of turn.content.filter((b) => b.type === "tool_use")) {
    const res = await runAnthropicToolUse(tp, block);
    if (res.status === "pending_approval") {
      pending = res;
      break;
    }
    ran.push({ tool: block.name, status: res.status, output: res.output });
    results.push(anthropicToolResult(res, block.id));
  }
  if (pending) {
    const d = pending.decision ?? {};
    console.error(`call ${pending.id} waits for approval (${d.rule}: ${d.reason}); approve it with: toolpool approvals approve ${pending.id}`);
    console.log(JSON.stringify({ done: false, ran, pending: pending.id }));
    break;
  }
  messages.push({ role: "user", content: results });
}
