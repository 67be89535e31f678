package fanout.pushy;

import com.eatthepath.pushy.apns.server.PushNotificationHandler;
import io.netty.handler.codec.http2.Http2Headers;
import io.netty.util.AsciiString;
import java.io.ByteArrayOutputStream;
import java.math.BigInteger;
import java.util.Base64;

/**
 * The one adaptation of Pushy's validating mock server: it verifies a provider token's ES256 signature with Java's
 * {@code SHA256withECDSA}, which takes the signature DER-encoded (the form Pushy's own client sends). RFC 7518 section
 * 3.4, which APNs follows, encodes it as the 64 bytes R || S (what fanout, jsonwebtoken and most JWT libraries send,
 * and what APNs accepts). This wrapper re-encodes such a signature as DER before Pushy's handler sees the request; the
 * token is then verified by Pushy's own code (key id, team id, signature, age, topic), unchanged. A DER signature (Pushy's
 * client) passes through untouched.
 */
final class JwsSignatures {
    private static final AsciiString AUTHORIZATION = new AsciiString("authorization");
    private static final String BEARER = "bearer ";

    private JwsSignatures() {}

    /** Wraps one connection's handler; the last token seen is converted once (clients reuse one for minutes). */
    static PushNotificationHandler acceptingJws(final PushNotificationHandler handler) {
        return new PushNotificationHandler() {
            private CharSequence lastSeen;
            private AsciiString lastConverted;

            @Override
            public void handlePushNotification(final Http2Headers headers, final io.netty.buffer.ByteBuf payload)
                    throws com.eatthepath.pushy.apns.server.RejectedNotificationException {
                final CharSequence authorization = headers.get(AUTHORIZATION);
                if (authorization != null) {
                    if (lastSeen == null || !AsciiString.contentEquals(lastSeen, authorization)) {
                        final String converted = toDer(authorization.toString());
                        lastSeen = new AsciiString(authorization);
                        lastConverted = converted == null ? null : new AsciiString(converted);
                    }
                    if (lastConverted != null) {
                        headers.set(AUTHORIZATION, lastConverted);
                    }
                }
                handler.handlePushNotification(headers, payload);
            }
        };
    }

    /**
     * {@code bearer <jwt>} with a 64-byte (R || S) signature, re-encoded with a DER signature; {@code null} when the
     * value is anything else (then Pushy judges it as it is).
     */
    static String toDer(final String authorization) {
        if (!authorization.startsWith(BEARER)) {
            return null;
        }
        final String jwt = authorization.substring(BEARER.length()).trim();
        final int dot = jwt.lastIndexOf('.');
        if (dot < 0) {
            return null;
        }
        final byte[] signature;
        try {
            signature = Base64.getUrlDecoder().decode(jwt.substring(dot + 1));
        } catch (final IllegalArgumentException e) {
            return null;
        }
        if (signature.length != 64) {
            return null;
        }
        final byte[] r = integer(signature, 0);
        final byte[] s = integer(signature, 32);
        final ByteArrayOutputStream der = new ByteArrayOutputStream(72);
        der.write(0x30);
        der.write(r.length + s.length);
        der.write(r, 0, r.length);
        der.write(s, 0, s.length);
        return BEARER + jwt.substring(0, dot + 1) + Base64.getUrlEncoder().withoutPadding().encodeToString(der.toByteArray());
    }

    /** A DER INTEGER of the unsigned 32 bytes at {@code offset}. */
    private static byte[] integer(final byte[] bytes, final int offset) {
        final byte[] unsigned = new byte[32];
        System.arraycopy(bytes, offset, unsigned, 0, 32);
        final byte[] value = new BigInteger(1, unsigned).toByteArray(); // minimal, with a 0 sign byte if needed
        final byte[] out = new byte[value.length + 2];
        out[0] = 0x02;
        out[1] = (byte) value.length;
        System.arraycopy(value, 0, out, 2, value.length);
        return out;
    }
}
