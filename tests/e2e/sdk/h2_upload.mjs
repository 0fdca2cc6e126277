// Node's own http2 client uploading a body: N requests, one after the other, on one HTTP/2
// session (as a Node service calling an API does). Prints one JSON line per request:
// {"status": 200, "body": "..."} or {"error": "..."} when the client lost the answer.
//
//   node h2_upload.mjs URL N BODY_BYTES HEADERS_JSON
import http2 from "node:http2";

const [url, n, bytes, headersJson] = process.argv.slice(2);
const target = new URL(url);
const body = Buffer.alloc(Number(bytes), 0x61);
const extra = JSON.parse(headersJson || "{}");
const session = http2.connect(target.origin);
session.on("error", (e) => console.log(JSON.stringify({ error: "session: " + e.message })));

function once() {
  return new Promise((resolve) => {
    const req = session.request({
      ":method": "POST",
      ":path": target.pathname + target.search,
      "content-type": "application/octet-stream",
      "content-length": String(body.length),
      ...extra,
    });
    let status = 0;
    const chunks = [];
    req.on("response", (h) => { status = h[":status"]; });
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => resolve({ status, body: Buffer.concat(chunks).toString() }));
    req.on("error", (e) => resolve({ error: e.code || e.message, status }));
    req.end(body);
  });
}

for (let i = 0; i < Number(n); i++) {
  console.log(JSON.stringify(await once()));
}
session.close();
