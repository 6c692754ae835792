#!/usr/bin/env node
// An independent Cursor agent client on Node built-ins only (node:http2, node:https, node:tls,
// node:http, node:fs, node:crypto): no npm packages, no generated code. It behaves like current
// real clients, so tests can check the simulator and the capture proxy against code we did not
// derive from our own Python client.
//
// Usage:
//   node tests/clients/node_agent_client.mjs --base-url https://127.0.0.1:PORT [options]
//
// Options:
//   --base-url URL         server (or a reverse-mode capture) base URL                 (required)
//   --ca FILE              CA certificate (PEM) to trust in addition to Node's defaults
//   --proxy URL            HTTP proxy to tunnel through with CONNECT (default: $HTTPS_PROXY /
//                          $https_proxy; --no-proxy ignores them)
//   --transport T          run (HTTP/2 bidi Run, the default) or runsse (HTTP/1.1 RunSSE + BidiAppend)
//   --framing F            runsse only: connect (default; RunSSE application/connect+proto, appends
//                          application/proto bare) or grpc-web (both application/grpc-web+proto,
//                          appends enveloped, 0x80 trailer frames read)
//   --append-content-type CT  runsse only: send BidiAppends with this content type whatever the
//                          framing (e.g. an enveloped body as application/proto, which the real
//                          service answers with 415)
//   --prompt TEXT          user message; the simulator picks a scenario with [scenario:NAME] in it
//   --model ID             model id (default "default")
//   --model-field F        requested_model (default) or model_details
//   --token TOKEN          bearer token (default "node-agent-client-token")
//   --conversation-id ID   conversation id (default: a new UUID)
//   --request-id ID        x-request-id / BidiRequestId (default: a new UUID)
//   --client-version V     x-cursor-client-version (default "cli-2026.01.01-nodetest")
//   --heartbeat-ms N       client heartbeat interval (default 5000)
//   --timeout-ms N         give up (exit 1) after this long without the response end (default 60000)
//   --cancel-after N       run only: reset the stream with RST_STREAM(CANCEL) after N server frames
//   --after-end A          run only, once the response ended: reset (RST_STREAM NO_ERROR, the
//                          default) or end (END_STREAM) the request stream it never half-closed
//   --ignore-exec KINDS    never answer execs of these kinds (comma-separated args names without
//                          `_args`: shell, read, request_context, …): a client whose handler for
//                          them never returns, neither result nor throw
//   --no-request-context   put the request context (environment, one MCP tool `nodetest___echo`) in
//                          the run request (UserMessageAction.request_context and mcp_tools) and never
//                          answer request_context_args, as the published Bun/TypeScript OpenAI-compatible
//                          proxy does since December 2025 (the service goes on without the answer)
//   --heartbeat-budget N   give up after N server heartbeats in a row with nothing else (not
//                          counting those that come while an answer's BidiAppend is unanswered):
//                          reset the Run stream (RST_STREAM CANCEL) or drop the RunSSE response, exit 1
//   --log FILE             write every frame sent and received as NDJSON:
//                          {"t": µs, "dir": "send"|"recv", "direction": "client"|"server",
//                           "transport": "run"|"runsse"|"bidi_append", "kind", "flags",
//                           "hex": the agent message (end-stream/trailer: its payload),
//                           "wire_hex": the bytes on the wire (envelope, or the append body),
//                           "seqno": append_seqno (appends only)}
//
// Behaviour: sends run_request (conversation_state, even empty; user_message_action; the model;
// conversation_id), answers every KV get/set, answers non-streaming execs (request_context, read,
// write, ls, grep, delete, mcp, shell) with a result alone, a streamed shell with stdout, exit, a
// final shell_result, then stream_close, and an exec it has no handler for with throw then
// stream_close; answers web-search interaction queries; sends client heartbeats; never half-closes
// its Run request stream; waits for the response END_STREAM (RunSSE: the response end).
// Prints one JSON summary line on stdout and exits 0 on a completed turn (turn_ended seen and the
// response ended without error), 1 otherwise, 2 on bad options.
// TLS key logging: NODE_OPTIONS=--tls-keylog=FILE works as for any Node program.

import fs from 'node:fs';
import http from 'node:http';
import http2 from 'node:http2';
import https from 'node:https';
import tls from 'node:tls';
import net from 'node:net';
import crypto from 'node:crypto';

// ---------------------------------------------------------------------------------------------
// options

