// Tool calls in the shapes of model APIs: run an Anthropic Messages tool_use block or an OpenAI tool
// call through toolpool, and turn the Result into the message the model reads next.
function content(result) {
    if (result.status === "pending_approval") {
        const d = result.decision;
        return `call ${result.id} waits for a person's approval${d?.rule ? ` (${d.rule}: ${d.reason ?? ""})` : ""}; it has not run yet`;
    }
    return result.output;
}
/** Run an Anthropic tool_use content block ({type: "tool_use", id, name, input}) as a toolpool call. */
export function runAnthropicToolUse(client, block, opts = {}) {
    return client.call(block.name, (block.input ?? {}), opts);
}
/** The tool_result content block for a Result: its output, is_error unless it ran ok (or waits). */
export function anthropicToolResult(result, toolUseId) {
    return { type: "tool_result", tool_use_id: toolUseId, content: content(result),
        is_error: result.status !== "ok" && result.status !== "pending_approval" };
}
/** Run an OpenAI tool call ({id, type: "function", function: {name, arguments: JSON text}}) as a toolpool call. */
export function runOpenAIToolCall(client, call, opts = {}) {
    let args;
    try {
        args = JSON.parse(call.function.arguments || "{}");
    }
    catch (e) {
        throw new TypeError(`tool call ${call.id}: arguments are not JSON: ${e.message}`);
    }
    return client.call(call.function.name, args, opts);
}
/** The tool role message for a Result, as Chat Completions takes it. */
export function openaiToolMessage(result, toolCallId) {
    return { role: "tool", tool_call_id: toolCallId, content: content(result) };
}
