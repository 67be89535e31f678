"""Verifies webhook pushes with the reference Standard Webhooks library.

Input (stdin): a JSON list of {"key_b64": ..., "headers": {...}, "body": ...}.
Exits non-zero unless every push verifies. The library is independent of
fanout's Rust code: it is the implementation PUSH-235 says receivers may use.
"""

import base64
import json
import sys

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def main() -> int:
    pushes = json.load(sys.stdin)
    failures = 0
    for i, push in enumerate(pushes):
        # fanout's keys are 16 to 64 raw bytes (not whsec_ strings): pass bytes.
        hook = Webhook(base64.b64decode(push["key_b64"]))
        try:
            hook.verify(push["body"].encode(), push["headers"])
        except WebhookVerificationError as e:
            failures += 1
            print(f"push {i}: {e}", file=sys.stderr)
    print(f"verified {len(pushes) - failures} of {len(pushes)} pushes")
    return 1 if failures or not pushes else 0


if __name__ == "__main__":
    sys.exit(main())
