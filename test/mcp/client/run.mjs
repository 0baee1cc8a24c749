// Drives toolpool's /mcp endpoint with one of the official MCP TypeScript SDK clients, through every case
// test/mcp checks, and prints one JSON object: what the client saw in each case. The Go test asserts on
// it and checks the dispatcher's side (audit log, call records) over REST.
//
//   node run.mjs <sdk1|client2> <2025-11-25|2026-07-28> <base URL> <approver token> <caller token>
//   node run.mjs <sdk1|client2> <2025-11-25|2026-07-28> <base URL> <token> get <call id>
//
// The second form fetches a call's result with toolpool_get_result, from a connection of its own.
//
// sdk1 is @modelcontextprotocol/sdk 1.x (2025-11-25 only); client2 is @modelcontextprotocol/client 2.x,
// pinned to 2026-07-28 or negotiating the 2025 handshake.
//
// Each SDK is imported only when used. The 2.x packages need Node.js 20.
import { readFileSync } from 'node:fs';

// installed is the version of an installed @modelcontextprotocol package.
const installed = (name) => JSON.parse(readFileSync(new URL(`./node_modules/@modelcontextprotocol/${name}/package.json`, import.meta.url))).version;

const [kind, version, base, approverToken, callerToken, getID] = process.argv.slice(2);
const out = { client: '', version: '', cases: {} };

// connect returns a client for token, whose elicitation handler records the prompt and answers answer.
async function connect(token, { elicit = true, answer = 'accept', headers = {} } = {}) {
  const prompts = [];
  const capabilities = elicit ? { elicitation: { form: {} } } : {};
  const requestInit = { headers: { Authorization: `Bearer ${token}`, ...headers } };
  const onElicit = async (req) => {
    prompts.push(req.params.message);
    return { action: answer, content: {} };
  };
  let client, call, negotiated;
  if (kind === 'sdk1') {
    const { Client: Client1 } = await import('@modelcontextprotocol/sdk/client/index.js');
    const { StreamableHTTPClientTransport: Transport1 } = await import('@modelcontextprotocol/sdk/client/streamableHttp.js');
    const { CallToolResultSchema, ElicitRequestSchema } = await import('@modelcontextprotocol/sdk/types.js');
    client = new Client1({ name: 'toolpool-test', version: '1' }, { capabilities });
    if (elicit) client.setRequestHandler(ElicitRequestSchema, onElicit);
    const transport = new Transport1(new URL('/mcp', base), { requestInit });
    await client.connect(transport);
    call = (params, opts) => client.callTool(params, CallToolResultSchema, opts);
    negotiated = transport.protocolVersion;
    out.client = '@modelcontextprotocol/sdk ' + installed('sdk');
  } else {
    const { Client: Client2, StreamableHTTPClientTransport: Transport2 } = await import('@modelcontextprotocol/client');
    const versionNegotiation = version === '2026-07-28' ? { mode: { pin: '2026-07-28' } } : undefined;
    client = new Client2({ name: 'toolpool-test', version: '1' }, { capabilities, versionNegotiation });
    if (elicit) client.setRequestHandler('elicitation/create', onElicit);
    await client.connect(new Transport2(new URL('/mcp', base), { requestInit }));
    call = (params, opts) => client.callTool(params, opts);
    negotiated = client.getNegotiatedProtocolVersion();
    out.client = '@modelcontextprotocol/client ' + installed('client');
  }
  out.version = negotiated;
  return { client, call, prompts };
}

// summary is what the test looks at in a tool result.
function summary(res) {
  return {
    isError: !!res.isError,
    text: (res.content || []).filter((c) => c.type === 'text').map((c) => c.text).join('\n'),
    structured: res.structuredContent,
  };
}

// attempt records a case's outcome, or the error that ended it.
async function attempt(name, fn) {
  try {
    out.cases[name] = await fn();
  } catch (e) {
    out.cases[name] = { thrown: String(e && e.message ? e.message : e) };
  }
}

const shell = (command) => ({ name: 'run_shell', arguments: { command } });

// progressRecorder collects progress messages and resolves waitFor(substring) when one arrives.
function progressRecorder() {
  const messages = [];
  const waiters = [];
  return {
    messages,
    onprogress: (p) => {
      messages.push({ progress: p.progress, message: p.message });
      for (const w of waiters.splice(0)) w();
    },
    // waitFor resolves when a message contains s, and fails when call (the request's promise) ends first.
    waitFor: async (s, call) => {
      const ended = call.then(
        (r) => { throw new Error(`the call ended without a progress message with "${s}": ${JSON.stringify(r)}`); },
        (e) => { throw new Error(`the call failed without a progress message with "${s}": ${e}`); });
      ended.catch(() => {});
      while (!messages.some((m) => (m.message || '').includes(s))) {
        await Promise.race([new Promise((r) => waiters.push(r)), ended]);
      }
    },
  };
}

