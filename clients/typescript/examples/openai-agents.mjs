// toolpool's tools for the OpenAI Agents SDK for JavaScript (@openai/agents): each tool of
// GET /v1/tools?format=openai as a function tool whose execute runs a toolpool call.
//
// With the SDK installed and OPENAI_API_KEY set, an Agent runs them with run(). Otherwise the model's
// turns are scripted (SCRIPT below) and played as the SDK plays a model's function calls: execute(input)
// for each. Either way the run stops at the first call that waits for a person's approval.
// Run against make run:   node examples/openai-agents.mjs
import { Client } from "toolpool";

const SCRIPT = [
  ["read_file", { path: "notes.txt" }],
  ["run_shell", { command: "ls" }],
  ["run_shell", { command: "mkdir -p out" }],
  ["run_shell", { command: "echo never reached" }],
];

class ApprovalNeeded extends Error {
  constructor(result) {
    super(`call ${result.id} waits for approval`);
    this.result = result;
  }
}

async function sdk() {
  if (!process.env.OPENAI_API_KEY) return undefined;
  try {
    return await import("@openai/agents");
  } catch {
    return undefined;
  }
}

const tp = new Client({ workspace: process.env.TOOLPOOL_EXAMPLE_WORKSPACE ?? "agents-demo" });
await tp.createWorkspace(tp.workspace).catch((e) => { if (e.status !== 409) throw e; });
await tp.uploadFile(tp.workspace, "notes.txt", "remember: build into out/\n");
const ran = [];
const agents = await sdk();
// The SDK's tool(): a name, a description, JSON Schema parameters (not strict: toolpool's schemas have
// optional fields) and execute; without the SDK, the same fields.
const makeTool = agents?.tool ?? ((spec) => spec);
const tools = (await tp.openaiTools()).map(({ function: f }) => makeTool({
  name: f.name, description: f.description, parameters: f.parameters, strict: false,
  async execute(input) {
    const res = await tp.call(f.name, typeof input === "string" ? JSON.parse(input) : input);
    if (res.status === "pending_approval") throw new ApprovalNeeded(res);
    ran.push({ tool: f.name, status: res.status, output: res.output });
    return res.output;
  },
}));
try {
  if (agents) {
    const agent = new agents.Agent({ name: "builder", instructions: "Read notes.txt and do what it says.", tools });
    const out = await agents.run(agent, "Prepare the build.");
    console.log(JSON.stringify({ done: true, ran, final: String(out.finalOutput) }));
  } else {
    const byName = new Map(tools.map((t) => [t.name, t]));
    for (const [name, args] of SCRIPT) await byName.get(name).execute(args);
    console.log(JSON.stringify({ done: true, ran }));
  }
} catch (e) {
  if (!(e instanceof ApprovalNeeded)) throw e;
  const d = e.result.decision ?? {};
  console.error(`call ${e.result.id} waits for approval (${d.rule}: ${d.reason}); approve it with: toolpool approvals approve ${e.result.id}`);
  console.log(JSON.stringify({ done: false, ran, pending: e.result.id }));
}
