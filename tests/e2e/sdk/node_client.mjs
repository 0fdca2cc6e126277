#!/usr/bin/env node
// One POST through a real Stainless-generated Node SDK (orb-billing), printed as one JSON line.
//
//   node node_client.mjs --base-url http://127.0.0.1:PORT --path /api/orders \
//       --timeout 2 --max-retries 3 --body '{"sku": "a"}'
//
// The request goes through the SDK's generic `client.post(path, { body })`, so it runs the
// SDK's own retry loop (Orb#makeRequest / #retryRequest): one auto-generated
// `Idempotency-Key: stainless-node-retry-<uuid4>` reused on every attempt, retries on
// timeouts / connection errors / 408 / 409 / 429 / 5xx, `retry-after-ms` / `Retry-After`
// honoured (no upper cap in this version), `x-should-retry` obeyed. See README.md.
//
// Every attempt is recorded through the SDK's `fetch` option (a wrapper around the global
// fetch), which also sees attempts that end in a timeout (abort) or connection error.
// Output: one JSON line on stdout, same shape as py_client.py:
//   {"ok", "status", "body", "error", "idempotency_key", "elapsed", "attempts": [
//     {"n", "method", "path", "idempotency_key", "retry_count", "authorization", "start", "end",
//      "status", "retry_after", "retry_after_ms", "x_should_retry", "error"}, ...]}
// `start`/`end` are seconds since the call began. Exit code 0 whenever the line was printed
// (look at "ok"), 2 on bad arguments. Run `npm ci` in this directory first.

import { parseArgs } from 'node:util';
import { performance } from 'node:perf_hooks';
import Orb from 'orb-billing';

function usage(msg) {
  process.stderr.write(`${msg}\nusage: node node_client.mjs --base-url URL --path /p [--timeout S] ` +
    `[--max-retries N] [--body JSON] [--api-key K] [--idempotency-key K] [--header NAME:VALUE]...\n`);
  process.exit(2);
}

let args;
try {
  ({ values: args } = parseArgs({
    options: {
      'base-url': { type: 'string' },
      path: { type: 'string' },
      timeout: { type: 'string', default: '60' },
      'max-retries': { type: 'string', default: '2' },
      body: { type: 'string', default: '{}' },
      'api-key': { type: 'string', default: 'idem-e2e-key' },
      'idempotency-key': { type: 'string' },
      header: { type: 'string', multiple: true, default: [] },
    },
  }));
} catch (err) {
  usage(String(err.message || err));
}
if (!args['base-url'] || !args.path) usage('--base-url and --path are required');

let body;
try {
  body = JSON.parse(args.body);
} catch (err) {
  usage(`--body is not JSON: ${err.message}`);
}
const timeoutMs = Math.round(Number(args.timeout) * 1000); // the SDK wants whole milliseconds
const maxRetries = Number.parseInt(args['max-retries'], 10);
if (!(timeoutMs > 0) || !(maxRetries >= 0)) usage('--timeout must be > 0 and --max-retries >= 0');
const headers = {};
for (const h of args.header) {
  const i = h.indexOf(':');
  if (i < 0) usage(`--header ${h}: expected NAME:VALUE`);
  headers[h.slice(0, i).trim()] = h.slice(i + 1).trim();
}

const t0 = performance.now();
const now = () => Math.round(performance.now() - t0) / 1000;
const attempts = [];

async function recordingFetch(url, init = {}) {
  const h = new Headers(init.headers);
  const u = new URL(String(url));
  const attempt = {
    n: attempts.length + 1,
    method: (init.method || 'GET').toUpperCase(),
    path: u.pathname + u.search,
    idempotency_key: h.get('idempotency-key'),
    retry_count: h.get('x-stainless-retry-count'),
    authorization: h.get('authorization'),
    start: now(),
    end: null,
    status: null,
    retry_after: null,
    retry_after_ms: null,
    x_should_retry: null,
    error: null,
  };
  attempts.push(attempt);
  try {
    const res = await fetch(url, init);
    attempt.end = now();
    attempt.status = res.status;
    attempt.retry_after = res.headers.get('retry-after');
    attempt.retry_after_ms = res.headers.get('retry-after-ms');
    attempt.x_should_retry = res.headers.get('x-should-retry');
    return res;
  } catch (err) {
    attempt.end = now();
    const cause = err && err.cause ? ` (${err.cause.name || ''}: ${err.cause.message || err.cause})` : '';
    attempt.error = `${err && err.name}: ${err && err.message}${cause}`;
    throw err;
  }
}

// The SDK logs through console.* (stdout for info/debug); keep stdout for the JSON line.
const stderrLogger = {
  error: (...a) => console.error(...a),
  warn: (...a) => console.error(...a),
  info: (...a) => console.error(...a),
  debug: (...a) => console.error(...a),
};

const client = new Orb({
  apiKey: args['api-key'],
  baseURL: args['base-url'],
  timeout: timeoutMs,
  maxRetries,
  fetch: recordingFetch,
  logger: stderrLogger,
});

const opts = { body };
if (Object.keys(headers).length) opts.headers = headers;
if (args['idempotency-key'] !== undefined) opts.idempotencyKey = args['idempotency-key'];

const out = { ok: false, status: null, body: null, error: null };
try {
  // Generic POST: the body is parsed as JSON when the answer is application/json (any shape,
  // no validation), else returned as text; 204 gives null.
  const { data, response } = await client.post(args.path, opts).withResponse();
  out.ok = true;
  out.status = response.status;
  out.body = data === undefined ? null : data;
} catch (err) {
  if (err instanceof Orb.APIError && typeof err.status === 'number') {
    // final non-2xx answer (not retryable, or retries exhausted); err.error is the parsed body
    out.status = err.status;
    out.body = err.error === undefined ? null : err.error;
  } else if (!(err instanceof Orb.APIError) && attempts.length) {
    // e.g. a 2xx labelled application/json whose body is not JSON (SyntaxError from the parser)
    out.status = attempts[attempts.length - 1].status;
  }
  out.error = `${err && err.constructor ? err.constructor.name : 'Error'}: ${err && err.message}`;
}
const keys = new Set(attempts.map((a) => a.idempotency_key));
out.idempotency_key = keys.size === 1 ? [...keys][0] : null;
out.elapsed = now();
out.attempts = attempts;
process.stdout.write(JSON.stringify(out) + '\n');
process.exit(0);
