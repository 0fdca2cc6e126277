"""Payment providers' notifications built, signed and verified with the providers' own SDKs (pinned
in requirements.txt), both sides: what Alipay, WeChat Pay and Stripe send, and what a merchant
server checks before it runs its business.

- Alipay: `alipay-sdk-python` (the official SDK) signs the notify's sign content with RSA2 and
  verifies it (`SignatureUtils`).
- WeChat Pay API v3: `wechatpayv3` signs the delivery (`utils.rsa_sign`) and the merchant's
  `WeChatPay.callback()` verifies and decrypts it; the AEAD_AES_256_GCM resource is encrypted with
  `cryptography` (the SDK only decrypts), anew for every delivery, as WeChat does.
- WeChat Pay API v2: `wechatpy` signs the XML (`calculate_signature`, `dict_to_xml`) and parses and
  verifies it (`WeChatPay.parse_payment_result`).
- Stripe webhooks: signed by the Node SDK (`stripe.webhooks.generateTestHeaderString`, see
  stripe_sign.mjs), verified by the Python SDK (`stripe.Webhook.construct_event`).
"""

import base64
import datetime
import hashlib
import json
import secrets
import string
import subprocess
import time
import urllib.parse
import uuid
from pathlib import Path

from alipay.aop.api.util.SignatureUtils import get_sign_content, sign_with_rsa2, verify_with_rsa
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from wechatpayv3 import WeChatPay as WeChatPayV3
from wechatpayv3 import WeChatPayType
from wechatpayv3.utils import load_private_key, rsa_sign
from wechatpy.pay import WeChatPay as WeChatPayV2
from wechatpy.pay.utils import calculate_signature, dict_to_xml

HERE = Path(__file__).resolve().parent


def _rsa_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem(key, private, pkcs1=False):
    if private:
        fmt = serialization.PrivateFormat.TraditionalOpenSSL if pkcs1 else serialization.PrivateFormat.PKCS8
        return key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption()).decode()
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


# ---------------------------------------------------------------------------------------- Alipay

class Alipay:
    """Alipay's side (sign) and the merchant's (verify) of the async notify, with one key pair."""

    APP_ID = "2021000000000001"

    def __init__(self):
        key = _rsa_key()
        # sign_with_rsa2 loads a PKCS#1 private key; verify_with_rsa an SPKI public key.
        self.private_key = _pem(key, True, pkcs1=True)
        self.public_key = _pem(key, False)

    def notify(self, out_trade_no, notify_id=None, delivery=0, trade_status="TRADE_SUCCESS", app_id=APP_ID):
        """Delivery number `delivery` of a notify, as a form body: its own `notify_time` (Alipay
        re-delivers minutes apart: 4m, 10m, …), so its own `sign`."""
        paid = datetime.datetime.now().replace(microsecond=0)
        now = (paid + datetime.timedelta(minutes=4 * delivery)).strftime("%Y-%m-%d %H:%M:%S")
        params = {
            "notify_time": now, "notify_type": "trade_status_sync",
            "notify_id": notify_id or "2024" + uuid.uuid4().hex, "app_id": app_id, "charset": "utf-8",
            "version": "1.0", "sign_type": "RSA2", "trade_no": "2024" + uuid.uuid4().hex[:24],
            "out_trade_no": out_trade_no, "trade_status": trade_status, "total_amount": "88.88",
            "subject": "测试订单 & co", "gmt_payment": paid.strftime("%Y-%m-%d %H:%M:%S"),
        }
        content = get_sign_content({k: v for k, v in params.items() if k not in ("sign", "sign_type")})
        params["sign"] = sign_with_rsa2(self.private_key, content, "utf-8")
        return params["notify_id"], urllib.parse.urlencode(params)

    def verify(self, form):
        """What the merchant server checks ("rsaCheckV1"): the sign over every other field."""
        form = dict(form)
        sign = form.pop("sign", "")
        form.pop("sign_type", None)
        content = get_sign_content({k: v for k, v in form.items() if v != ""})
        try:
            return bool(verify_with_rsa(self.public_key, content.encode("utf-8"), sign))
        except Exception:  # rsa.VerificationError: a forged or altered notify
            return False


