#!/usr/bin/env python3
"""Benchmark (not a test): etcd2 data walked from 2.2.1 to 3.0.17 (issue 30
item 3): to 3.0.17/etcd2 (two in-place steps; the figure the issue names),
or with --storage etcd3 on to etcd3 (the Kubernetes 1.5 -> 1.6 move).
--from/--to take other releases (3.3.25/etcd2 -> 3.3.25/etcd3 runs on the
fetched binaries alone: the storage migration without any walk), and
--ttl-spread gives each TTL key its own TTL (3600 s plus its index), as
Kubernetes events written over an hour have: one lease per key.

etcd 2.2.1 is seeded through its v2 API with KEYS keys of VALUE_BYTES
bytes, TTL_KEYS of them with a 1 h TTL, and stopped; each round then runs
every given etcd-migrate build (--no-exec) on a fresh copy of that data,
the builds in turn, and prints the medians with the way each build took
its baseline (offline, or by a start of 2.2.1). The releases no registry
has come from --bin-dir (ETCD_EXTRA_BIN_DIR beside the fetched ones).

Usage: bench/etcd2_walk.py --bin-dir DIR --migrate target/release/etcd-migrate
       [--migrate OTHER_BUILD] [--storage etcd2|etcd3] [--keys 1000 --ttl-keys 20 --runs 9]
       [--from 2.2.1 --to 3.0.17] [--ttl-spread]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

FROM, TO = "2.2.1", "3.0.17"
RELEASES = ["2.2.1", "2.3.7", "3.0.17"]


def log(msg):
    print(f"[etcd2-walk] {msg}", file=sys.stderr, flush=True)


def put(port, key, value, ttl=None):
    url = f"http://127.0.0.1:{port}/v2/keys/{key}" + (f"?ttl={ttl}" if ttl else "")
    req = urllib.request.Request(url, data=f"value={value}".encode(), method="PUT")
    req.add_header("content-type", "application/x-www-form-urlencoded")
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


def seed(bin_dir, data, port, peer, keys, ttl_keys, value_bytes, spread):
    peer_url = f"http://127.0.0.1:{peer}"
    client = f"http://127.0.0.1:{port}"
    etcd = subprocess.Popen(
        [f"{bin_dir}/etcd-{FROM}", "--name", "bench", "--data-dir", data,
         "--listen-client-urls", client, "--advertise-client-urls", client,
         "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
         "--initial-cluster", f"bench={peer_url}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            put(port, "bench-ready", "1")
            break
        except OSError:
            if time.monotonic() > deadline or etcd.poll() is not None:
                sys.exit("etcd 2.2.1 did not come up")
            time.sleep(0.1)
    value = "x" * value_bytes
    for i in range(keys):
        ttl = (3600 + i if spread else 3600) if i < ttl_keys else None
        put(port, f"registry/items/k{i:06d}", value, ttl)
    etcd.terminate()
    etcd.wait(30)
    with open(os.path.join(data, "version.txt"), "w") as f:
        f.write(f"{FROM}/etcd2\n")


def run(migrate, bin_dir, data, port, peer, storage):
    cmd = [migrate, "--target-version", TO, "--target-storage", storage,
           "--data-dir", data, "--name", "bench", "--bin-dir", bin_dir,
           "--port", str(port), "--peer-port", str(peer), "--no-exec"]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    took = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    way = "offline" if "baseline taken offline" in r.stderr else f"start of {FROM}"
    return took, way


def main():
    global FROM, TO, RELEASES
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True, help="etcd-<v> for 2.2.1, 2.3.7, 3.0.17")
    ap.add_argument("--migrate", action="append", required=True)
    ap.add_argument("--storage", choices=["etcd2", "etcd3"], default="etcd2")
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--ttl-keys", type=int, default=20)
    ap.add_argument("--value-bytes", type=int, default=512)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--client-port", type=int, default=23891)
    ap.add_argument("--peer-port", type=int, default=23901)
    ap.add_argument("--from", dest="from_", default=FROM)
    ap.add_argument("--to", default=TO)
    ap.add_argument("--ttl-spread", action="store_true")
    a = ap.parse_args()
    if (a.from_, a.to) != (FROM, TO):
        FROM, TO = a.from_, a.to
        RELEASES = sorted({FROM, TO})
    for v in RELEASES:
        if not os.path.exists(f"{a.bin_dir}/etcd-{v}"):
            sys.exit(f"no etcd-{v} in {a.bin_dir}: build it from etcd's tag (see README, ETCD_EXTRA_BIN_DIR)")
    log(f"{FROM}/etcd2 -> {TO}/{a.storage}")
    root = tempfile.mkdtemp(prefix="etcd2-walk-", dir=os.environ.get("BENCH_TMP"))
    try:
        seeded = os.path.join(root, "seeded")
        log(f"seeding {a.keys} keys ({a.ttl_keys} with a TTL) with etcd {FROM}")
        seed(a.bin_dir, seeded, a.client_port, a.peer_port, a.keys, a.ttl_keys, a.value_bytes,
             a.ttl_spread)
        times = {m: [] for m in a.migrate}
        ways = {m: set() for m in a.migrate}
        for i in range(a.runs):
            for m in a.migrate:
                data = os.path.join(root, "data")
                shutil.rmtree(data, ignore_errors=True)
                shutil.copytree(seeded, data)
                took, way = run(m, a.bin_dir, data, a.client_port, a.peer_port, a.storage)
                times[m].append(took)
                ways[m].add(way)
                log(f"round {i + 1}: {m}: {took * 1000:.0f} ms ({way})")
        print(f"{FROM}/etcd2 -> {TO}/{a.storage}, {a.keys} v2 keys of {a.value_bytes} B "
              f"({a.ttl_keys} with a TTL{', each its own' if a.ttl_spread else ''}), {a.runs} rounds, {os.cpu_count()} CPUs, "
              f"load {os.getloadavg()[0]:.2f}")
        print()
        print("| build | baseline | median ms | min-max ms |")
        print("|---|---|---|---|")
        for m in a.migrate:
            t = times[m]
            print(f"| {m} | {', '.join(sorted(ways[m]))} | {statistics.median(t) * 1000:.0f} "
                  f"| {min(t) * 1000:.0f}-{max(t) * 1000:.0f} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
