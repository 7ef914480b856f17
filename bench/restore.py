#!/usr/bin/env python3
"""Benchmark (not a test): etcd-migrate's restore from a snapshot (issue 29)
against `etcdutl snapshot restore` by hand on the same snapshot.

One etcd 3.5.16 member is seeded with KEYS keys of VALUE_BYTES bytes
(bench/floor.rs `seed`), `etcdctl snapshot save` takes the snapshot, then
each round times, on fresh copies:
  - by hand: `etcdutl snapshot restore` into an empty dir, with the same
    flags etcd-migrate gives (name, initial cluster, peer URLs, token,
    --bump-revision 1000000000 --mark-compacted);
  - ours, onto an empty data dir: etcd-migrate --no-exec with
    --restore-snapshot (the checks: the file's sha256 and its appended
    hash, the bolt read; the tool; the swap; the records);
  - ours, onto the member's old data: the same, plus the backup of the
    data it replaces (what a member restoring in place pays).
Prints a table (medians, min-max, ratios to the hand restore).

Usage: bench/restore.py --bin-dir .cache/etcd/bin --migrate target/release/etcd-migrate
       --floor target/release/examples/floor [--keys 200000 --value-bytes 1024 --runs 3]
"""

import argparse
import hashlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

VERSION = "3.5.16"


def log(msg):
    print(f"[restore-bench] {msg}", file=sys.stderr, flush=True)


def timed(cmd, env=None):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    took = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-2000:]}")
    return took


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--migrate", required=True)
    ap.add_argument("--floor", required=True)
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--value-bytes", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--client-port", type=int, default=23791)
    ap.add_argument("--peer-port", type=int, default=23801)
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="restore-bench-", dir=os.environ.get("BENCH_TMP"))
    name = "bench"
    peer = f"http://localhost:{a.peer_port}"
    endpoint = f"http://127.0.0.1:{a.client_port}"
    etcd = os.path.join(a.bin_dir, f"etcd-{VERSION}")
    seed = os.path.join(root, "seed")
    os.mkdir(seed, 0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    logf = open(os.path.join(root, "etcd.log"), "w")
    proc = subprocess.Popen(
        [etcd, f"--name={name}", f"--data-dir={seed}", f"--listen-client-urls={endpoint}",
         f"--advertise-client-urls={endpoint}", f"--listen-peer-urls={peer}",
         f"--initial-advertise-peer-urls={peer}", f"--initial-cluster={name}={peer}"],
        stdout=logf, stderr=logf, env=env)
    snapshot = os.path.join(root, "snapshot.db")
    try:
        deadline = time.time() + 60
        while True:
            r = subprocess.run([a.floor, "seed", "--endpoint", endpoint, "--keys", str(a.keys),
                                "--leased", "0", "--leases", "1", "--value-bytes", str(a.value_bytes)],
                               capture_output=True, text=True)
            if r.returncode == 0:
                break
            if proc.poll() is not None or time.time() > deadline:
                sys.exit(f"cannot seed: {r.stderr}")
            time.sleep(0.2)
        timed([os.path.join(a.bin_dir, f"etcdctl-{VERSION}"), "--endpoints", endpoint,
               "snapshot", "save", snapshot], env=dict(env, ETCDCTL_API="3"))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        logf.close()
    with open(os.path.join(seed, "version.txt"), "w") as f:
        f.write(f"{VERSION}/etcd3")
    h = hashlib.sha256()
    with open(snapshot, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    sha = h.hexdigest()
    size = os.path.getsize(snapshot)
    log(f"{a.keys} keys x {a.value_bytes} B: snapshot {size / 2**20:.1f} MiB")
    flags = ["--name", name, "--initial-cluster", f"{name}={peer}",
             "--initial-advertise-peer-urls", peer]
    res = {"hand": [], "ours-empty": [], "ours-in-place": []}
    for i in range(a.runs):
        d = os.path.join(root, f"hand-{i}")
        res["hand"].append(timed(
            [os.path.join(a.bin_dir, f"etcdutl-{VERSION}"), "snapshot", "restore", snapshot,
             "--data-dir", d, *flags, "--initial-cluster-token", f"etcd-cluster-{sha[:16]}",
             "--bump-revision", "1000000000", "--mark-compacted"], env=env))
        shutil.rmtree(d)
        ours = [a.migrate, "--target-version", VERSION, "--bin-dir", a.bin_dir, "--no-exec",
                "--name", name, "--peer-port", str(a.peer_port),
                "--restore-snapshot", snapshot, "--restore-snapshot-sha256", sha]
        d = os.path.join(root, f"empty-{i}")
        res["ours-empty"].append(timed(ours + ["--data-dir", d,
                                               "--backup-dir", os.path.join(root, f"b-empty-{i}")], env=env))
        shutil.rmtree(d)
        d = os.path.join(root, f"in-place-{i}")
        shutil.copytree(seed, d)
        os.chmod(d, 0o700)
        res["ours-in-place"].append(timed(ours + ["--data-dir", d,
                                                  "--backup-dir", os.path.join(root, f"b-in-place-{i}")], env=env))
        shutil.rmtree(d)
        shutil.rmtree(os.path.join(root, f"b-in-place-{i}"), ignore_errors=True)
        log(f"round {i + 1}/{a.runs}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in res.items()))
    hand = statistics.median(res["hand"])
    print(f"\nrestore from a snapshot: {a.keys} keys x {a.value_bytes} B ({size / 2**20:.1f} MiB), "
          f"etcd {VERSION}, {a.runs} rounds, {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}\n")
    print("| restore | median s | min-max s | ÷ by hand |")
    print("|---|---|---|---|")
    for k, v in res.items():
        m = statistics.median(v)
        print(f"| {k} | {m:.2f} | {min(v):.2f}-{max(v):.2f} | {m / hand:.2f}× |")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