# ------------------------------------------------------------------------------ WeChat Pay API v3

class WeChatV3:
    """WeChat Pay's side (encrypt, sign) and the merchant's (`WeChatPay.callback`) of a v3 notify."""

    APIV3_KEY = "0123456789abcdef0123456789ABCDEF"
    MCHID = "1900000109"
    APPID = "wxd678efh567hg6787"
    PUB_KEY_ID = "PUB_KEY_ID_0119000001092025010100000000000001"

    def __init__(self):
        platform = _rsa_key()
        self.platform_private = _pem(platform, True)
        # "WeChat Pay public key" mode: the SDK verifies with this key and fetches nothing.
        self.merchant = WeChatPayV3(
            wechatpay_type=WeChatPayType.NATIVE, mchid=self.MCHID, private_key=_pem(_rsa_key(), True),
            cert_serial_no="MERCHANTCERTSERIAL01", appid=self.APPID, apiv3_key=self.APIV3_KEY,
            public_key=_pem(platform, False), public_key_id=self.PUB_KEY_ID)

    def notify(self, out_trade_no, notify_id):
        """One delivery: the resource encrypted anew (new nonce, new ciphertext), signed anew."""
        transaction = {"appid": self.APPID, "mchid": self.MCHID, "out_trade_no": out_trade_no,
                       "transaction_id": "4200000" + uuid.uuid4().hex[:21].upper(), "trade_state": "SUCCESS",
                       "amount": {"total": 100, "currency": "CNY"}}
        nonce = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(12))
        ciphertext = AESGCM(self.APIV3_KEY.encode()).encrypt(
            nonce.encode(), json.dumps(transaction, separators=(",", ":")).encode(), b"transaction")
        body = json.dumps({
            "id": notify_id, "create_time": "2026-12-02T10:00:01+08:00", "resource_type": "encrypt-resource",
            "event_type": "TRANSACTION.SUCCESS", "summary": "支付成功",
            "resource": {"original_type": "transaction", "algorithm": "AEAD_AES_256_GCM",
                         "ciphertext": base64.b64encode(ciphertext).decode(), "associated_data": "transaction",
                         "nonce": nonce},
        }, ensure_ascii=False, separators=(",", ":"))
        ts, hdr_nonce = str(int(time.time())), uuid.uuid4().hex.upper()
        headers = {
            "Content-Type": "application/json",
            "Wechatpay-Timestamp": ts, "Wechatpay-Nonce": hdr_nonce, "Wechatpay-Serial": self.PUB_KEY_ID,
            "Wechatpay-Signature": rsa_sign(load_private_key(self.platform_private), "%s\n%s\n%s\n" % (ts, hdr_nonce, body)),
            "Wechatpay-Signature-Type": "WECHATPAY2-SHA256-RSA2048",
        }
        return headers, body.encode()

    def verify(self, headers, body):
        """The merchant's check: the decrypted notification, or None for a forged one."""
        return self.merchant.callback(headers, body)


# ------------------------------------------------------------------------------ WeChat Pay API v2