function parseArgs(argv) {
  const opts = {
    baseUrl: null, ca: null, proxy: process.env.HTTPS_PROXY || process.env.https_proxy || null,
    transport: 'run', framing: 'connect', prompt: 'hello', model: 'default', modelField: 'requested_model',
    token: 'node-agent-client-token', conversationId: crypto.randomUUID(), requestId: crypto.randomUUID(),
    clientVersion: 'cli-2026.01.01-nodetest', heartbeatMs: 5000, timeoutMs: 60000, cancelAfter: null,
    afterEnd: 'reset', log: null, appendContentType: null, ignoreExec: '', heartbeatBudget: null,
    noRequestContext: false,
  };
  const names = {
    '--base-url': 'baseUrl', '--ca': 'ca', '--proxy': 'proxy', '--transport': 'transport', '--framing': 'framing',
    '--prompt': 'prompt', '--model': 'model', '--model-field': 'modelField', '--token': 'token',
    '--conversation-id': 'conversationId', '--request-id': 'requestId', '--client-version': 'clientVersion',
    '--heartbeat-ms': 'heartbeatMs', '--timeout-ms': 'timeoutMs', '--cancel-after': 'cancelAfter',
    '--after-end': 'afterEnd', '--log': 'log', '--append-content-type': 'appendContentType',
    '--ignore-exec': 'ignoreExec', '--heartbeat-budget': 'heartbeatBudget',
  };
  const numeric = new Set(['heartbeatMs', 'timeoutMs', 'cancelAfter', 'heartbeatBudget']);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--no-proxy') { opts.proxy = null; continue; }
    if (a === '--no-request-context') { opts.noRequestContext = true; continue; }
    if (a === '--help' || a === '-h') { usage(0); }
    const [flag, inline] = a.includes('=') ? [a.slice(0, a.indexOf('=')), a.slice(a.indexOf('=') + 1)] : [a, undefined];
    const key = names[flag];
    if (!key) fail(`unknown option ${a}`);
    const value = inline !== undefined ? inline : argv[++i];
    if (value === undefined) fail(`${flag} needs a value`);
    if (numeric.has(key)) {
      const n = Number(value);
      if (!Number.isFinite(n) || n < 0) fail(`${flag} ${value}: not a non-negative number`);
      opts[key] = n;
    } else {
      opts[key] = value;
    }
  }
  if (!opts.baseUrl) fail('--base-url is required');
  if (!['run', 'runsse'].includes(opts.transport)) fail(`--transport ${opts.transport}: use run or runsse`);
  if (!['connect', 'grpc-web'].includes(opts.framing)) fail(`--framing ${opts.framing}: use connect or grpc-web`);
  if (!['requested_model', 'model_details'].includes(opts.modelField)) fail(`--model-field ${opts.modelField}`);
  if (!['reset', 'end'].includes(opts.afterEnd)) fail(`--after-end ${opts.afterEnd}: use reset or end`);
  const kinds = new Set(Object.values(EXEC_ARGS));
  opts.ignoreExec = new Set(opts.ignoreExec.split(',').filter(Boolean));
  if (opts.noRequestContext) opts.ignoreExec.add('request_context');
  for (const k of opts.ignoreExec) if (!kinds.has(k)) fail(`--ignore-exec ${k}: not one of ${[...kinds].join(', ')}`);
  return opts;
}

function usage(code) {
  const text = fs.readFileSync(new URL(import.meta.url), 'utf8').split('\n')
    .filter((l) => l.startsWith('//')).map((l) => l.slice(3)).join('\n');
  process.stdout.write(text + '\n');
  process.exit(code);
}

function fail(msg) {
  process.stderr.write(`node_agent_client: ${msg}\n`);
  process.exit(2);
}

// ---------------------------------------------------------------------------------------------
// protobuf by hand: varints, length-delimited fields, a field-map decoder

function varint(value) {
  let v = BigInt(value);
  if (v < 0n) v += 1n << 64n;
  const out = [];
  while (v >= 0x80n) { out.push(Number(v & 0x7fn) | 0x80); v >>= 7n; }
  out.push(Number(v));
  return Buffer.from(out);
}

