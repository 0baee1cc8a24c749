import type { Client } from "./client.js";
import type { CallOptions, Result } from "./types.js";
/** Run an Anthropic tool_use content block ({type: "tool_use", id, name, input}) as a toolpool call. */
export declare function runAnthropicToolUse(client: Client, block: {
    name: string;
    input?: unknown;
}, opts?: CallOptions): Promise<Result>;
/** The tool_result content block for a Result: its output, is_error unless it ran ok (or waits). */
export declare function anthropicToolResult(result: Result, toolUseId: string): {
    type: "tool_result";
    tool_use_id: string;
    content: string;
    is_error: boolean;
};
/** Run an OpenAI tool call ({id, type: "function", function: {name, arguments: JSON text}}) as a toolpool call. */
export declare function runOpenAIToolCall(client: Client, call: {
    id?: string;
    function: {
        name: string;
        arguments?: string;
    };
}, opts?: CallOptions): Promise<Result>;
/** The tool role message for a Result, as Chat Completions takes it. */
export declare function openaiToolMessage(result: Result, toolCallId: string): {
    role: "tool";
    tool_call_id: string;
    content: string;
};
