#!/usr/bin/env python3
"""One POST through a real Stainless-generated Python SDK (orb-billing), printed as one JSON line.

    python py_client.py --base-url http://127.0.0.1:PORT --path /api/orders \
        --timeout 2 --max-retries 3 --body '{"sku": "a"}'

The request goes through the SDK's generic ``client.post(path, body=..., cast_to=object)``,
so it runs the SDK's own retry loop (Orb's ``SyncAPIClient.request``): one auto-generated
``Idempotency-Key: stainless-python-retry-<uuid4>`` reused on every attempt, retries on
timeouts / connection errors / 408 / 409 / 429 / 5xx, ``Retry-After`` / ``retry-after-ms``
honoured up to 60 s, ``x-should-retry`` obeyed. See README.md.

Every attempt is recorded by wrapping the transport of the ``httpx.Client`` handed to the SDK
(``http_client=``): unlike httpx event hooks, a transport wrapper also sees attempts that
end in a timeout or connection error. Output (stdout, exactly one line):

    {"ok": bool, "status": int|null, "body": json-or-text|null, "error": str|null,
     "idempotency_key": str|null, "elapsed": seconds, "attempts": [
        {"n": 1, "method": "POST", "path": "/api/orders", "idempotency_key": "...",
         "retry_count": "0", "authorization": "Bearer ...", "start": s, "end": s,
         "status": 409|null, "retry_after": "2"|null, "retry_after_ms": null,
         "x_should_retry": null, "error": null|"ReadTimeout: ..."}, ...]}

``start``/``end`` are seconds since the call began (monotonic). The exit code is 0 whenever
the JSON line was printed (look at "ok"), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import httpx
import orb


class RecordingTransport(httpx.BaseTransport):
    """Records each request the SDK sends (one per attempt) and how it ended."""

    def __init__(self, t0: float) -> None:
        self._inner = httpx.HTTPTransport()
        self._t0 = t0
        self.attempts: list[dict[str, Any]] = []

    def _now(self) -> float:
        return round(time.monotonic() - self._t0, 3)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        attempt: dict[str, Any] = {
            "n": len(self.attempts) + 1,
            "method": request.method,
            "path": request.url.raw_path.decode("ascii", "replace"),
            "idempotency_key": request.headers.get("idempotency-key"),
            "retry_count": request.headers.get("x-stainless-retry-count"),
            "authorization": request.headers.get("authorization"),
            "start": self._now(),
            "end": None,
            "status": None,
            "retry_after": None,
            "retry_after_ms": None,
            "x_should_retry": None,
            "error": None,
        }
        self.attempts.append(attempt)
        try:
            response = self._inner.handle_request(request)
        except Exception as err:  # timeouts and connection errors: the SDK decides whether to retry
            attempt["end"] = self._now()
            attempt["error"] = f"{type(err).__name__}: {err}"
            raise
        attempt["end"] = self._now()
        attempt["status"] = response.status_code
        attempt["retry_after"] = response.headers.get("retry-after")
        attempt["retry_after_ms"] = response.headers.get("retry-after-ms")
        attempt["x_should_retry"] = response.headers.get("x-should-retry")
        return response

    def close(self) -> None:
        self._inner.close()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:10000")
    p.add_argument("--path", required=True, help="request path, e.g. /api/orders (query string allowed)")
    p.add_argument("--timeout", type=float, default=60.0, help="per-attempt timeout in seconds (default 60)")
    p.add_argument("--max-retries", type=int, default=2, help="retries after the first attempt (default 2)")
    p.add_argument("--body", default="{}", help="JSON request body (default {})")
    p.add_argument("--api-key", default="idem-e2e-key", help="sent as Authorization: Bearer KEY")
    p.add_argument(
        "--idempotency-key",
        default=None,
        help="use this key instead of the SDK's auto-generated stainless-python-retry-<uuid4>",
    )
    p.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", help="extra request header")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        body = json.loads(args.body)
    except ValueError as err:
        print(f"--body is not JSON: {err}", file=sys.stderr)
        return 2
    headers: dict[str, str] = {}
    for h in args.header:
        name, sep, value = h.partition(":")
        if not sep:
            print(f"--header {h!r}: expected NAME:VALUE", file=sys.stderr)
            return 2
        headers[name.strip()] = value.strip()

    t0 = time.monotonic()
    transport = RecordingTransport(t0)
    http_client = httpx.Client(transport=transport)
    client = orb.Orb(
        api_key=args.api_key,
        base_url=args.base_url,
        timeout=args.timeout,
        max_retries=args.max_retries,
        http_client=http_client,
    )
    options: dict[str, Any] = {}
    if headers:
        options["headers"] = headers
    if args.idempotency_key is not None:
        options["idempotency_key"] = args.idempotency_key

    out: dict[str, Any] = {"ok": False, "status": None, "body": None, "error": None}
    try:
        # cast_to=object: the SDK returns the parsed JSON whatever its shape (or the text when
        # the answer is not application/json), without any model validation.
        result = client.post(args.path, body=body, cast_to=object, options=options)
        out["ok"] = True
        out["body"] = result
        if transport.attempts:
            out["status"] = transport.attempts[-1]["status"]
    except orb.APIStatusError as err:  # final non-2xx answer (not retryable, or retries exhausted)
        out["status"] = err.status_code
        out["body"] = err.body if err.body is not None else err.response.text
        out["error"] = f"{type(err).__name__}: {err}"
    except orb.APIError as err:  # APITimeoutError / APIConnectionError after the last retry
        out["error"] = f"{type(err).__name__}: {err}"
    except Exception as err:  # e.g. a 2xx labelled application/json whose body is not JSON
        if transport.attempts:
            out["status"] = transport.attempts[-1]["status"]
        out["error"] = f"{type(err).__name__}: {err}"
    finally:
        client.close()
    keys = {a["idempotency_key"] for a in transport.attempts}
    out["idempotency_key"] = keys.pop() if len(keys) == 1 else None
    out["elapsed"] = round(time.monotonic() - t0, 3)
    out["attempts"] = transport.attempts
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
