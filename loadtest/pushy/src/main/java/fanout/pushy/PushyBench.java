package fanout.pushy;

import com.eatthepath.pushy.apns.ApnsClient;
import com.eatthepath.pushy.apns.ApnsClientBuilder;
import com.eatthepath.pushy.apns.DeliveryPriority;
import com.eatthepath.pushy.apns.PushType;
import com.eatthepath.pushy.apns.auth.ApnsSigningKey;
import com.eatthepath.pushy.apns.auth.ApnsVerificationKey;
import com.eatthepath.pushy.apns.server.AcceptAllPushNotificationHandlerFactory;
import com.eatthepath.pushy.apns.server.MockApnsServer;
import com.eatthepath.pushy.apns.server.MockApnsServerBuilder;
import com.eatthepath.pushy.apns.server.MockApnsServerListener;
import com.eatthepath.pushy.apns.server.PushNotificationHandlerFactory;
import com.eatthepath.pushy.apns.server.RejectionReason;
import com.eatthepath.pushy.apns.server.ValidatingPushNotificationHandlerFactory;
import com.eatthepath.pushy.apns.util.SimpleApnsPushNotification;
import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.channel.nio.NioEventLoopGroup;
import io.netty.handler.codec.http2.Http2Headers;
import java.io.BufferedOutputStream;
import java.io.File;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.lang.management.ManagementFactory;
import java.lang.reflect.Field;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.security.KeyFactory;
import java.security.interfaces.ECPublicKey;
import java.security.spec.X509EncodedKeySpec;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

/**
 * The load harness's Pushy peer, two modes:
 *
 * <ul>
 *   <li>{@code server}: Pushy's validating {@link MockApnsServer} on 127.0.0.1. Prints {@code P <port>} first, then
 *       one line per push: {@code A <device token> <payload>} when accepted, {@code R <reason>} when rejected, through
 *       a buffer flushed every {@code --flush-ms} (not per line: this process's CPU is the measured peer's). Exits when
 *       stdin closes. With {@code --validate false} it accepts every push unchecked (Pushy's accept-all handler).</li>
 *   <li>{@code client}: Pushy's {@link ApnsClient} sending the pushes of a file ({@code <token> <collapse id> <body>}
 *       per line) with a bounded number in flight, after a warm-up; prints one JSON line with its rate and CPU.
 *       With {@code --measure 0} it sends the warm-up alone.</li>
 * </ul>
 *
 * Options are {@code --name value}; see {@code usage()}. Nothing secret is printed.
 */
public final class PushyBench {
    private PushyBench() {}