if (callerToken === 'get') {
  const c = await connect(approverToken);
  await attempt('get', async () => summary(await c.call({ name: 'toolpool_get_result', arguments: { id: getID, wait_seconds: 120 } })));
  process.stdout.write(JSON.stringify(out) + '\n');
  await c.client.close();
  process.exit(0);
}

const approver = await connect(approverToken, { headers: { 'Toolpool-Workspace': 'mcp-' + kind + '-' + version } });

await attempt('list', async () => {
  const res = await approver.client.listTools();
  const rest = await (await fetch(new URL('/v1/tools?format=mcp', base), { headers: { Authorization: `Bearer ${approverToken}` } })).json();
  // Both SDKs' own schemas of a tools/list result: 1.x's (2025-11-25) and 2.x's (@modelcontextprotocol/core).
  const { ListToolsResultSchema: ListToolsResult1 } = await import('@modelcontextprotocol/sdk/types.js');
  const check = async (schema, v) => {
    if (schema === 'core') {
      schema = (await import('@modelcontextprotocol/core')).ListToolsResultSchema;
    }
    const r = schema.safeParse(v);
    return r.success ? 'ok' : r.error.message;
  };
  return {
    tools: res.tools.map((t) => ({ name: t.name, annotations: t.annotations, outputSchema: !!t.outputSchema })),
    mcpValid1: await check(ListToolsResult1, res),
    mcpValid2: await check('core', res),
    restValid1: await check(ListToolsResult1, rest),
    restValid2: await check('core', rest),
    restNames: rest.tools.map((t) => t.name),
    restResultType: rest.resultType, restCacheScope: rest.cacheScope, restTTL: rest.ttlMs,
  };
});

await attempt('call', async () => summary(await approver.call(shell('echo hi; id -un'))));
await attempt('toolFailure', async () => summary(await approver.call(shell('echo oops >&2; exit 3'))));
await attempt('denied', async () => summary(await approver.call(shell('sudo ls'))));
await attempt('unknownTool', async () => summary(await approver.call({ name: 'no_such_tool', arguments: {} })));
await attempt('badWorkspace', async () => summary(await approver.call({ ...shell('true'), _meta: { 'toolpool/workspace': '../etc' } })));
await attempt('badArgs', async () => summary(await approver.call({ name: 'run_shell', arguments: { command: 7 } })));

await attempt('approval', async () => {
  const res = summary(await approver.call(shell('mkdir -p approved && echo made')));
  return { ...res, prompts: approver.prompts.splice(0) };
});

await attempt('progress', async () => {
  // The call prints a line every 0.1 s until a second call creates the file it waits for: it is seen
  // running, and its output arrives while it runs.
  const rec = progressRecorder();
  const gate = `gate-${kind}-${version}`;
  const p = approver.call(shell(`while [ ! -e ${gate} ]; do echo tick; sleep 0.1; done; echo released`), { onprogress: rec.onprogress });
  await rec.waitFor('tick', p);
  const touch = summary(await approver.call(shell(`touch ${gate}`)));
  const res = summary(await p);
  return { ...res, touch, progress: rec.messages };
});

await attempt('cancel', async () => {
  const rec = progressRecorder();
  const ac = new AbortController();
  const p = approver.call(shell('sleep 600'), { onprogress: rec.onprogress, signal: ac.signal });
  await rec.waitFor(' running', p);
  ac.abort('the user cancelled');
  let error = '';
  try {
    await p;
  } catch (e) {
    error = String(e && e.message ? e.message : e);
  }
  const id = (rec.messages[0].message.match(/call (c_[a-z2-7]+)/) || [])[1];
  return { id, error, progress: rec.messages };
});

// A caller token may not approve: the call waits, and a later connection fetches its result.
await attempt('pending', async () => {
  const caller = await connect(callerToken);
  const res = summary(await caller.call(shell('mkdir -p pending && echo made later')));
  await caller.client.close();
  return { ...res, prompts: caller.prompts };
});

process.stdout.write(JSON.stringify(out) + '\n');
await approver.client.close();
