// toolpool: run AI agents' tool calls in sandboxes, under policy, with approvals.
export { Client, DEFAULT_URL } from "./client.js";
export * from "./errors.js";
export * from "./types.js";
export { anthropicToolResult, openaiToolMessage, runAnthropicToolUse, runOpenAIToolCall } from "./agents.js";
