"""Independent RFC 9421 / RFC 9530 vectors for engine/src/gateway/signature.rs.

Signs a spec 002 notify request with Python's `http-message-signatures`
(PyPI, an implementation independent of ours) and prints the headers that
the Rust tests pin. Re-run to check them:

    python3 -m venv /tmp/hms && /tmp/hms/bin/pip install http-message-signatures==3.0.0
    /tmp/hms/bin/python engine/src/gateway/testdata/signature_vectors.py
"""

import base64
import datetime
import json

from cryptography.hazmat.primitives.asymmetric import ed25519
from http_message_signatures import HTTPMessageSigner, HTTPSignatureKeyResolver, algorithms

# A fixed test seed: 32 bytes 0x01..0x20.
SEED = bytes(range(1, 33))
KEY = ed25519.Ed25519PrivateKey.from_private_bytes(SEED)


class Keys(HTTPSignatureKeyResolver):
    def resolve_private_key(self, key_id):
        return KEY

    def resolve_public_key(self, key_id):
        return KEY.public_key()


class Request:
    def __init__(self, method, url, headers, body):
        self.method, self.url, self.headers, self.body = method, url, headers, body


BODY = (
    b'{"notification":{"push_target_id":"ak:pseudonym:push:kosc9iQ4gVct1OB-b6X364WIFIsJFVbVzn7BMBs1sm8",'
    b'"wakeup_kind":"message","devices":[{"device_id":"ak:device:0192f3a1-4c2b-7d5e-9f10-2a3b4c5d6e7f"}]}}'
)

request = Request(
    "POST",
    "https://push.example/_arkret/edge/push/notify",
    {
        "Content-Type": "application/json",
        "Arkret-Operation": "ak.edge.push.command.notify.v1",
        "Idempotency-Key": "8e03978e-40d5-43e8-bc93-6894a57f9324",
        "Source-Service-ID": "did:web:station.example",
        "Destination-Service-ID": "did:web:push.example",
    },
    BODY,
)

signer = HTTPMessageSigner(signature_algorithm=algorithms.ED25519, key_resolver=Keys())
signer.sign(
    request,
    key_id="station-key-1",
    created=datetime.datetime.fromtimestamp(1760600000, tz=datetime.timezone.utc),
    expires=datetime.datetime.fromtimestamp(1760600300, tz=datetime.timezone.utc),
    label="sig1",
    body=BODY,
    covered_component_ids=(
        "@method",
        "@target-uri",
        "arkret-operation",
        "idempotency-key",
        "source-service-id",
        "destination-service-id",
        "content-digest",
    ),
)

public = KEY.public_key().public_bytes_raw()
print(json.dumps({
    "public_key_x": base64.urlsafe_b64encode(public).rstrip(b"=").decode(),
    "content_digest": request.headers["Content-Digest"],
    "signature_input": request.headers["Signature-Input"],
    "signature": request.headers["Signature"],
}, indent=2))
