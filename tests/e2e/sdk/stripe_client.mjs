// One charge through Stripe's own Node SDK, against a Stripe-shaped API behind Envoy + idem:
//   node stripe_client.mjs --port N --key K --amount A [--max-retries R] [--timeout-ms T]
// prints one JSON line: {"ok":true,"charge":{…},"status":…} when the SDK resolved (it thinks the
// charge succeeded), or {"ok":false,"type":…,"code":…,"status":…,"message":…} when it raised.
import Stripe from "stripe";

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
};
const stripe = new Stripe("sk_test_idem_e2e", {
  host: "127.0.0.1",
  port: Number(arg("port")),
  protocol: "http",
  maxNetworkRetries: Number(arg("max-retries", "0")),
  timeout: Number(arg("timeout-ms", "20000")),
});
try {
  const charge = await stripe.charges.create(
    { amount: Number(arg("amount")), currency: "usd" },
    { idempotencyKey: arg("key") },
  );
  const r = charge.lastResponse || {};
  console.log(JSON.stringify({ ok: true, charge, status: r.statusCode, replayed: (r.headers || {})["idempotent-replayed"] || null }));
} catch (e) {
  console.log(JSON.stringify({
    ok: false, type: e.type, rawType: e.rawType ?? null, code: e.code ?? null, status: e.statusCode ?? null,
    message: e.message, shouldRetry: (e.headers || {})["stripe-should-retry"] ?? null,
  }));
}