class WeChatV2:
    """WeChat Pay's side (sign the XML) and the merchant's (`parse_payment_result`) of a v2 notify."""

    API_KEY = "192006250b4c09247ec02edce69f6a2d"
    APPID = "wx2421b1c4370ec43b"
    MCHID = "10000100"

    def __init__(self):
        self.merchant = WeChatPayV2(appid=self.APPID, api_key=self.API_KEY, mch_id=self.MCHID)

    def notify(self, transaction_id, out_trade_no, mch_id=MCHID):
        """One delivery: a new `nonce_str`, signed anew (MD5, v2's default)."""
        params = {"appid": self.APPID, "mch_id": mch_id, "nonce_str": uuid.uuid4().hex, "result_code": "SUCCESS",
                  "return_code": "SUCCESS", "openid": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o", "trade_type": "JSAPI",
                  "bank_type": "CMC", "total_fee": "100", "cash_fee": "100", "fee_type": "CNY",
                  "transaction_id": transaction_id, "out_trade_no": out_trade_no, "time_end": "20261202100000"}
        return dict_to_xml(params, calculate_signature(params, self.API_KEY)).encode("utf-8")

    def verify(self, body):
        """The merchant's check: the notification's fields (raises on a bad signature)."""
        return self.merchant.parse_payment_result(body)

    def refund_notify(self, refund_id, out_refund_no, transaction_id):
        """One delivery of a refund notification: the refund inside `req_info`, encrypted as
        WeChat Pay does (wechatpy's RefundCrypto: AES-256-ECB, key = MD5 of the API key); a new
        `nonce_str` each time, the same `req_info`."""
        from wechatpy.crypto import RefundCrypto
        fields = {"out_refund_no": out_refund_no, "out_trade_no": "O-" + out_refund_no, "refund_account":
                  "REFUND_SOURCE_RECHARGE_FUNDS", "refund_fee": "100", "refund_id": refund_id,
                  "refund_recv_accout": "招商银行信用卡0403", "refund_request_source": "API", "refund_status": "SUCCESS",
                  "settlement_refund_fee": "100", "settlement_total_fee": "100",
                  "success_time": "2026-12-02 10:00:00", "total_fee": "100", "transaction_id": transaction_id}
        root = "<root>%s</root>" % "".join("<%s><![CDATA[%s]]></%s>" % (k, v, k) for k, v in fields.items())
        key = hashlib.md5(self.API_KEY.encode()).hexdigest().encode()
        req_info = RefundCrypto(key).encrypt(root.encode("utf-8")).decode()
        return ("<xml><return_code>SUCCESS</return_code><appid><![CDATA[%s]]></appid><mch_id><![CDATA[%s]]></mch_id>"
                "<nonce_str><![CDATA[%s]]></nonce_str><req_info><![CDATA[%s]]></req_info></xml>"
                % (self.APPID, self.MCHID, uuid.uuid4().hex, req_info)).encode("utf-8")

    def verify_refund(self, body):
        """The merchant's side: `req_info` decrypted (wechatpy's WeChatRefundCrypto), the refund's fields."""
        from wechatpy.crypto import WeChatRefundCrypto
        return WeChatRefundCrypto(self.API_KEY).decrypt_message(body, self.APPID, self.MCHID)


SUCCESS_V2 = b"<xml><return_code><![CDATA[SUCCESS]]></return_code><return_msg><![CDATA[OK]]></return_msg></xml>"


# ------------------------------------------------------------------------------- Stripe webhooks

STRIPE_WEBHOOK_SECRET = "whsec_idem_e2e_0123456789"


def stripe_event(event_id, amount, pending_webhooks=1):
    """A Stripe event as Stripe delivers it (`pending_webhooks` changes between deliveries)."""
    return json.dumps({"id": event_id, "object": "event", "api_version": "2024-06-20", "created": int(time.time()),
                       "type": "charge.succeeded", "pending_webhooks": pending_webhooks, "livemode": False,
                       "data": {"object": {"id": "ch_" + event_id[4:], "object": "charge", "amount": amount}}},
                      separators=(",", ":"))


def stripe_signature(payload):
    """`Stripe-Signature` for this delivery, from the Node SDK's own signer (a new timestamp)."""
    r = subprocess.run(["node", str(HERE / "stripe_sign.mjs"), STRIPE_WEBHOOK_SECRET], input=payload,
                       capture_output=True, text=True, timeout=30, cwd=str(HERE))
    if r.returncode != 0:
        raise RuntimeError("stripe_sign.mjs failed: %s" % r.stderr)
    return r.stdout.strip()


def stripe_verify(payload, signature):
    """The merchant's check (`stripe.Webhook.construct_event`): the event, or raises."""
    import stripe
    return stripe.Webhook.construct_event(payload, signature, STRIPE_WEBHOOK_SECRET)
