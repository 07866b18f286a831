"""Benchmark: one person whose group keys collide in the engine's hash (adversarial, neighbouring data).

One command:  python benchmarks/hash_collisions.py [--users 20000] [--keys 20000] [--repeat 7] [--text]
Prints JSON (also written to benchmarks/out/hash_collisions.json; with --text hash_collisions_text.json).
``--text``: the keys are text, and the colliding ones have one DuckDB hash in all 64 bits
(:func:`colliding_strings`; before their spread hashed the salt followed by their text, the keyed hash of
such keys was one value too: a sparse histogram 1.56 s against 0.066 s for random keys, SUM with k = 1
4.26 s against 0.072 s, ``suggest_caps(group_by=...)`` 3.10 s against 0.109 s). Every run also times
``suggest_caps(group_by='x')``, whose (person, key) pairs were not spread at all before (1.27 s against
0.036 s with colliding BIGINTs).
``--text --aligned``: 80-character keys whose hashes take at most 8 values under any 32-character salt
prefix (:func:`aligned_strings`; before the salted text went through ``MD5_NUMBER``: a sparse histogram
0.149 s against 0.070 s for random 80-character keys, SUM with k = 1 0.299 s against 0.050 s, best of 3).
Join plans:   python benchmarks/hash_collisions.py --joins [--users 20000] [--keys 20000] [--repeat 3]
(JSON in benchmarks/out/hash_collisions_joins.json; see :func:`joins` below).

DuckDB's hash of a BIGINT is Murmur3's 64-bit finaliser: public, unsalted and a bijection, so
anyone can invert it and write integers whose hashes share their low bits. A hash table (a GROUP
BY, a DISTINCT, a window's partitions) holding many such keys probes quadratically. The bounded
query groups and partitions each person's rows by (person, key) before the group cap keeps a few
of that person's groups, so one person holding ``--keys`` such keys made the query slow.

For three query shapes (counts through the sparse histogram: the (person, key) pairs as a
DISTINCT; SUM with k = 1: one row per (person, key) by an aggregate; SUM with k = 3: a window
partitioned by (person, key)) it times ``Session.query`` (Arrow source, interleaved runs, the
median of ``--repeat``) on D (``--users`` people, one row each, keys in 0..999), on D plus one
person holding ``--keys`` random keys (the control: the cost of that person's rows), and on D
plus one person holding ``--keys`` colliding keys. ``ratio`` is colliding / random.

Measured on the reference machine (2 shared cores, 20 000 users, 20 000 keys, medians of 5):
before the fix, colliding / random was 34x (sparse histogram: 1.07 s against 0.031 s), 44x
(k = 1: 3.69 s against 0.083 s) and 32x (k = 3: 4.81 s against 0.149 s); with the salted spread
column (``dpsql.rewrite.bound.spread_keys``) 0.96x, 1.74x and 0.85x in one run of this script on a
heavily loaded machine (load average 11 on 2 cores), and 0.84-1.19x for k = 1 when repeated: the
colliding and the random neighbour cost the same up to the run-to-run noise.

Its cost on ordinary data (1M rows, 200 000 people, 5000 keys, best of 7, the same load): the
(person, key) DISTINCT of a count 0.53-0.63 s -> 0.89-1.06 s; SUM with k = 1 1.29-1.42 s ->
1.39-1.51 s; SUM with k = 3 1.67-1.79 s -> 1.74-2.12 s. In DuckDB alone the DISTINCT over 1M
(person, key) rows takes 0.153 s plain and 0.222 s with the spread column.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dpsql  # noqa: E402
from dpsql.budget import Budget  # noqa: E402
from dpsql.testing import use_noise, zero_noise  # noqa: E402

_M = (1 << 64) - 1
_C = 0xD6E8FEB86659FD93
_C_INV = pow(_C, -1, 1 << 64)


def _unhash(h: int) -> int:
    """The BIGINT whose DuckDB hash is ``h`` (Murmur3's finaliser, inverted)."""
    x = h ^ (h >> 32)
    x = (x * _C_INV) & _M
    x ^= x >> 32
    x = (x * _C_INV) & _M
    x ^= x >> 32
    return x - (1 << 64) if x >= 1 << 63 else x


def colliding_keys(n: int, low_bits: int = 24) -> list[int]:
    """``n`` distinct BIGINTs whose DuckDB hashes agree in their low ``low_bits`` bits and top 16."""
    return [_unhash((0x1234 << 48) | (i << low_bits) | 0xABC) for i in range(1, n + 1)]


def colliding_strings(n: int, blocks: int = 3, seed: int = 0) -> list[str]:
    """``n`` distinct printable ASCII strings of ``8 * blocks`` characters whose DuckDB hashes are equal in all
    64 bits. DuckDB hashes a string by XORing each 8-byte block into a state and multiplying it by an odd
    constant, then finalising: for any first blocks, the last block that brings the state to one chosen value
    is ``target * C^-1 XOR state``; drawn at random, it is printable once in about 2800 draws. No salt
    enters the hash, so a keyed hash of the string's hash (``HASH(XOR(HASH(k), HASH(salt)))``) is equal for
    all of them too."""
    import numpy as np

    length = 8 * blocks
    h0 = (0xE17A1465 ^ (length * 0xC6A4A7935BD1E995)) & _M
    last_xor = np.uint64((0x0123456789ABCDEF * _C_INV) & _M)
    gen = np.random.default_rng(seed)
    out: set[str] = set()
    while len(out) < n:
        m = 1 << 18
        head = gen.integers(0x21, 0x7F, size=(m, blocks - 1, 8), dtype=np.uint8)
        h = np.full(m, h0, dtype=np.uint64)
        with np.errstate(over="ignore"):
            for j in range(blocks - 1):
                h ^= np.ascontiguousarray(head[:, j, :]).view("<u8").reshape(m)
                h *= np.uint64(_C)
        last = (h ^ last_xor).astype("<u8").view(np.uint8).reshape(m, 8)
        ok = np.all((last >= 0x21) & (last < 0x7F), axis=1)
        for i in np.nonzero(ok)[0]:
            out.add(head[i].tobytes().decode() + last[i].tobytes().decode())
    return sorted(out)[:n]


def aligned_strings(n: int, blocks: int = 10) -> list[str]:
    """``n`` distinct printable ASCII strings of ``8 * blocks`` characters (``n <= 3 ** blocks``) whose DuckDB
    hashes take at most 8 values, and so do the hashes of any text of a length divisible by 8 followed by
    them, whatever that text (a secret salt): each block is ``abcdefg`` and one of ``!``, ``A``, ``a``, which
    differ only in bits 5 and 6 of the block's last byte (bits 61 and 62 of the little-endian word). DuckDB
    XORs each block into its state and multiplies by an odd constant; neither carries a difference in the top
    3 bits into the low 61, so all these strings leave the same low 61 bits and one of 8 top-3-bit values."""
    import itertools

    out = []
    for combo in itertools.product("!Aa", repeat=blocks):
        out.append("".join("abcdefg" + c for c in combo))
        if len(out) == n:
            break
    return out


_M32 = 0xFFFFFFFF
_MURMUR_C1, _MURMUR_C2 = 0xCC9E2D51, 0x1B873593


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _murmur_word(k: int) -> int:
    """Murmur3_x86_32's mixing of one little-endian 4-byte block (a bijection, before it meets the state)."""
    return _rotl32(k * _MURMUR_C1 & _M32, 15) * _MURMUR_C2 & _M32


def spark_string_hash(data: bytes, seed: int = 42) -> int:
    """Spark's hash of a string's UTF-8 bytes (``Murmur3_x86_32.hashUnsafeBytes``: ``hash(s)`` in SQL, and
    ``UTF8String.hashCode``, which its hash sets use), as a signed 32-bit int."""
    aligned = len(data) - len(data) % 4
    words = [int.from_bytes(data[i:i + 4], "little") for i in range(0, aligned, 4)]
    words += [(b - 256 if b > 127 else b) & _M32 for b in data[aligned:]]  # the tail, one signed byte a block
    h = seed
    for k in words:
        h = (_rotl32(h ^ _murmur_word(k), 13) * 5 + 0xE6546B64) & _M32
    h ^= len(data)
    h ^= h >> 16
    h = h * 0x85EBCA6B & _M32
    h ^= h >> 13
    h = h * 0xC2B2AE35 & _M32
    h ^= h >> 16
    return h - (1 << 32) if h >> 31 else h


def murmur3_aligned_strings(n: int, segments: int = 15, seed: int = 0) -> list[str]:
    """``n`` distinct ASCII strings of ``8 * segments`` characters (``n <= 2 ** segments``) that share one Spark
    string hash (:func:`spark_string_hash`) after any text of a length divisible by 4 (a secret salt), whatever
    that text. Spark's Murmur3_x86_32 mixes each 4-byte block ``k`` into the state ``h`` as ``h = rotl(h ^ m(k),
    13) * 5 + c`` (``m`` a bijection). A difference in the top bit of ``h`` alone passes ``* 5 + c`` unchanged,
    whatever ``h``; so two first blocks whose ``m`` differ in bit 18 (bit 31 after the rotation) and two second
    blocks whose ``m`` differ in bit 31 leave every state as the other pair does. Each 8-byte segment is one of
    two such pairs (ASCII 1-127: found by inverting ``m``); every string of the family is the same length."""
    import random

    rng = random.Random(seed)
    inv1, inv2 = pow(_MURMUR_C1, -1, 1 << 32), pow(_MURMUR_C2, -1, 1 << 32)

    def pair(diff: int) -> tuple[bytes, bytes]:
        while True:
            a = bytes(rng.randrange(1, 0x80) for _ in range(4))
            w = _murmur_word(int.from_bytes(a, "little")) ^ diff
            b = (_rotl32(w * inv2 & _M32, 17) * inv1 & _M32).to_bytes(4, "little")
            if 0 < min(b) and max(b) < 0x80:
                return a, b

    segs = []
    for _ in range(segments):
        (a1, b1), (a2, b2) = pair(1 << 18), pair(1 << 31)
        segs.append((a1 + a2, b1 + b2))
    if n > 2 ** segments:
        raise ValueError(f"at most {2 ** segments} strings of {segments} segments, asked for {n}")
    return [b"".join(segs[i][(m >> i) & 1] for i in range(segments)).decode("ascii") for m in range(n)]


SHAPES = {
    "sparse_histogram_count": ("SELECT x, COUNT(*) FROM t GROUP BY x", {"max_groups_per_unit": 1}),
    "sum_k1": ("SELECT x, SUM(v) FROM t GROUP BY x", {"max_groups_per_unit": 1}),
    "sum_k3": ("SELECT x, SUM(v) FROM t GROUP BY x", {"max_groups_per_unit": 2, "max_rows_per_group": 3}),
}


#: join plans: (SQL, options); customer (the people) <- orders (o_custkey, at most 8 per customer enforced)
#: <- lineitem (l_orderkey, at most 4 per order), nation public
JOIN_SHAPES = {
    "dp_s4s_chain_count": ("SELECT COUNT(*) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
                           "JOIN lineitem l ON o.o_orderkey = l.l_orderkey", {}),
    "dp_s4s_orders_lineitem_sum": ("SELECT SUM(l.l_price) FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey", {}),
    "r2t_orders_lineitem_count": ("SELECT COUNT(*) FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey",
                                  {"mechanism": "r2t"}),
    "r2t_lineitem_lookup": ("SELECT COUNT(*) FROM lineitem l", {}),
    "group_by_over_join": ("SELECT n.n_name, COUNT(*) FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
                           "JOIN lineitem l ON o.o_orderkey = l.l_orderkey JOIN nation n ON c.c_nationkey = n.n_nationkey "
                           "GROUP BY n.n_name", {}),
}


def joins(args: argparse.Namespace) -> dict[str, object]:
    """Join plans (DP-S4S, R2T, a looked-up chain, GROUP BY over a join): ``--users`` customers with one
    order (random BIGINT key) and one line item each; the neighbour adds one customer holding ``--keys``
    orders, each with one line item, whose order keys are random (the control) or collide in DuckDB's hash
    (:func:`colliding_keys`). Every plan joins on, groups and semi-joins by the order key before the caps
    bound that customer (the unique-key filter groups the whole orders table by o_orderkey; a lookup
    DISTINCTs, joins and groups by it). Each plan runs with the keyed hash of the join keys
    (``dpsql.rewrite.joins.Spread``: ``spread``) and without it (``plain``: the plan before it, by turning
    ``spread_of`` off in this process), zero noise (the salt-keyed sample), the best and the median of
    ``--repeat`` interleaved runs in one process; ``ratio`` is colliding / random of the best.

    Measured with this script (2 shared cores, load average 7, 20 000 customers, 20 000 keys, best of 3),
    colliding / random, plain -> spread: DP-S4S chain count 12.9x (5.64 s against 0.44 s) -> 1.18x
    (0.61 s against 0.52 s); DP-S4S SUM over orders JOIN lineitem 29.8x (7.47 s) -> 1.05x; R2T count over the
    same join 31.1x (7.63 s) -> 0.78x; R2T over lineitem alone, people looked up through orders, 66.4x
    (18.1 s against 0.27 s) -> 0.99x; GROUP BY over the chain 9.3x (5.27 s) -> 0.77x. An earlier run at load
    1-3 gave 13.7x, 23.5x, 37.7x, 51.4x, 12.4x plain. DuckDB's profile put the plain plans' time in the
    unique-key filter's GROUP BY o_orderkey over all orders and the DISTINCT that a correlated EXISTS makes of
    its outer key values, and in the lookup's hash joins and grouping. Cost on TPC-H: ``join_spread_cost.py``."""
    import dpsql.rewrite.joins as rj

    rng = np.random.default_rng(1)
    okeys = np.array(rng.integers(-2**62, 2**62, args.users), np.int64)
    extra = {"random": np.array(rng.integers(-2**62, 2**62, args.keys), np.int64),
             "colliding": np.array(colliding_keys(args.keys), np.int64)}

    def session(kind: str) -> dpsql.Session:
        ok, oc = okeys, np.arange(args.users)
        if kind != "none":
            ok = np.concatenate([ok, extra[kind]])
            oc = np.concatenate([oc, np.full(args.keys, args.users)])
        cust = np.arange(args.users + (kind != "none"))
        s = dpsql.Session(budget=Budget(1e9, 0.99))
        use_noise(s, zero_noise())
        s.register("nation", pa.table({"n_nationkey": np.arange(5), "n_name": list("ABCDE")}), public=True)
        s.register("customer", pa.table({"c_custkey": cust, "c_nationkey": cust % 5}), privacy_unit="c_custkey",
                   references={"c_nationkey": "nation.n_nationkey"})
        s.register("orders", pa.table({"o_orderkey": ok, "o_custkey": oc}), references={"o_custkey": "customer.c_custkey"},
                   degree_bounds={"o_custkey": 8}, allow_conditional_sampling=True)
        s.register("lineitem", pa.table({"l_orderkey": ok, "l_price": np.ones(len(ok))}),
                   references={"l_orderkey": "orders.o_orderkey"}, degree_bounds={"l_orderkey": 4},
                   columns={"l_price": {"bounds": (0, 10)}}, allow_conditional_sampling=True)
        return s

    spread_of = rj.spread_of
    out: dict[str, object] = {"users": args.users, "keys": args.keys, "repeat": args.repeat, "shapes": {}}
    sessions = {kind: session(kind) for kind in ("none", "random", "colliding")}
    try:
        for shape, (sql, opts) in JOIN_SHAPES.items():
            row: dict[str, object] = {"sql": sql, "options": opts,
                                      "mechanism": sessions["none"].explain(sql, epsilon=1.0, delta=1e-6, options=opts).mechanism}
            for mode in ("plain", "spread"):
                rj.spread_of = spread_of if mode == "spread" else (lambda *a, **k: None)  # type: ignore[assignment]
                times: dict[str, list[float]] = {k: [] for k in sessions}
                try:
                    for _ in range(args.repeat):
                        for kind, s in sessions.items():
                            t0 = time.perf_counter()
                            s.query(sql, epsilon=1.0, delta=1e-6, options=opts)
                            times[kind].append(time.perf_counter() - t0)
                finally:
                    rj.spread_of = spread_of  # type: ignore[assignment]
                best = {k: min(v) for k, v in times.items()}
                row[mode] = {"best_s": best, "median_s": {k: statistics.median(v) for k, v in times.items()},
                             "ratio": best["colliding"] / best["random"]}
            out["shapes"][shape] = row  # type: ignore[index]
            print(shape, {m: round(row[m]["ratio"], 2) for m in ("plain", "spread")}, file=sys.stderr, flush=True)  # type: ignore[index]
    finally:
        for s in sessions.values():
            s.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=20000)
    ap.add_argument("--keys", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=None, help="runs per plan (default 7; with --joins 3)")
    ap.add_argument("--joins", action="store_true", help="the join plans (:func:`joins`) instead of single tables")
    ap.add_argument("--text", action="store_true",
                    help="text keys of one 64-bit hash (:func:`colliding_strings`) instead of BIGINTs, and caps advice")
    ap.add_argument("--aligned", action="store_true",
                    help="with --text: 80-character keys of at most 8 hashes under any salt prefix (:func:`aligned_strings`)")
    args = ap.parse_args()
    if args.joins:
        args.repeat = args.repeat or 3
        text = json.dumps(joins(args), indent=2)
        print(text)
        os.makedirs(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"), exist_ok=True)
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "hash_collisions_joins.json"), "w") as f:
            f.write(text + "\n")
        return
    args.repeat = args.repeat or 7
    rng = np.random.default_rng(1)
    uid, x = np.arange(args.users), rng.integers(0, 1000, args.users)
    extra: dict[str, Any] = {"random": np.array(rng.integers(-2**62, 2**62, args.keys), np.int64),
                             "colliding": np.array(colliding_keys(args.keys), np.int64)}
    if args.text:  # 24 printable characters, random or of one DuckDB hash
        x = np.array([f"key{v}" for v in x], dtype=object)
        extra = {"random": np.array(["".join(map(chr, rng.integers(0x21, 0x7F, 24))) for _ in range(args.keys)], dtype=object),
                 "colliding": np.array(colliding_strings(args.keys), dtype=object)}
        if args.aligned:  # 80 characters, random or block-aligned (the salt's 32 characters keep them aligned)
            extra = {"random": np.array(["".join(map(chr, rng.integers(0x21, 0x7F, 80))) for _ in range(args.keys)],
                                        dtype=object),
                     "colliding": np.array(aligned_strings(args.keys), dtype=object)}

    def table(kind: str) -> pa.Table:
        if kind == "none":
            return pa.table({"uid": uid, "x": x, "v": np.ones(args.users)})
        n = args.users + args.keys
        return pa.table({"uid": np.concatenate([uid, np.full(args.keys, 10**9)]),
                         "x": np.concatenate([x, extra[kind]]), "v": np.ones(n)})

    out: dict[str, object] = {"users": args.users, "keys": args.keys, "repeat": args.repeat, "text": args.text,
                              "shapes": {}}
    shapes: dict[str, tuple[str | None, dict[str, Any]]] = dict(SHAPES)
    shapes["suggest_caps_group_by"] = (None, {})  # Session.suggest_caps(group_by='x')
    for shape, (sql, caps) in shapes.items():
        sessions = {}
        for kind in ("none", "random", "colliding"):
            s = dpsql.Session(budget=Budget(1e9, 0.99))
            use_noise(s, zero_noise())
            s.register("t", table(kind), privacy_unit="uid", columns={"v": {"bounds": (0, 1)}}, **caps)
            sessions[kind] = s
        times: dict[str, list[float]] = {k: [] for k in sessions}
        for _ in range(args.repeat):
            for kind, s in sessions.items():
                t0 = time.perf_counter()
                if sql is None:
                    s.suggest_caps("t", epsilon=1.0, group_by="x")
                else:
                    s.query(sql, epsilon=1.0, delta=1e-6)
                times[kind].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        out["shapes"][shape] = {"sql": sql, "caps": caps, "median_s": med,  # type: ignore[index]
                                "ratio": med["colliding"] / med["random"]}
        for s in sessions.values():
            s.close()
    text = json.dumps(out, indent=2)
    print(text)
    os.makedirs(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"), exist_ok=True)
    name = ("hash_collisions_aligned.json" if args.aligned else "hash_collisions_text.json") if args.text else "hash_collisions.json"
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", name), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
