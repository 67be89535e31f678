#!/usr/bin/env python3
"""An independent CQL client: the DataStax Python driver (not the Rust driver
the engine and `--with-cql-ceiling` use) sending the statement shapes of the
engine's ScyllaDB store into a keyspace of its own, dropped afterwards.

    pip install cassandra-driver
    python3 loadtest/independent/cql_client.py [--host 127.0.0.1] [--port 9042]

Prints one line per kind: plain inserts and conditional inserts of a
recipient (64 in flight), unlogged single-partition batches of 100 log rows
(4 in flight), pages of 100 subscriber ids of one topic and joins of 50
recipient partitions (32 in flight). docs/BENCHMARKS.md sets the engine's
figures against these.
"""
import argparse
import hashlib
import os
import time

from cassandra.cluster import Cluster
from cassandra.concurrent import execute_concurrent, execute_concurrent_with_args
from cassandra.query import BatchStatement, BatchType


def rid(i):
    return hashlib.sha256(i.to_bytes(8, "big")).digest()


def timed(label, rows_each, count, run):
    """Runs `run`, printing statements (and rows) per second, and the
    client's own CPU: near the wall time, the client is what bounds it."""
    started, cpu = time.monotonic(), time.process_time()
    run()
    seconds, cpu = time.monotonic() - started, time.process_time() - cpu
    print(f"{label}: {count} in {seconds:.2f} s = {count / seconds:,.0f}/s"
          + (f" = {count * rows_each / seconds:,.0f} rows/s" if rows_each > 1 else "")
          + f"; client CPU {cpu:.2f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9042)
    args = parser.parse_args()
    cluster = Cluster([args.host], port=args.port)
    s = cluster.connect()
    ks = "fanout_independent_" + os.urandom(8).hex()
    s.execute(f"CREATE KEYSPACE {ks} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}")
    try:
        s.execute(f"CREATE TABLE {ks}.recipients (recipient_id blob, topic blob, version bigint static, "
                  "secret_hash blob static, channel tinyint static, target text static, renewed_at bigint static, "
                  "start_position bigint, include_commits boolean, PRIMARY KEY ((recipient_id), topic))")
        s.execute(f"CREATE TABLE {ks}.shard_log (shard int, bucket bigint, pos int, term bigint, topic blob, "
                  "kind tinyint, server_ts bigint, data blob, PRIMARY KEY ((shard, bucket), pos, term))")
        s.execute(f"CREATE TABLE {ks}.topic_subscriptions (topic blob, recipient_id blob, "
                  "PRIMARY KEY ((topic), recipient_id))")
        plain = s.prepare(f"INSERT INTO {ks}.recipients (recipient_id, topic, start_position, include_commits) "
                          "VALUES (?, ?, ?, ?)")
        conditional = s.prepare(f"UPDATE {ks}.recipients SET version = ?, secret_hash = ?, channel = ?, "
                                "target = ?, renewed_at = ? WHERE recipient_id = ? IF version = null")
        row = s.prepare(f"INSERT INTO {ks}.shard_log (shard, bucket, pos, term, topic, kind, server_ts, data) "
                        "VALUES (?, ?, ?, 1, ?, 1, ?, ?)")
        subscriber = s.prepare(f"INSERT INTO {ks}.topic_subscriptions (topic, recipient_id) VALUES (?, ?)")
        page = s.prepare(f"SELECT recipient_id FROM {ks}.topic_subscriptions WHERE topic = ?")
        join = s.prepare(f"SELECT recipient_id, version, secret_hash, channel, target, renewed_at, start_position, "
                         f"include_commits FROM {ks}.recipients WHERE recipient_id IN ? AND topic = ?")

        n = 20_000
        timed("plain inserts (64 in flight)", 1, n, lambda: execute_concurrent_with_args(
            s, plain, [(rid(i), bytes([0, i % 251]), 1, True) for i in range(n)], concurrency=64))
        c = 5_000
        timed("conditional inserts (64 in flight)", 1, c, lambda: execute_concurrent_with_args(
            s, conditional, [(i, b"\x07" * 32, 1, "token", 1, rid(n + i)) for i in range(c)], concurrency=64))

        # Bound before the clock starts: Python's binding, not the server, would be measured.
        prepared = []
        for b in range(400):
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for pos in range(100):
                batch.add(row, (b % 16, b // 16, pos, bytes([0, pos % 251]), 1, b"\x00" * 16))
            prepared.append(batch)

        def batches():
            execute_concurrent(s, [(batch, ()) for batch in prepared], concurrency=4)
        timed("unlogged batches of 100 rows (4 in flight)", 100, len(prepared), batches)

        execute_concurrent_with_args(
            s, subscriber, [(bytes([0, i // 100]), rid(i)) for i in range(100 * 100)], concurrency=64)
        pages = 4_000
        timed("pages of 100 subscriber ids (32 in flight)", 100, pages, lambda: execute_concurrent_with_args(
            s, page, [(bytes([0, i % 100]),) for i in range(pages)], concurrency=32))

        topic = bytes([9, 9])
        execute_concurrent_with_args(s, plain, [(rid(n + i), topic, 1, True) for i in range(c)], concurrency=64)
        joins = 2_000
        timed("joins of 50 recipient partitions (32 in flight)", 50, joins, lambda: execute_concurrent_with_args(
            s, join, [([rid(n + (i * 50 + j) % c) for j in range(50)], topic) for i in range(joins)],
            concurrency=32))
    finally:
        s.execute(f"DROP KEYSPACE IF EXISTS {ks}")
        cluster.shutdown()


if __name__ == "__main__":
    main()
