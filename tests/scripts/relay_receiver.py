#!/usr/bin/env python3
"""An independent spec 003 push-server receiver for the end-to-end tests.

Verifies X-Gim-Signature exactly as spec 003 section 2.2 says, with nothing
but the Python standard library (hmac, hashlib): split the header on ",",
take t and v1, reject |now - t| > 300 s, HMAC-SHA256 over the ASCII bytes of
t, "." and the raw body, compare in constant time. Plain HTTP on 127.0.0.1
(the engine runs with dangerous_allow_plain_http). Each request is one JSON
line in OUT: {"valid", "why", "delivery", "body"}; it always answers 200.

usage: relay_receiver.py PORT SECRET_FILE OUT
"""

import hashlib
import hmac
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

PORT, SECRET_FILE, OUT = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with open(SECRET_FILE, "rb") as f:
    SECRET = f.read().rstrip(b"\r\n")


def verify(header, body):
    pairs = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    t, v1 = pairs.get("t"), pairs.get("v1")
    if t is None or v1 is None:
        return False, "missing t or v1"
    if abs(time.time() - int(t)) > 300:
        return False, "stale t"
    expected = hmac.new(SECRET, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, v1):
        return False, "bad v1"
    return True, "ok"


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        valid, why = verify(self.headers.get("X-Gim-Signature", ""), body)
        with open(OUT, "a") as out:
            record = {
                "valid": valid,
                "why": why,
                "delivery": self.headers.get("X-Gim-Delivery"),
                "content_type": self.headers.get("Content-Type"),
                "body": body.decode(),
            }
            out.write(json.dumps(record) + "\n")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