// msg([num, value], ...): numbers/booleans/bigints → varint (0/false omitted, as proto3 does),
// strings → UTF-8 (empty omitted), Buffers → bytes or a sub-message (written even when empty, so
// an empty conversation_state is `0a 00`). null/undefined fields are skipped.
function msg(...fields) {
  const parts = [];
  for (const [num, v] of fields) {
    if (v === null || v === undefined) continue;
    if (typeof v === 'number' || typeof v === 'bigint' || typeof v === 'boolean') {
      const n = typeof v === 'boolean' ? (v ? 1 : 0) : v;
      if (n === 0 || n === 0n) continue;
      parts.push(varint(num << 3), varint(n));
    } else {
      const bytes = typeof v === 'string' ? Buffer.from(v, 'utf8') : v;
      if (typeof v === 'string' && bytes.length === 0) continue;
      parts.push(varint((num << 3) | 2), varint(bytes.length), bytes);
    }
  }
  return Buffer.concat(parts);
}

function readVarint(buf, pos) {
  let result = 0n;
  let shift = 0n;
  for (;;) {
    if (pos >= buf.length) throw new Error('truncated varint');
    const b = buf[pos++];
    result |= BigInt(b & 0x7f) << shift;
    if (!(b & 0x80)) return [result, pos];
    shift += 7n;
    if (shift > 63n) throw new Error('varint too long');
  }
}

// decode(buf) → Map(field number → [values]); varints as BigInt, length-delimited as Buffer.
function decode(buf) {
  const fields = new Map();
  let pos = 0;
  while (pos < buf.length) {
    let key;
    [key, pos] = readVarint(buf, pos);
    const num = Number(key >> 3n);
    const wt = Number(key & 7n);
    let value;
    if (wt === 0) {
      [value, pos] = readVarint(buf, pos);
    } else if (wt === 2) {
      let len;
      [len, pos] = readVarint(buf, pos);
      const end = pos + Number(len);
      if (end > buf.length) throw new Error('truncated field');
      value = buf.subarray(pos, end);
      pos = end;
    } else if (wt === 1) {
      value = buf.subarray(pos, pos + 8); pos += 8;
    } else if (wt === 5) {
      value = buf.subarray(pos, pos + 4); pos += 4;
    } else {
      throw new Error(`unsupported wire type ${wt}`);
    }
    if (!fields.has(num)) fields.set(num, []);
    fields.get(num).push(value);
  }
  return fields;
}

const first = (fields, num) => (fields.has(num) ? fields.get(num)[0] : undefined);
const sub = (fields, num) => (fields.has(num) ? decode(first(fields, num)) : undefined);
const uint = (fields, num) => Number(first(fields, num) ?? 0n);
const text = (fields, num) => (fields.has(num) ? first(fields, num).toString('utf8') : '');
// the one member of a oneof present in a message (lowest field number among `candidates`)
const member = (fields, candidates) => candidates.find((n) => fields.has(n));

// ---------------------------------------------------------------------------------------------
// agent.v1 messages (field numbers: docs/protocol.md, workbench/schema/proto/agent/v1/agent.proto)

const SERVER_TOP = { 1: 'interaction_update', 2: 'exec_server_message', 3: 'conversation_checkpoint_update',
  4: 'kv_server_message', 5: 'exec_server_control_message', 7: 'interaction_query' };
const CLIENT_TOP = { 1: 'run_request', 2: 'exec_client_message', 3: 'kv_client_message', 4: 'conversation_action',
  5: 'exec_client_control_message', 6: 'interaction_response', 7: 'client_heartbeat', 8: 'prewarm_request' };
const UPDATE = { 1: 'text_delta', 2: 'tool_call_started', 3: 'tool_call_completed', 4: 'thinking_delta',
  5: 'thinking_completed', 7: 'partial_tool_call', 8: 'token_delta', 13: 'heartbeat', 14: 'turn_ended',
  15: 'tool_call_delta', 16: 'step_started', 17: 'step_completed' };
const EXEC_ARGS = { 2: 'shell', 3: 'write', 4: 'delete', 5: 'grep', 7: 'read', 8: 'ls', 9: 'diagnostics',
  10: 'request_context', 11: 'mcp', 14: 'shell_stream', 16: 'background_shell_spawn', 20: 'fetch' };

