"""A merchant's server behind the gateway, as a real one is written: every notification is checked
with the provider's own SDK (providers.py) before the business runs, and answered with exactly
what the provider expects. It counts how often the business ran per business id, so a test can
prove that a notification was handled once however often it was delivered.

Started in-process by the sender tests (a thread serving 127.0.0.1 on a free port):

    POST /pay/alipay/notify       form, Alipay-signed        -> text/plain `success`
    POST /pay/wechat/v3/notify    JSON, WeChat v3 signed      -> 200 {"code":"SUCCESS"}
    POST /pay/wechat/v2/notify    XML, WeChat v2 signed       -> XML <return_code>SUCCESS
    POST /webhooks/stripe         JSON, Stripe-Signature      -> 200 {"received":true}
    POST /v1/charges              Stripe's API (form body)    -> a charge object
    POST /orders/<id>/pay         JSON                        -> {"order":id,"paid":true,"n":n}
    POST /m/<mchid>/orders        JSON {"out_trade_no"}       -> {"mchid","out_trade_no","n"}
    POST /events                  a CloudEvent, binary or structured mode (read with the
                                  `cloudevents` SDK)     -> {"accepted":id,"source":…,"n":n}

`slow[business_id] = seconds` makes the business take that long, `holds[business_id] = Event()`
until the test sets it (at most 30 s); `fail_first.add(business_id)`
makes its first run answer a failure the provider retries (Alipay: `fail`, WeChat v2: FAIL in
a 200, others: 500).
"""

import json
import re
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from providers import SUCCESS_V2, Alipay, WeChatV2, WeChatV3, stripe_verify


class Merchant:
    def __init__(self):
        self.alipay = Alipay()
        self.wechat_v3 = WeChatV3()
        self.wechat_v2 = WeChatV2()
        self.lock = threading.Lock()
        self.runs = {}
        self.rejected = 0
        self.slow = {}
        self.holds = {}
        self.fail_first = set()
        merchant = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                status, ctype, out = merchant.handle(self.path, self.headers, body)
                self.send_response(status)
                if ctype:
                    self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                try:
                    self.wfile.write(out)
                except OSError:
                    pass  # the gateway (or the provider) hung up

            # Frameworks upper-case the method: an HTTP/2 `:method: post` runs the POST handler.
            do_post = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def calls(self, business_id):
        with self.lock:
            return self.runs.get(business_id, 0)

    def _run(self, business_id):
        """The business: counted, then as slow as configured. Returns (run number, fail now)."""
        with self.lock:
            n = self.runs.get(business_id, 0) + 1
            self.runs[business_id] = n
        time.sleep(self.slow.get(business_id, 0))
        hold = self.holds.get(business_id)
        if hold is not None:
            hold.wait(30)
        return n, n == 1 and business_id in self.fail_first

    def _forged(self, status, ctype, out):
        with self.lock:
            self.rejected += 1
        return status, ctype, out

    def handle(self, path, headers, body):
        path = path.split("?", 1)[0]
        if path == "/pay/alipay/notify":
            form = dict(urllib.parse.parse_qsl(body.decode("utf-8"), keep_blank_values=True))
            if not self.alipay.verify(form):
                return self._forged(200, "text/plain", b"fail")
            _, fail = self._run(form["out_trade_no"])
            return 200, "text/plain", b"fail" if fail else b"success"
        if path == "/pay/wechat/v3/notify":
            note = self.wechat_v3.verify(headers, body)
            if not note:
                return self._forged(400, "application/json", json.dumps({"code": "FAIL", "message": "签名错误"}).encode())
            _, fail = self._run(note["resource"]["out_trade_no"])
            if fail:
                return 500, "application/json", json.dumps({"code": "FAIL", "message": "失败"}).encode()
            return 200, "application/json", json.dumps({"code": "SUCCESS", "message": "成功"}).encode()
        if path == "/pay/wechat/v2/notify":
            try:
                note = self.wechat_v2.verify(body)
            except Exception:
                return self._forged(200, "application/xml", b"<xml><return_code><![CDATA[FAIL]]></return_code></xml>")
            _, fail = self._run(note["transaction_id"])
            if fail:
                return 200, "application/xml", b"<xml><return_code><![CDATA[FAIL]]></return_code></xml>"
            return 200, "application/xml", SUCCESS_V2
        if path == "/pay/wechat/v2/refund-notify":
            try:
                refund = self.wechat_v2.verify_refund(body)
            except Exception:
                return self._forged(200, "application/xml", b"<xml><return_code><![CDATA[FAIL]]></return_code></xml>")
            self._run(refund["refund_id"])
            return 200, "application/xml", SUCCESS_V2
        if path == "/webhooks/stripe":
            try:
                event = stripe_verify(body.decode("utf-8"), headers.get("Stripe-Signature", ""))
            except Exception:
                return self._forged(400, "application/json", b'{"error":"bad signature"}')
            n, fail = self._run(event["id"])
            if fail:
                return 500, "application/json", b'{"error":"try again"}'
            return 200, "application/json", json.dumps({"received": True, "id": event["id"], "n": n}).encode()
        if path == "/v1/charges":
            form = dict(urllib.parse.parse_qsl(body.decode("utf-8")))
            n, _ = self._run(headers.get("Idempotency-Key", ""))
            charge = {"id": "ch_" + uuid.uuid4().hex[:24], "object": "charge", "amount": int(form.get("amount", 0)),
                      "currency": form.get("currency", "usd"), "n": n}
            return 200, "application/json", json.dumps(charge).encode()
        if path == "/events":
            from cloudevents.core.bindings.http import HTTPMessage, from_http
            from cloudevents.core.formats.json import JSONFormat
            event = from_http(HTTPMessage(headers={k.lower(): v for k, v in headers.items()}, body=body), JSONFormat())
            ident = "%s %s" % (event.get_source(), event.get_id())
            n, fail = self._run(ident)
            if fail:
                return 500, "application/json", b'{"error":"try again"}'
            return 200, "application/json", json.dumps({"accepted": event.get_id(), "source": event.get_source(),
                                                         "n": n}).encode()
        m = re.fullmatch(r"/orders/([^/]+)/pay", path)
        if m:
            order = urllib.parse.unquote(m.group(1))
            n, _ = self._run("order:" + order)
            return 200, "application/json", json.dumps({"order": order, "paid": True, "n": n}).encode()
        m = re.fullmatch(r"/m/([^/]+)/orders", path)
        if m:
            doc = json.loads(body or b"{}")
            n, _ = self._run("%s/%s" % (m.group(1), doc.get("out_trade_no")))
            return 201, "application/json", json.dumps({"mchid": m.group(1), "out_trade_no": doc.get("out_trade_no"),
                                                          "n": n}).encode()
        return 404, "application/json", b'{"error":"no such endpoint"}'