    public static void main(final String[] argv) throws Exception {
        if (argv.length == 0 || !(argv[0].equals("server") || argv[0].equals("client"))) {
            usage();
        }
        final Map<String, String> options = new HashMap<>();
        for (int i = 1; i < argv.length; i++) {
            if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
                usage();
            }
            options.put(argv[i].substring(2), argv[++i]);
        }
        final Options o = new Options(options);
        if (argv[0].equals("server")) {
            server(o);
        } else {
            client(o);
        }
    }

    private static void usage() {
        System.err.println("usage: PushyBench server --cert-chain PEM --private-key PKCS8-PEM --tokens FILE"
                + " --verification-key SPKI-PEM --team-id T --key-id K --bundle-id B [--port 0] [--threads 2]"
                + " [--flush-ms 20] [--validate true|false]\n"
                + "       PushyBench client --port P --ca PEM --signing-key P8 --team-id T --key-id K --bundle-id B"
                + " --pushes FILE [--connections 1] [--in-flight 1000] [--threads N] [--warmup 10000]"
                + " [--timeout-seconds 600] [--measure 1]");
        System.exit(2);
    }

    /** Required and optional `--name value` options. */
    private record Options(Map<String, String> values) {
        String get(final String name) {
            final String value = values.get(name);
            if (value == null) {
                System.err.println("missing --" + name);
                usage();
            }
            return value;
        }

        int integer(final String name, final int fallback) {
            return values.containsKey(name) ? Integer.parseInt(values.get(name)) : fallback;
        }

        File file(final String name) {
            return new File(get(name));
        }
    }

    // ---- server ----

    private static void server(final Options o) throws Exception {
        final String bundleId = o.get("bundle-id");
        final Set<String> tokens = new HashSet<>();
        for (final String line : Files.readAllLines(o.file("tokens").toPath(), StandardCharsets.US_ASCII)) {
            if (!line.isBlank()) {
                tokens.add(line.trim());
            }
        }
        final ApnsVerificationKey verificationKey =
                new ApnsVerificationKey(o.get("key-id"), o.get("team-id"), readSpki(o.file("verification-key")));
        final Map<String, Set<String>> tokensByTopic = new HashMap<>();
        tokensByTopic.put(bundleId, tokens);
        final Map<String, ApnsVerificationKey> keysById = new HashMap<>();
        keysById.put(verificationKey.getKeyId(), verificationKey);
        final Map<ApnsVerificationKey, Set<String>> topicsByKey = new HashMap<>();
        topicsByKey.put(verificationKey, Set.of(bundleId));
        final ValidatingPushNotificationHandlerFactory validating =
                new ValidatingPushNotificationHandlerFactory(tokensByTopic, new HashMap<>(), keysById, topicsByKey);
        // `--validate false`: Pushy's accept-all handler, so the server's per-push cost (mostly the ES256
        // verification of every provider token) does not cap both clients at the same rate.
        final PushNotificationHandlerFactory factory = "false".equals(o.values().get("validate"))
                ? new AcceptAllPushNotificationHandlerFactory()
                : session -> JwsSignatures.acceptingJws(validating.buildHandler(session));

        final OutputStream out = new BufferedOutputStream(new FileOutputStream(FileDescriptor.out), 1 << 18);
        final LineListener listener = new LineListener(out);
        final NioEventLoopGroup group = new NioEventLoopGroup(o.integer("threads", 2));
        final MockApnsServer server = new MockApnsServerBuilder()
                .setServerCredentials(o.file("cert-chain"), o.file("private-key"), null)
                .setHandlerFactory(factory)
                .setListener(listener)
                .setEventLoopGroup(group)
                .setUseAlpn(true)
                .build();
        // MockApnsServer.start(port) binds every interface; the harness stays on loopback.
        final Field field = Class.forName("com.eatthepath.pushy.apns.server.BaseHttp2Server").getDeclaredField("bootstrap");
        field.setAccessible(true);
        final ServerBootstrap bootstrap = (ServerBootstrap) field.get(server);
        final io.netty.channel.Channel channel = bootstrap
                .bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), o.integer("port", 0)))
                .syncUninterruptibly()
                .channel();
        final int port = ((InetSocketAddress) channel.localAddress()).getPort();
        synchronized (out) {
            out.write(("P " + port + "\n").getBytes(StandardCharsets.US_ASCII));
            out.flush();
        }
        final ScheduledExecutorService flusher = Executors.newSingleThreadScheduledExecutor(r -> {
            final Thread t = new Thread(r, "flusher");
            t.setDaemon(true);
            return t;
        });
        final int flushMs = Math.max(1, o.integer("flush-ms", 20));
        flusher.scheduleAtFixedRate(() -> flush(out), flushMs, flushMs, TimeUnit.MILLISECONDS);
        // Until the harness closes stdin (or exits).
        final InputStream in = System.in;
        final byte[] sink = new byte[256];
        while (in.read(sink) != -1) {
            // nothing to read but the end
        }
        flush(out);
        channel.close().awaitUninterruptibly(2, TimeUnit.SECONDS);
        System.exit(0);
    }

    private static void flush(final OutputStream out) {
        synchronized (out) {
            try {
                out.flush();
            } catch (final IOException e) {
                System.exit(1); // the harness is gone
            }
        }
    }

    /** The provider key's public half, PEM SubjectPublicKeyInfo. */
    private static ECPublicKey readSpki(final File file) throws Exception {
        final String pem = Files.readString(file.toPath(), StandardCharsets.US_ASCII);
        final String base64 = pem.replaceAll("-----[A-Z ]+-----", "").replaceAll("\\s", "");
        return (ECPublicKey) KeyFactory.getInstance("EC").generatePublic(new X509EncodedKeySpec(Base64.getDecoder().decode(base64)));
    }

    /** One line per push, into a shared buffer (the server's event loops call it concurrently). */
    private static final class LineListener implements MockApnsServerListener {
        private static final byte[] ACCEPTED = {'A', ' '};
        private static final String PATH_PREFIX = "/3/device/";
        private final OutputStream out;

        LineListener(final OutputStream out) {
            this.out = out;
        }

        @Override
        public void handlePushNotificationAccepted(final Http2Headers headers, final ByteBuf payload) {
            final CharSequence path = headers.path();
            final String token = path == null || path.length() < PATH_PREFIX.length()
                    ? "-" : path.subSequence(PATH_PREFIX.length(), path.length()).toString();
            final int start = payload.readerIndex();
            final int length = payload.readableBytes();
            final boolean oneLine = payload.indexOf(start, start + length, (byte) '\n') < 0
                    && payload.indexOf(start, start + length, (byte) '\r') < 0;
            synchronized (out) {
                try {
                    out.write(ACCEPTED);
                    out.write(token.getBytes(StandardCharsets.US_ASCII));
                    out.write(' ');
                    if (oneLine) {
                        payload.getBytes(start, out, length);
                    } else {
                        // JSON whitespace only: keep the line protocol.
                        out.write(payload.toString(start, length, StandardCharsets.UTF_8)
                                .replace('\n', ' ').replace('\r', ' ').getBytes(StandardCharsets.UTF_8));
                    }
                    out.write('\n');
                } catch (final IOException e) {
                    System.exit(1);
                }
            }
        }

        @Override
        public void handlePushNotificationRejected(final Http2Headers headers, final ByteBuf payload,
                final RejectionReason reason, final Instant deviceTokenExpiration) {
            synchronized (out) {
                try {
                    out.write(("R " + reason.name() + "\n").getBytes(StandardCharsets.US_ASCII));
                } catch (final IOException e) {
                    System.exit(1);
                }
            }
        }
    }

    // ---- client ----

    private static void client(final Options o) throws Exception {
        final String bundleId = o.get("bundle-id");
        final int connections = o.integer("connections", 1);
        final int inFlight = o.integer("in-flight", 1000);
        final int threads = o.integer("threads", Math.min(connections, Runtime.getRuntime().availableProcessors()));
        final long timeoutSeconds = o.integer("timeout-seconds", 600);
        // As the engine sends it (spec 000 section 7): background, priority 5, a day's expiration, the collapse id.
        final Instant expiration = Instant.now().plus(Duration.ofDays(1));
        final List<SimpleApnsPushNotification> pushes = new ArrayList<>();
        for (final String line : Files.readAllLines(o.file("pushes").toPath(), StandardCharsets.UTF_8)) {
            if (line.isBlank()) {
                continue;
            }
            final String[] parts = line.split(" ", 3);
            pushes.add(new SimpleApnsPushNotification(parts[0], bundleId, parts[2], expiration,
                    DeliveryPriority.CONSERVE_POWER, PushType.BACKGROUND, parts[1]));
        }
        // The warm-up may be longer than the measured pushes: it goes round them again.
        final int warmup = pushes.isEmpty() ? 0 : o.integer("warmup", 10_000);
        final List<SimpleApnsPushNotification> warmupPushes = new ArrayList<>(warmup);
        for (int i = 0; i < warmup; i++) {
            warmupPushes.add(pushes.get(i % pushes.size()));
        }

        final NioEventLoopGroup group = new NioEventLoopGroup(threads);
        final ApnsClient client = new ApnsClientBuilder()
                .setApnsServer("127.0.0.1", Integer.parseInt(o.get("port")))
                .setSigningKey(ApnsSigningKey.loadFromPkcs8File(o.file("signing-key"), o.get("team-id"), o.get("key-id")))
                .setTrustedServerCertificateChain(o.file("ca"))
                .setConcurrentConnections(connections)
                .setEventLoopGroup(group)
                .build();

        // Warm-up: the JIT compiles the send path, the connections open.
        final Batch warm = send(client, warmupPushes, inFlight, timeoutSeconds);
        final com.sun.management.OperatingSystemMXBean os =
                (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        final long cpuBefore = os.getProcessCpuTime();
        // --measure 0: the warm-up alone (the harness warms a server up before another client's traffic).
        final List<SimpleApnsPushNotification> measured = o.integer("measure", 1) != 0 ? pushes : List.of();
        final Batch batch = send(client, measured, inFlight, timeoutSeconds);
        final long cpuAfter = os.getProcessCpuTime();
        client.close().get(10, TimeUnit.SECONDS);
        group.shutdownGracefully(0, 1, TimeUnit.SECONDS).await(5, TimeUnit.SECONDS);

        final double seconds = batch.nanos / 1e9;
        final String json = "{"
                + "\"pushy_version\":\"" + pushyVersion() + "\""
                + ",\"java_version\":\"" + System.getProperty("java.version") + "\""
                + ",\"connections\":" + connections
                + ",\"in_flight\":" + inFlight
                + ",\"threads\":" + threads
                + ",\"warmup\":" + warmup
                + ",\"warmup_accepted\":" + warm.accepted
                + ",\"pushes\":" + measured.size()
                + ",\"accepted\":" + batch.accepted
                + ",\"rejected\":" + batch.rejected
                + ",\"unanswered\":" + batch.unanswered
                + ",\"first_rejection\":" + (batch.firstRejection == null ? "null" : "\"" + batch.firstRejection + "\"")
                + ",\"seconds\":" + seconds
                + ",\"pushes_per_second\":" + (seconds > 0 ? batch.accepted / seconds : 0)
                + ",\"cpu_seconds\":" + (cpuAfter - cpuBefore) / 1e9
                + ",\"cpu_seconds_total\":" + cpuAfter / 1e9
                + "}";
        System.out.println(json);
        System.out.flush();
        System.exit(0);
    }

    private record Batch(long accepted, long rejected, long unanswered, String firstRejection, long nanos) {}

    /**
     * Sends every push with at most {@code inFlight} unanswered (a semaphore, as Pushy's documentation advises); the
     * time runs from the first send to the last answer.
     */
    private static Batch send(final ApnsClient client, final List<SimpleApnsPushNotification> pushes, final int inFlight,
            final long timeoutSeconds) throws InterruptedException {
        final Semaphore permits = new Semaphore(inFlight);
        final CountDownLatch answered = new CountDownLatch(pushes.size());
        final AtomicLong accepted = new AtomicLong();
        final AtomicLong rejected = new AtomicLong();
        final AtomicLong lastAnswer = new AtomicLong();
        final AtomicReference<String> firstRejection = new AtomicReference<>();
        final long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(timeoutSeconds);
        final long started = System.nanoTime();
        for (final SimpleApnsPushNotification push : pushes) {
            if (!permits.tryAcquire(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS)) {
                break;
            }
            client.sendNotification(push).whenComplete((response, cause) -> {
                if (cause == null && response.isAccepted()) {
                    accepted.incrementAndGet();
                } else {
                    rejected.incrementAndGet();
                    firstRejection.compareAndSet(null, cause != null
                            ? cause.getClass().getSimpleName()
                            : response.getStatusCode() + " " + response.getRejectionReason().orElse(""));
                }
                lastAnswer.accumulateAndGet(System.nanoTime(), Math::max);
                permits.release();
                answered.countDown();
            });
        }
        answered.await(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
        final long a = accepted.get();
        final long r = rejected.get();
        final long end = lastAnswer.get() == 0 ? System.nanoTime() : lastAnswer.get();
        return new Batch(a, r, pushes.size() - a - r, firstRejection.get(), end - started);
    }

    private static String pushyVersion() {
        try (InputStream in = ApnsClient.class.getResourceAsStream("/META-INF/maven/com.eatthepath/pushy/pom.properties")) {
            if (in == null) {
                return "unknown";
            }
            final Properties p = new Properties();
            p.load(in);
            return p.getProperty("version", "unknown");
        } catch (final IOException e) {
            return "unknown";
        }
    }
}