function kindOf(bytes, tops) {
  try {
    const f = decode(bytes);
    const top = [...f.keys()].find((n) => tops[n]);
    if (top === undefined) return bytes.length ? 'unknown' : 'empty';
    let kind = tops[top];
    if (tops === SERVER_TOP && top === 1) {
      const u = decode(first(f, 1));
      const m = [...u.keys()].find((n) => UPDATE[n]);
      if (m !== undefined) kind += '.' + UPDATE[m];
    } else if (tops === SERVER_TOP && top === 2) {
      const e = decode(first(f, 2));
      const m = [...e.keys()].find((n) => EXEC_ARGS[n]);
      if (m !== undefined) kind += '.' + EXEC_ARGS[m] + '_args';
    }
    return kind;
  } catch {
    return 'malformed';
  }
}

// The one tool a --no-request-context client offers: McpToolDefinition{1 name, 2 description,
// 4 provider_identifier, 5 tool_name, 6 input_schema_json}.
const ECHO_TOOL = () => msg([1, 'nodetest___echo'], [2, 'Echo the text back'], [4, 'nodetest'], [5, 'echo'],
  [6, JSON.stringify({ type: 'object', properties: { text: { type: 'string' } }, required: ['text'] })]);

// RequestContext{4 env{1 os_version, 2 workspace_paths, 3 shell, 10 time_zone, 11 project_folder}, 7 tools}
function requestContext() {
  const cwd = process.cwd();
  const env = msg([1, `${process.platform} node-${process.versions.node}`], [2, cwd], [3, process.env.SHELL || '/bin/sh'],
    [10, Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC'], [11, cwd]);
  return msg([4, env], [7, ECHO_TOOL()]);
}

function runRequest(o) {
  // AgentClientMessage{1 run_request: AgentRunRequest{1 conversation_state (empty, still written),
  // 2 action{1 user_message_action{1 user_message{1 text, 2 message_id, 4 mode = agent}[, 2 request_context]}},
  // 3 model_details | 9 requested_model {1 model_id}[, 4 mcp_tools{1 tool}], 5 conversation_id}}
  const userMessage = msg([1, o.prompt], [2, crypto.randomUUID()], [4, 1]);
  const action = msg([1, msg([1, userMessage], [2, o.noRequestContext ? requestContext() : null])]);
  const model = msg([1, o.model]);
  return msg([1, msg(
    [1, Buffer.alloc(0)],
    [2, action],
    [3, o.modelField === 'model_details' ? model : null],
    [4, o.noRequestContext ? msg([1, ECHO_TOOL()]) : null],
    [5, o.conversationId],
    [9, o.modelField === 'requested_model' ? model : null],
  )]);
}

const heartbeat = () => msg([7, Buffer.alloc(0)]);
const execClient = (id, execId, resultField, result) => msg([2, msg([1, id], [resultField, result], [15, execId])]);
const execControl = (memberField, body) => msg([5, msg([memberField, body])]);
const streamClose = (id) => execControl(1, msg([1, id]));

// What a current real client answers to one server message (a list of AgentClientMessage bytes).
function answers(bytes, blobs, ignoreExec = new Set()) {
  const f = decode(bytes);
  const out = [];
  if (f.has(4)) {  // kv_server_message
    const kv = sub(f, 4);
    const id = uint(kv, 1);
    if (kv.has(3)) {
      const args = sub(kv, 3);
      blobs.set(first(args, 1)?.toString('hex') ?? '', first(args, 2) ?? Buffer.alloc(0));
      out.push(msg([3, msg([1, id], [3, Buffer.alloc(0)])]));
    } else if (kv.has(2)) {
      const want = first(sub(kv, 2), 1)?.toString('hex') ?? '';
      const data = blobs.get(want);
      out.push(msg([3, msg([1, id], [2, data === undefined ? Buffer.alloc(0) : msg([1, data])])]));
    }
  } else if (f.has(2)) {  // exec_server_message
    const ex = sub(f, 2);
    const id = uint(ex, 1);
    const execId = text(ex, 15);
    const which = member(ex, [2, 3, 4, 5, 7, 8, 10, 11, 14]);
    const named = EXEC_ARGS[[...ex.keys()].find((n) => n !== 1 && n !== 15 && n !== 19)] ?? 'unknown';
    if (ignoreExec.has(named)) return out;  // a handler that never returns
    const args = which !== undefined ? sub(ex, which) : new Map();
    const shellOk = (cmd) => msg([1, msg([1, cmd], [2, text(args, 2)], [5, 'ok\n'])]);
    switch (which) {
      case 14: {  // shell_stream: events, then the final shell_result, then stream_close
        out.push(execClient(id, execId, 14, msg([1, msg([1, 'ok\n'])])));   // stdout
        out.push(execClient(id, execId, 14, msg([3, msg([2, text(args, 2)])])));  // exit{code 0, cwd}
        out.push(execClient(id, execId, 2, shellOk(text(args, 1))));
        out.push(streamClose(id));
        break;
      }
      case 2: out.push(execClient(id, execId, 2, shellOk(text(args, 1)))); break;
      case 3: out.push(execClient(id, execId, 3, msg([1, msg([1, text(args, 1)], [2, 1], [3, 1])]))); break;
      case 4: out.push(execClient(id, execId, 4, msg([1, msg([1, text(args, 1)])]))); break;
      case 5: out.push(execClient(id, execId, 5, msg([1, msg([1, text(args, 1)], [2, text(args, 2)], [3, 'content'])]))); break;
      case 7: out.push(execClient(id, execId, 7, msg([1, msg([1, text(args, 1)], [2, '(empty file)\n'], [3, 1])]))); break;
      case 8: out.push(execClient(id, execId, 8, msg([1, msg([1, msg([1, text(args, 1) || '/'])])]))); break;
      case 10: out.push(execClient(id, execId, 10, msg([1, msg([1, Buffer.alloc(0)])]))); break;
      case 11: out.push(execClient(id, execId, 11, msg([1, msg([1, msg([1, msg([1, 'ok'])])])]))); break;
      default: {
        out.push(execControl(2, msg([1, id], [2, `no handler for ${named}_args`])));
        out.push(streamClose(id));
      }
    }
  } else if (f.has(7)) {  // interaction_query: approve a web search, reject anything else
    const q = sub(f, 7);
    const id = uint(q, 1);
    const which = member(q, [2, 3, 4, 5, 6, 7, 8, 9]);
    if (which !== undefined) {
      const body = which === 2 ? msg([1, Buffer.alloc(0)]) : msg([2, msg([1, 'not supported by this client'])]);
      out.push(msg([6, msg([1, id], [which, body])]));
    }
  }
  return out;
}

function isTurnEnded(bytes) {
  try {
    const f = decode(bytes);
    return f.has(1) && decode(first(f, 1)).has(14);
  } catch {
    return false;
  }
}

// ---------------------------------------------------------------------------------------------
// framing

const envelope = (payload, flags = 0) => {
  const head = Buffer.alloc(5);
  head[0] = flags;
  head.writeUInt32BE(payload.length, 1);
  return Buffer.concat([head, payload]);
};

class Envelopes {
  constructor() { this.buf = Buffer.alloc(0); }
  feed(chunk) {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    const out = [];
    while (this.buf.length >= 5) {
      const n = this.buf.readUInt32BE(1);
      if (this.buf.length < 5 + n) break;
      out.push({ flags: this.buf[0], payload: Buffer.from(this.buf.subarray(5, 5 + n)), wire: Buffer.from(this.buf.subarray(0, 5 + n)) });
      this.buf = this.buf.subarray(5 + n);
    }
    return out;
  }
}

// ---------------------------------------------------------------------------------------------
// the session: log, counters, summary

class Session {
  constructor(o) {
    this.o = o;
    this.log = [];
    this.sent = 0;
    this.received = 0;
    this.turnEnded = false;
    this.endStream = false;
    this.endFrame = null;
    this.rstCode = null;
    this.status = null;
    this.error = null;
    this.blobs = new Map();
    this.quietBeats = 0;  // server heartbeats in a row with nothing else
    this.answersPosting = 0;  // appends other than heartbeats not answered yet (RunSSE)
    this.started = process.hrtime.bigint();
    this.finished = null;
    this.done = new Promise((resolve) => { this.finish = (err) => { if (err && !this.error) this.error = String(err.message || err); resolve(); }; });
  }
  record(dir, transport, kind, flags, hex, wire, extra = {}) {
    const t = Math.round((performance.timeOrigin + performance.now()) * 1000);  // wall clock, µs
    this.log.push({ t, dir, direction: dir === 'send' ? 'client' : 'server', transport, kind, flags, hex, wire_hex: wire, ...extra });
  }
  serverMessage(bytes, transport, flags, wire) {
    this.received++;
    const kind = kindOf(bytes, SERVER_TOP);
    this.record('recv', transport, kind, flags, bytes.toString('hex'), wire.toString('hex'));
    if (isTurnEnded(bytes)) this.turnEnded = true;
    // Heartbeats while our own answer is still on its way are no stall: the server has not seen it.
    if (kind !== 'interaction_update.heartbeat') this.quietBeats = 0;
    else if (this.answersPosting === 0) this.quietBeats++;
  }
  // true once the server has sent only heartbeats for longer than --heartbeat-budget allows
  overBudget() {
    return this.o.heartbeatBudget !== null && this.quietBeats >= this.o.heartbeatBudget;
  }
  serverEnd(kind, payload, flags, wire, transport) {
    this.received++;
    this.record('recv', transport, kind, flags, payload.toString('hex'), wire.toString('hex'));
  }
  summary() {
    const elapsed = Number(process.hrtime.bigint() - this.started) / 1e9;
    return {
      transport: this.o.transport, framing: this.o.framing, request_id: this.o.requestId,
      conversation_id: this.o.conversationId, http_status: this.status, turn_ended: this.turnEnded,
      end_stream: this.endStream, end_frame: this.endFrame, rst_code: this.rstCode,
      frames_sent: this.sent, frames_received: this.received, error: this.error,
      elapsed: Math.round(elapsed * 1000) / 1000,
    };
  }
  writeLog() {
    if (this.o.log) fs.writeFileSync(this.o.log, this.log.map((e) => JSON.stringify(e)).join('\n') + (this.log.length ? '\n' : ''));
  }
}

function endFrameCode(payload) {
  try {
    const doc = JSON.parse(payload.toString('utf8') || '{}');
    return doc.error ? String(doc.error.code || 'unknown') : 'ok';
  } catch {
    return 'malformed';
  }
}

function trailerStatus(payload) {
  const m = /grpc-status:\s*(\d+)/i.exec(payload.toString('utf8'));
  return m ? Number(m[1]) : null;
}

// ---------------------------------------------------------------------------------------------
// connections: direct, or tunnelled through an HTTP proxy with CONNECT

function tlsOptions(o, host, alpn) {
  const opts = { ALPNProtocols: alpn };
  if (o.ca) opts.ca = [...tls.rootCertificates, fs.readFileSync(o.ca, 'utf8')];
  if (net.isIP(host)) opts.host = host; else opts.servername = host;
  return opts;
}

function tunnel(proxyUrl, host, port) {
  return new Promise((resolve, reject) => {
    const p = new URL(proxyUrl);
    const req = http.request({ host: p.hostname, port: Number(p.port || 80), method: 'CONNECT', path: `${host}:${port}`,
      headers: { host: `${host}:${port}` } });
    req.once('connect', (res, socket) => {
      if (res.statusCode !== 200) { socket.destroy(); reject(new Error(`proxy CONNECT answered ${res.statusCode}`)); return; }
      resolve(socket);
    });
    req.once('error', reject);
    req.end();
  });
}

async function secureSocket(o, host, port, alpn) {
  const base = tlsOptions(o, host, alpn);
  if (!o.proxy) return tls.connect({ ...base, host, port });
  const raw = await tunnel(o.proxy, host, port);
  return tls.connect({ ...base, socket: raw });
}

// ---------------------------------------------------------------------------------------------
// Run: one HTTP/2 bidi stream, never half-closed by us

async function runH2(o, s) {
  const base = new URL(o.baseUrl);
  const host = base.hostname.replace(/^\[|\]$/g, '');
  const port = Number(base.port || 443);
  const socket = await secureSocket(o, host, port, ['h2']);
  const client = http2.connect(base.origin, { createConnection: () => socket });
  client.on('error', (err) => s.finish(err));
  client.on('goaway', (code) => { if (code !== 0 && !s.endStream) s.finish(new Error(`GOAWAY ${code}`)); });
  const req = client.request({
    ':method': 'POST', ':path': `${base.pathname.replace(/\/$/, '')}/agent.v1.AgentService/Run`,
    'content-type': 'application/connect+proto', 'connect-protocol-version': '1', te: 'trailers',
    authorization: `Bearer ${o.token}`, 'x-request-id': o.requestId, 'x-cursor-client-version': o.clientVersion,
    'user-agent': 'node-agent-client/1 (node:http2)',
  }, { endStream: false });
  let open = true;
  const send = (bytes) => {
    if (!open) return;
    const wire = envelope(bytes);
    req.write(wire);
    s.sent++;
    s.record('send', 'run', kindOf(bytes, CLIENT_TOP), 0, bytes.toString('hex'), wire.toString('hex'));
  };
  const frames = new Envelopes();
  req.on('response', (headers) => { s.status = Number(headers[':status']); });
  req.on('data', (chunk) => {
    for (const { flags, payload, wire } of frames.feed(chunk)) {
      if (flags & 0x02) {
        s.endFrame = endFrameCode(payload);
        s.serverEnd(s.endFrame === 'ok' ? 'end_stream' : 'end_stream.error', payload, flags, wire, 'run');
        continue;
      }
      s.serverMessage(payload, 'run', flags, wire);
      for (const a of answers(payload, s.blobs, o.ignoreExec)) send(a);
      if (o.cancelAfter !== null && s.received >= o.cancelAfter && open) {
        open = false;
        s.cancelled = true;
        req.close(http2.constants.NGHTTP2_CANCEL);
      } else if (s.overBudget() && open) {
        open = false;
        s.cancelled = true;
        s.finish(new Error(`heartbeat budget: ${s.quietBeats} server heartbeats in a row`));
        req.close(http2.constants.NGHTTP2_CANCEL);
      }
    }
  });
  req.on('end', () => {  // the response's END_STREAM (Node also ends the readable side on a reset)
    if (s.cancelled || req.rstCode) return;
    s.endStream = true;
    if (open) {
      open = false;
      if (o.afterEnd === 'end') req.end(); else req.close(http2.constants.NGHTTP2_NO_ERROR);
    }
    s.finish();
  });
  req.on('close', () => {
    if (req.rstCode) s.rstCode = req.rstCode;
    if (!s.endStream) s.finish(new Error(s.cancelled ? 'cancelled by this client' : `stream closed without END_STREAM (rst code ${req.rstCode})`));
  });
  req.on('error', (err) => s.finish(err));
  send(runRequest(o));
  const beat = setInterval(() => send(heartbeat()), o.heartbeatMs);
  await s.done;
  clearInterval(beat);
  // Give a reset the server sends right after END_STREAM (to stop our request body) a moment.
  await new Promise((r) => setTimeout(r, 50));
  if (req.rstCode && s.rstCode === null) s.rstCode = req.rstCode;
  client.close();
  setTimeout(() => client.destroy(), 1000).unref();
}

// ---------------------------------------------------------------------------------------------
// RunSSE + BidiAppend over HTTP/1.1

async function runSse(o, s) {
  const base = new URL(o.baseUrl);
  const host = base.hostname.replace(/^\[|\]$/g, '');
  const port = Number(base.port || 443);
  const prefix = base.pathname.replace(/\/$/, '');
  const grpcWeb = o.framing === 'grpc-web';
  const agent = new https.Agent({ keepAlive: true, maxSockets: 16 });
  agent.createConnection = (options, cb) => {
    secureSocket(o, host, port, ['http/1.1']).then((sock) => cb(null, sock), (err) => cb(err));
  };
  const common = {
    authorization: `Bearer ${o.token}`, 'x-request-id': o.requestId, 'x-cursor-client-version': o.clientVersion,
    'user-agent': 'node-agent-client/1 (node:https)',
  };
  let seqno = 0;
  let chain = Promise.resolve();
  let beat = null;
  const append = (bytes) => {
    const kind = kindOf(bytes, CLIENT_TOP);
    const answer = kind !== 'client_heartbeat';
    if (answer) s.answersPosting++;
    // In order, one at a time: the recording and the server see seqno order either way. A seqno
    // is taken when the append leaves, so a heartbeat dropped from the queue leaves no gap.
    chain = chain.then(() => new Promise((resolved) => {
      const resolve = () => { if (answer) s.answersPosting--; resolved(); };
      if (!answer && s.endStream) { resolve(); return; }  // the run is over: a queued heartbeat is moot
      const n = seqno++;
      const req = msg([1, bytes.toString('hex')], [2, msg([1, o.requestId])], [3, n]);
      const body = grpcWeb ? envelope(req) : req;
      s.sent++;
      s.record('send', 'bidi_append', kind, 0, bytes.toString('hex'), body.toString('hex'), { seqno: n });
      const r = https.request({
        agent, host, port, method: 'POST', path: `${prefix}/aiserver.v1.BidiService/BidiAppend`,
        headers: {
          ...common,
          'content-type': o.appendContentType || (grpcWeb ? 'application/grpc-web+proto' : 'application/proto'),
          ...(grpcWeb ? { 'x-grpc-web': '1' } : { 'connect-protocol-version': '1' }), 'content-length': body.length,
        },
      }, (res) => {
        const parts = [];
        res.on('data', (c) => parts.push(c));
        res.on('end', () => {
          const reply = Buffer.concat(parts);
          let grpcStatus = res.headers['grpc-status'] !== undefined ? Number(res.headers['grpc-status']) : null;
          if (grpcWeb) for (const e of new Envelopes().feed(reply)) if (e.flags & 0x80) grpcStatus = trailerStatus(e.payload);
          const refused = res.statusCode !== 200 || (grpcStatus !== null && grpcStatus !== 0);
          // A heartbeat that crossed the end of the response is refused (the run is gone): that is no
          // failure of the turn.
          if (refused && !(kind === 'client_heartbeat' && s.endStream)) {
            s.finish(new Error(`BidiAppend seqno ${n} answered HTTP ${res.statusCode}` +
              (grpcStatus ? ` grpc-status ${grpcStatus}` : '')));
          }
          resolve();
        });
      });
      r.on('error', (err) => { s.finish(err); resolve(); });
      r.end(body);
    }));
  };
  const rid = msg([1, o.requestId]);
  const ridWire = envelope(rid);
  const stream = https.request({
    agent, host, port, method: 'POST', path: `${prefix}/agent.v1.AgentService/RunSSE`,
    headers: {
      ...common, 'content-type': grpcWeb ? 'application/grpc-web+proto' : 'application/connect+proto',
      ...(grpcWeb ? { 'x-grpc-web': '1' } : { 'connect-protocol-version': '1' }),
      'x-cursor-streaming': 'true', 'content-length': ridWire.length,
    },
  }, (res) => {
    s.status = res.statusCode;
    const frames = new Envelopes();
    res.on('data', (chunk) => {
      if (res.statusCode !== 200) return;
      for (const { flags, payload, wire } of frames.feed(chunk)) {
        if (flags & 0x80) {
          const st = trailerStatus(payload);
          s.endFrame = st === 0 ? 'ok' : `grpc-status ${st}`;
          s.serverEnd(st === 0 ? 'end_stream' : 'end_stream.error', payload, flags, wire, 'runsse');
        } else if (flags & 0x02) {
          s.endFrame = endFrameCode(payload);
          s.serverEnd(s.endFrame === 'ok' ? 'end_stream' : 'end_stream.error', payload, flags, wire, 'runsse');
        } else {
          s.serverMessage(payload, 'runsse', flags, wire);
          for (const a of answers(payload, s.blobs, o.ignoreExec)) append(a);
          if (s.overBudget()) {
            s.finish(new Error(`heartbeat budget: ${s.quietBeats} server heartbeats in a row`));
            res.destroy();
            return;
          }
        }
      }
    });
    res.on('end', () => {
      s.endStream = true;
      clearInterval(beat);  // the run is over: no more heartbeats (queued ones are dropped)
      if (res.statusCode !== 200) s.finish(new Error(`RunSSE answered HTTP ${res.statusCode}`));
      chain.then(() => s.finish());
    });
    res.on('error', (err) => s.finish(err));
  });
  stream.on('error', (err) => s.finish(err));
  stream.end(ridWire);
  s.sent++;
  s.record('send', 'runsse', 'bidi_request_id', 0, rid.toString('hex'), ridWire.toString('hex'));
  append(runRequest(o));
  beat = setInterval(() => { if (!s.endStream) append(heartbeat()); }, o.heartbeatMs);
  await s.done;
  clearInterval(beat);
  await chain;
  agent.destroy();
}

// ---------------------------------------------------------------------------------------------

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const s = new Session(o);
  const timer = setTimeout(() => s.finish(new Error(`timeout: no response end within ${o.timeoutMs} ms` +
    (s.turnEnded ? ' (turn_ended seen)' : ''))), o.timeoutMs);
  try {
    await (o.transport === 'run' ? runH2(o, s) : runSse(o, s));
  } catch (err) {
    s.finish(err);
  }
  clearTimeout(timer);
  s.writeLog();
  const summary = s.summary();
  process.stdout.write(JSON.stringify(summary) + '\n');
  const ok = summary.turn_ended && summary.end_stream && !summary.error;
  process.exitCode = ok ? 0 : 1;
  setTimeout(() => process.exit(process.exitCode), 200).unref();
}

main();
