// Signs a Stripe webhook payload (stdin) as Stripe does, with the Node SDK's own signer:
//   node stripe_sign.mjs <endpoint secret>  ->  prints the Stripe-Signature header value
import Stripe from "stripe";

const secret = process.argv[2];
let payload = "";
process.stdin.setEncoding("utf8");
for await (const chunk of process.stdin) payload += chunk;
const stripe = new Stripe("sk_test_idem_e2e");
process.stdout.write(stripe.webhooks.generateTestHeaderString({ payload, secret }) + "\n");
