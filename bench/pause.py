#!/usr/bin/env python3
"""The pause bench of bench/run.sh (BENCH_PAUSE=1; issue 28, item 9).
Stdlib only; the members, the writer's HTTP and the probes are
bench/roll.py's. Not a test: prints figures.

Per case (etcd2: 3.3.25 etcd2 -> etcd3, the storage migration;
etcd3-etcd2: 3.3.25 etcd3 -> etcd2, the storage rollback; F-T: etcd3
F -> T, e.g. 3.4.23-3.3.25, the snapshot rollback) and round, on
fresh data, two variants (the order alternates between rounds):

- cluster: three members created at FROM under etcd-migrate (empty data
  dirs, one --initial-cluster, TARGET_VERSION=FROM and FROM's storage),
  the data written (--keys small keys, --leased of them with a TTL of 1 h
  (etcd2) or on 10 leases of 1 h (etcd3), then --big values of
  --big-bytes); then each member's etcd-migrate restarted (SIGTERM, wait
  for the exit, start) with TARGET_VERSION=TARGET TARGET_STORAGE=<the
  case's target storage> ALLOW_CLUSTER_PAUSE=1, one after the other as a rollout does: the next
  once a write through the one before commits (the job waits for every
  member's agreement, so each serves its old data until then); the last
  is not waited for. The members run the pause job themselves.
- step: one member, created and written the same way (a cluster of one),
  stopped, then started by etcd-migrate in single-member mode with
  TARGET_VERSION=TARGET and the case's target storage (exec mode, as the members
  run): the step is timed from its spawn to the first write its target
  etcd accepts on the member's client URL (a put tried every --poll-ms).
  Exec mode rather than --no-exec: the pause ends at the converter's
  target taking a write, so the step ends there too.

What is measured in the cluster variant, from the first SIGTERM (t0):

- the job: until every member's /version says TARGET and every member's
  version.txt says TARGET/etcd3;
- the pause: a writer puts one key every --write-ms through one member's
  client URL, moving to the next member after a failure (a client with
  three endpoints); a failed put opens a pause, the first accepted put
  after it closes it (start of the first failed put -> end of the first
  accepted one); the longest is the pause;
- the API: on etcd3 data every put is a v3 put (the gateway). On etcd2
  data the writer, the probes and the rollout's checks put through the v2
  API (as an etcd2 client, the API server with --storage-backend=etcd2,
  does) until any member's version.txt records TARGET/etcd3 (the
  converter's, once its data is converted: from then on the old cluster
  is gone), and through v3 after (as that client does once restarted with
  --storage-backend=etcd3). A v2 write acknowledged before the conversion
  must be a v3 key after it. The storage rollback the other way: v3 until
  any member records TARGET/etcd2, v2 after; every v3 write acknowledged
  before it must be a v2 key after it, and the keys are read and counted
  through v2;
- per member, unavailability: a put through its client URL every
  --probe-ms (roll.py's Prober, on the same API rule);
- the phases, from the members' own log lines (their timestamps): the go,
  the converter alone and stopping, the converted data serving, each join,
  the job done;
- afterwards: every acknowledged write present (the writer's keys read
  through v3), the small and big keys counted.

Called by run.sh with every path resolved; see run.sh for the knobs.
"""

import argparse
import base64
import datetime as dt
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse

sys.dont_write_bytecode = True  # no bench/__pycache__ from the import below
from roll import (  # noqa: E402
    NAMES, PATH_ENV, Http, Member, Prober, RollFailure, Round, Sampler, b64, git_commit, med, minor, mr, read_text)

TTL_S = 3600
SOLO = "etcd-solo"
# The members' own log lines that mark the job's phases.
PHASES = (
    ("go", "pause job: every member agreed; this member wrote the go"),
    ("converter stops", "pause job: this member is the old cluster's only member"),
    ("converted data serves", "pause job: the converted data serves as a cluster of this member alone"),
    ("joined", "pause job: this member joined the converted cluster"),
    ("job done", "pause job done"),
)


def log(msg):
    print(f"bench: pause: {msg}", file=sys.stderr, flush=True)


class Case:
    """`etcd2` (3.3.25 etcd2 -> etcd3), `etcd3-etcd2` (3.3.25 etcd3 ->
    etcd2) or `F-T` (etcd3 F -> T)."""

    def __init__(self, name):
        self.name = name
        self.to_storage = "etcd3"
        if name == "etcd2":
            self.from_, self.from_storage, self.target = "3.3.25", "etcd2", "3.3.25"
            self.title = "3.3.25 etcd2 → etcd3 (the storage migration)"
        elif name == "etcd3-etcd2":
            self.from_, self.from_storage, self.target = "3.3.25", "etcd3", "3.3.25"
            self.to_storage = "etcd2"
            self.title = "3.3.25 etcd3 → etcd2 (the storage rollback)"
        else:
            try:
                self.from_, self.target = name.split("-")
            except ValueError:
                raise SystemExit(f"bench: pause: case {name!r}: etcd2, etcd3-etcd2 or FROM-TARGET (e.g. 3.4.23-3.3.25)")
            self.from_storage = "etcd3"
            self.title = f"{self.from_} → {self.target} (the snapshot rollback)"
        self.v2 = self.from_storage == "etcd2"
        self.to_v2 = self.to_storage == "etcd2"
        self.bundle = ",".join(sorted({self.from_, self.target}))


class PauseRound(Round):
    """One variant ('cluster' or 'step') of one case on fresh data."""

    def __init__(self, a, case, variant, index):
        self.case = case
        self.kind = variant
        super().__init__(a, f"{case.name}-{variant}", index)
        if variant == "step":
            m = Member(3, SOLO, self.root, a.base_port, f"{SOLO}=http://127.0.0.1:{a.base_port + 32}")
            self.members = [m]
            self.ctl = {m.name: Http(m.client_port, a.request_timeout_s)}
        self.converted = False
        self.tag = f"{self.index + 1}-{case.name}-{variant}"
        self.log_offsets = {}
        self.warnings = []

    # ---------- processes ----------
    def spawn(self, m, version, storage, consent=False):
        cmd = [self.a.migrate, "--bin-dir", self.a.bin_dir, "--bundled-versions", self.case.bundle,
               "--port", str(m.step_port), "--peer-port", str(m.step_peer_port), "--", *m.args]
        env = {"PATH": PATH_ENV, "TARGET_VERSION": version, "TARGET_STORAGE": storage}
        if consent:
            env["ALLOW_CLUSTER_PAUSE"] = "1"
        what = " ".join(f"{k}={v}" for k, v in env.items() if k != "PATH")
        with open(m.logpath, "a") as f:
            f.write(f"=== bench: {dt.datetime.now().isoformat(timespec='milliseconds')} start "
                    f"etcd-migrate {what}: {' '.join(cmd)}\n")
            f.flush()
            m.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=env,
                                      start_new_session=True)
        m.starts.append((time.monotonic(), what))

    def check_alive(self):
        super().check_alive()
        self.check_errors()

    def check_errors(self):
        """etcd-migrate's own `error` lines stop the round (a finding);
        `warn` lines are kept for the report."""
        for m in self.members:
            off = self.log_offsets.get(m.name, 0)
            try:
                with open(m.logpath, errors="replace") as f:
                    f.seek(off)
                    chunk = f.read()
            except OSError:
                continue
            cut = chunk.rfind("\n") + 1
            self.log_offsets[m.name] = off + cut
            for ln in chunk[:cut].splitlines():
                if not ln.startswith("[etcd-migrate] "):
                    continue
                level = ln.split(" ", 3)[2:3]
                if level == ["error"]:
                    raise RollFailure(f"{m.name} logged an error: {ln[:600]}")
                if level == ["warn"]:
                    self.warnings.append(f"{m.name}: {ln[:400]}")

    # ---------- the API rule ----------
    def v2_now(self):
        """The data's API: the old storage's until any member records
        TARGET and the target storage, the target storage's from then on
        (etcd2: v2)."""
        if not self.converted:
            want = f"{self.case.target}/{self.case.to_storage}"
            if any(read_text(os.path.join(m.data, "version.txt")) == want for m in self.members):
                self.converted = True
        return self.case.to_v2 if self.converted else self.case.v2

    def put(self, h, key, value):
        if self.v2_now():
            return h.put_v2(key, value)
        return h.put(key, value)

    def write_commits(self, m):
        ok, _, _ = self.put(self.ctl[m.name], f"/bench/health/{m.name}", "x")
        return ok

    # ---------- data ----------
    def seed(self):
        a, c = self.a, self.case
        t = time.monotonic()
        if c.v2:
            self.seed_v2()
        else:
            for prefix, keys, leased, leases, vb in (("/small", a.keys, a.leased, 10, a.small_bytes),
                                                     ("/big", a.big, 0, 1, a.big_bytes)):
                if keys == 0:
                    continue
                r = subprocess.run([a.floor, "seed", "--endpoint", self.members[0].client_url,
                                    "--prefix", prefix, "--keys", str(keys), "--leased", str(leased),
                                    "--leases", str(leases), "--value-bytes", str(vb),
                                    "--concurrency", "64"],
                                   capture_output=True, text=True, timeout=a.deadline_s)
                if r.returncode != 0:
                    raise RollFailure(f"seeding {prefix} failed: {r.stderr.strip()}")
        self.seed_s = time.monotonic() - t
        log(f"round {self.index + 1} {self.case.name} {self.kind}: seeded {a.keys} small keys "
            f"({a.leased} with a TTL/lease) and {a.big} x {a.big_bytes} B in {time.monotonic() - t:.1f} s")

    def seed_v2(self):
        """The same key names as `floor seed` (/small/events/... with a TTL,
        /small/pods/..., /big/pods/...), through the v2 API: --seed-conns
        connections over the members' client URLs, each with 8 puts
        pipelined (a thread per put cost more CPU than etcd did)."""
        a = self.a
        small, big = "s" * a.small_bytes, "b" * a.big_bytes
        items = [(f"/small/events/default/event-{i:07d}" if i < a.leased else f"/small/pods/default/pod-{i:07d}",
                  small, TTL_S if i < a.leased else None) for i in range(a.keys)]
        items += [(f"/big/pods/default/pod-{i:07d}", big, None) for i in range(a.big)]
        try:
            refused = v2_pipelined([m.client_port for m in self.members], items, a.seed_conns, 8,
                                   timeout=60.0)
        except (OSError, ValueError) as e:
            raise RollFailure(f"v2 seeding failed: {type(e).__name__}: {e}")
        if refused:
            raise RollFailure(f"v2 seeding: {len(refused)} puts refused, e.g. {refused[:3]}")

    def count(self, h, prefix):
        ok, _, payload = h.request("POST", "/kv/range", {"key": b64(prefix), "range_end": b64(prefix[:-1] + "0"),
                                                        "count_only": True})
        if not ok:
            raise RollFailure(f"counting {prefix} failed: {payload!r}")
        return int(json.loads(payload).get("count", 0))

    def count_v2(self, h, prefix):
        """The keys under `prefix` of a v2 store (the values come along:
        v2 has no keys-only read)."""
        ok, status, payload = h.request("GET", f"/v2/keys{prefix[:-1]}?recursive=true")
        if not ok:
            raise RollFailure(f"counting {prefix} through v2 failed: {status} {payload[:200]!r}")
        return len(v2_leaves(json.loads(payload).get("node", {})))

    def check_counts(self, port):
        h = Http(port, 60.0)
        count = self.count_v2 if self.case.to_v2 else self.count
        try:
            got = {p: count(h, p) for p in ("/small/", "/big/")}
        finally:
            h.close()
        want = {"/small/": self.a.keys, "/big/": self.a.big}
        if got != want:
            raise RollFailure(f"after the change: keys {got}, written {want}")
        return got

    def create(self, consent=False):
        """The member(s) at FROM under etcd-migrate, the data written."""
        c = self.case
        self.wait_ports_free()
        for m in self.members:
            self.spawn(m, c.from_, c.from_storage)
        self.wait_until(f"the {c.from_} cluster forms", lambda: self.all_report(c.from_, minor(c.from_)))
        for m in self.members:
            self.wait_until(f"a write through {m.name}", lambda: self.write_commits(m), poll=0.05)
        self.seed()
        for m in self.members:
            got = read_text(os.path.join(m.data, "version.txt"))
            if got != f"{c.from_}/{c.from_storage}":
                raise RollFailure(f"{m.name}: version.txt is {got!r} after the creation")

    # ---------- cluster ----------
    def start_load(self):
        a = self.a
        writer_http = [Http(m.client_port, a.request_timeout_s) for m in self.members]
        state = {"seq": 0, "at": 0}

        def put_one():
            seq = state["seq"]
            state["seq"] += 1
            at = state["at"]
            v2 = self.v2_now()
            h = writer_http[at]
            key = f"/bench/w/{self.tag}/{seq:08d}"
            ok, status, err = h.put_v2(key, str(seq)) if v2 else h.put(key, str(seq))
            if not ok:
                state["at"] = (at + 1) % len(writer_http)
            return ok, (seq, at, "v2" if v2 else "v3", None if ok else f"{status} {err!r}"[:200])

        self.writer = Sampler("writer", a.write_ms / 1000, put_one)
        self.probes = {m.name: Prober(m.name, m.client_port, a.probe_ms / 1000, a.request_timeout_s,
                                      put=self.put)
                       for m in self.members}
        vh = {m.name: Http(m.client_port, a.request_timeout_s) for m in self.members}

        def versions():
            return True, {n: (h.version(), read_text(os.path.join(m.data, "version.txt")))
                          for m, (n, h) in zip(self.members, vh.items())}

        self.monitor = Sampler("versions", 0.1, versions)
        self.writer_http = writer_http + list(vh.values())
        self.load = [self.writer, self.monitor, *self.probes.values()]
        for t in self.load:
            t.start()

    def stop_load(self):
        for t in self.load:
            t.stop()
        for h in self.writer_http:
            h.close()

    def job_done(self):
        c = self.case
        want = f"{c.target}/{c.to_storage}"
        if not all(read_text(os.path.join(m.data, "version.txt")) == want for m in self.members):
            return False
        return all(v is not None and v[0] == c.target for v in self.versions())

    def records_gone(self):
        return not any(os.path.exists(os.path.join(m.data, ".etcd-migrate.pause")) for m in self.members)

    def rollout(self):
        a, c = self.a, self.case
        marks = {"t0": time.monotonic()}
        self.t0_wall = time.time()
        last = self.members[-1]
        for m in self.members:
            rc = self.stop_member(m)
            self.spawn(m, c.target, c.to_storage, consent=True)
            if m is not last:
                self.wait_until(f"{m.name} serves again after its restart with the consent",
                                lambda: self.write_commits(m), poll=a.poll_ms / 1000)
            log(f"round {self.index + 1} {c.name}: {m.name} restarted with the consent (it exited {rc}) "
                f"at {time.monotonic() - marks['t0']:.1f} s")
        marks["rollout_done"] = time.monotonic()
        marks["end"] = self.wait_until(f"every member serves {c.target} and records {c.target}/{c.to_storage}",
                                       self.job_done, poll=0.05)
        marks["records_gone"] = self.wait_until("every member's .etcd-migrate.pause removed",
                                                self.records_gone, poll=0.05)
        return marks

    def verify_cluster(self):
        """Every acknowledged write is a key of the target storage; the
        seeded keys are there."""
        counts = self.check_counts(self.members[1].client_port)
        prefix = f"/bench/w/{self.tag}/"
        if self.case.to_v2:
            return self.verify_cluster_v2(counts, prefix)
        h = Http(self.members[2].client_port, 30.0)
        try:
            ok, _, payload = h.request("POST", "/kv/range", {"key": b64(prefix), "range_end": b64(prefix[:-1] + "0"),
                                                            "keys_only": True})
            if not ok:
                raise RollFailure(f"reading the writer's keys failed: {payload!r}")
            present = {b64d(kv["key"]) for kv in json.loads(payload).get("kvs", [])}
            acked = [(x[3][0], x[3][2]) for x in self.writer.samples if x[2]]
            missing = [(s, api) for s, api in acked if f"{prefix}{s:08d}" not in present]
            # A v2 put that reached the converted data (it cannot, by the
            # API rule, but if it did) is in its v2 store, not lost.
            in_v2 = []
            for s, api in missing:
                if api == "v2":
                    ok, _, _ = h.request("GET", f"/v2/keys{prefix}{s:08d}")
                    if ok:
                        in_v2.append(s)
            lost = [s for s, _ in missing if s not in in_v2]
        finally:
            h.close()
        return dict(counts=counts, acked=len(acked), acked_v2=sum(1 for _, api in acked if api == "v2"),
                    present=len(present), lost=len(lost), lost_seqs=lost[:20], in_v2_store=len(in_v2))

    def verify_cluster_v2(self, counts, prefix):
        """Every acknowledged write (v3 before the rollback, v2 after) is a
        key of the v2 store."""
        h = Http(self.members[2].client_port, 60.0)
        try:
            ok, status, payload = h.request("GET", f"/v2/keys{prefix[:-1]}?recursive=true")
        finally:
            h.close()
        if not ok:
            raise RollFailure(f"reading the writer's keys through v2 failed: {status} {payload[:200]!r}")
        present = set(v2_leaves(json.loads(payload).get("node", {})))
        acked = [(x[3][0], x[3][2]) for x in self.writer.samples if x[2]]
        lost = [s for s, _ in acked if f"{prefix}{s:08d}" not in present]
        return dict(counts=counts, acked=len(acked), acked_v2=sum(1 for _, api in acked if api == "v2"),
                    present=len(present), lost=len(lost), lost_seqs=lost[:20], in_v2_store=0)

    def phases(self):
        """(phase, member, seconds from t0) from the members' log lines."""
        out = []
        for m in self.members:
            for ln in read_text(m.logpath).splitlines():
                if not ln.startswith("[etcd-migrate] "):
                    continue
                for phase, needle in PHASES:
                    if needle in ln:
                        out.append((phase, m.name, log_time(ln) - self.t0_wall))
        return sorted(out, key=lambda x: x[2])

    def figures(self, marks):
        t0, end = marks["t0"], marks["end"]
        out = dict(case=self.case.name, variant="cluster", round=self.index + 1, job_s=end - t0,
                   t0_utc=dt.datetime.fromtimestamp(self.t0_wall, dt.timezone.utc).isoformat(timespec="milliseconds"),
                   marks={k: v - t0 for k, v in marks.items()})
        w = self.writer.samples
        # Runs of failed puts: from the start of a run's first failed put to
        # the end of the first accepted put after it.
        pauses, run_start, fails = [], None, 0
        for (s, e, ok, extra) in w:
            if not ok:
                if run_start is None:
                    run_start, fails = s, 0
                fails += 1
            elif run_start is not None:
                pauses.append((run_start - t0, e - t0, fails))
                run_start = None
        pauses = [p for p in pauses if p[1] > 0]
        longest = max(pauses, key=lambda p: p[1] - p[0], default=(0.0, 0.0, 0))
        out["pause_s"] = longest[1] - longest[0]
        out["pause_span"] = [round(longest[0], 3), round(longest[1], 3)]
        out["pause_failed_puts"] = longest[2]
        out["failed_runs"] = [[round(x, 3), round(y, 3), n] for x, y, n in pauses]
        done = sorted(x[1] for x in w if x[2])
        gap = 0.0
        for x, y in zip(done, done[1:]):
            if y > t0 and x < end:
                gap = max(gap, y - x)
        out["longest_gap_s"] = gap
        in_job = [x for x in w if t0 <= x[0] <= end]
        out["writes_ok"] = sum(1 for x in in_job if x[2])
        out["writes_failed"] = sum(1 for x in in_job if not x[2])
        errs = {}
        for x in in_job:
            if not x[2]:
                k = (x[3][3] or "")[:60]
                errs[k] = errs.get(k, 0) + 1
        out["write_errors"] = dict(sorted(errs.items(), key=lambda kv: -kv[1])[:5])
        unavail, spans = {}, {}
        for name, p in self.probes.items():
            s = p.samples
            total, runs, prev = 0.0, [], False
            for k in range(len(s) - 1):
                a_, b_ = max(s[k][0], t0), min(s[k + 1][0], end)
                failed = not s[k][2] and b_ > a_
                if failed:
                    total += b_ - a_
                    if prev:
                        runs[-1][1] = b_ - t0
                    else:
                        runs.append([a_ - t0, b_ - t0])
                prev = failed
            unavail[name] = total
            spans[name] = [[round(x, 2), round(y, 2)] for x, y in runs]
        out["unavailable_s"] = unavail
        out["outage_spans"] = spans
        firsts = {}
        for (s, _, _, vs) in self.monitor.samples:
            for name, (v, txt) in vs.items():
                if v is not None:
                    firsts.setdefault(f"{name} serves {v[0]}", round(s - t0, 2))
                if txt:
                    firsts.setdefault(f"{name} records {txt}", round(s - t0, 2))
        out["first_seen"] = firsts
        ph = self.phases()
        out["phases"] = [[p, n, round(t, 3)] for p, n, t in ph]

        def first(phase, n=1):
            ts = [t for p, _, t in ph if p == phase]
            return ts[n - 1] if len(ts) >= n else None

        # The go names the leader as the converter, not always its writer.
        out["converter"] = next((n for p, n, _ in ph if p == "converter stops"), None)
        stop, serve = first("converter stops"), first("converted data serves")
        out["converter_stop_to_serve_s"] = (serve - stop) if stop is not None and serve is not None else None
        out["phase_marks"] = {"go": first("go"), "converter stops": stop, "converted data serves": serve,
                              "first joined": first("joined", 1), "second joined": first("joined", 2),
                              "job done (log)": first("job done")}
        return out

    def run_cluster(self):
        a = self.a
        try:
            self.create()
            self.start_load()
            time.sleep(a.warmup_s)
            marks = self.rollout()
            time.sleep(0.3)
            self.stop_load()
            stats = self.figures(marks)
            stats["seed_s"] = self.seed_s
            stats["checked"] = self.verify_cluster()
            if stats["checked"]["lost"]:
                raise RollFailure(f"{stats['checked']['lost']} acknowledged writes missing after the job, "
                                  f"e.g. {stats['checked']['lost_seqs']}")
            self.check_errors()
            stats["warnings"] = self.warnings
            return stats
        except RollFailure as e:
            self.fail(str(e))
        finally:
            self.cleanup()

    # ---------- step ----------
    def run_step(self):
        a, c = self.a, self.case
        m = self.members[0]
        try:
            self.create()
            rc = self.stop_member(m)
            log(f"round {self.index + 1} {c.name} step: {m.name} at {c.from_}/{c.from_storage} stopped "
                f"(exit {rc}); starting it with TARGET_VERSION={c.target} TARGET_STORAGE={c.to_storage}")
            h = Http(m.client_port, a.request_timeout_s)
            t0 = time.monotonic()
            self.t0_wall = time.time()
            self.spawn(m, c.target, c.to_storage)
            attempts = [0]

            def accepted():
                attempts[0] += 1
                ok, _, _ = h.put_v2("/bench/step", "x") if c.to_v2 else h.put("/bench/step", "x")
                return ok

            end = self.wait_until(f"{m.name}'s target takes a write", accepted, poll=a.poll_ms / 1000)
            h.close()
            want = f"{c.target}/{c.to_storage}"
            recorded = self.wait_until(f"{m.name} records {want}",
                                       lambda: read_text(os.path.join(m.data, "version.txt")) == want, poll=0.05)
            v = self.ctl[m.name].version()
            if v is None or v[0] != c.target:
                raise RollFailure(f"{m.name} serves {v} after the step, not {c.target}")
            counts = self.check_counts(m.client_port)
            self.check_errors()
            steps = [ln for ln in read_text(m.logpath).splitlines()
                     if ln.startswith("[etcd-migrate] ") and ("step" in ln.split(" ", 3)[3][:40])]
            return dict(case=c.name, variant="step", round=self.index + 1, step_s=end - t0,
                        recorded_s=recorded - t0, attempts=attempts[0], counts=counts, seed_s=self.seed_s,
                        t0_utc=dt.datetime.fromtimestamp(self.t0_wall, dt.timezone.utc)
                        .isoformat(timespec="milliseconds"),
                        log_steps=[s[:300] for s in steps[-12:]], warnings=self.warnings)
        except RollFailure as e:
            self.fail(str(e))
        finally:
            self.cleanup()

    def run(self):
        return self.run_cluster() if self.kind == "cluster" else self.run_step()

    def fail(self, msg):
        # The load's threads stop sending first (a probe's pool is shut
        # down at exit).
        for t in getattr(self, "load", []):
            t.stop_ev.set()
        super().fail(msg)


def v2_pipelined(ports, items, conns, window, timeout):
    """Puts every (key, value, ttl) of `items` through the v2 API over
    `conns` keep-alive connections spread over `ports`, up to `window`
    requests pipelined on each (HTTP/1.1: answered in order), from one
    thread. Returns the statuses of the puts refused (not 200/201)."""
    reqs = []
    for key, value, ttl in items:
        form = {"value": value}
        if ttl:
            form["ttl"] = str(ttl)
        body = urllib.parse.urlencode(form).encode()
        reqs.append(b"PUT /v2/keys" + urllib.parse.quote(key).encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: "
                    + str(len(body)).encode() + b"\r\n\r\n" + body)
    sel = selectors.DefaultSelector()
    states = []
    for c in range(min(conns, len(reqs))):
        sock = socket.create_connection(("127.0.0.1", ports[c % len(ports)]), timeout=timeout)
        sock.setblocking(False)
        st = {"sock": sock, "out": b"", "inflight": 0, "buf": b""}
        states.append(st)
        sel.register(sock, selectors.EVENT_READ, st)
    nxt = done = 0
    refused = []
    deadline = time.monotonic() + timeout
    try:
        while done < len(reqs):
            for st in states:
                while st["inflight"] < window and nxt < len(reqs):
                    st["out"] += reqs[nxt]
                    nxt += 1
                    st["inflight"] += 1
                sel.modify(st["sock"], selectors.EVENT_READ | (selectors.EVENT_WRITE if st["out"] else 0), st)
            events = sel.select(timeout=1.0)
            if not events:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{done} of {len(reqs)} v2 puts answered, then none for {timeout:g} s")
                continue
            deadline = time.monotonic() + timeout
            for key, mask in events:
                st = key.data
                if mask & selectors.EVENT_WRITE and st["out"]:
                    sent = st["sock"].send(st["out"])
                    st["out"] = st["out"][sent:]
                if mask & selectors.EVENT_READ:
                    chunk = st["sock"].recv(1 << 20)
                    if not chunk:
                        raise ConnectionError(f"a member closed a connection after {done} v2 puts")
                    st["buf"] += chunk
                    while True:
                        r = http_response(st["buf"])
                        if r is None:
                            break
                        status, used = r
                        st["buf"] = st["buf"][used:]
                        st["inflight"] -= 1
                        done += 1
                        if status not in (200, 201):
                            refused.append(status)
    finally:
        for st in states:
            sel.unregister(st["sock"])
            st["sock"].close()
    return refused


def http_response(buf):
    """(status, bytes used) of the first whole HTTP/1.1 response in `buf`,
    or None while it is incomplete."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    head = buf[:head_end].decode("latin-1").split("\r\n")
    status = int(head[0].split(" ", 2)[1])
    headers = {}
    for ln in head[1:]:
        k, _, v = ln.partition(":")
        headers[k.strip().lower()] = v.strip()
    pos = head_end + 4
    if "content-length" in headers:
        end = pos + int(headers["content-length"])
        return (status, end) if len(buf) >= end else None
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            le = buf.find(b"\r\n", pos)
            if le < 0:
                return None
            size = int(buf[pos:le].split(b";")[0], 16)
            pos = le + 2 + size + 2
            if len(buf) < pos:
                return None
            if size == 0:
                return status, pos
    return status, pos


def b64d(s):
    return base64.b64decode(s).decode()


def v2_leaves(node):
    """The keys of the leaves under a v2 `node` (a recursive GET's)."""
    if not node.get("dir"):
        return [node["key"]] if "key" in node else []
    out = []
    for child in node.get("nodes", []):
        out.extend(v2_leaves(child))
    return out


def log_time(line):
    """The wall time of an `[etcd-migrate] <rfc3339 ms, UTC> ...` line."""
    ts = line.split(" ", 2)[1]
    return dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc).timestamp()


def uptime():
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: %.2f, %.2f, %.2f" % os.getloadavg()


# ---------- output ----------
def ratio(x, y):
    return x / y if y else float("nan")


def table(a, case, results, load, started, notes=()):
    cl = [r for r in results if r["variant"] == "cluster"]
    st = [r for r in results if r["variant"] == "step"]
    n = len(cl)
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    step_med = med([r["step_s"] for r in st])
    by_round = {r["round"]: r for r in st}
    pr = [ratio(r["pause_s"], by_round[r["round"]]["step_s"]) for r in cl]
    jr = [ratio(r["job_s"], by_round[r["round"]]["step_s"]) for r in cl]
    pause_med, job_med = med([r["pause_s"] for r in cl]), med([r["job_s"] for r in cl])
    out = []
    p = out.append
    p(f"# The whole-cluster pause, {case.title}: 3 members against the single-member step")
    p("")
    p(f"Measured by `BENCH_PAUSE=1 BENCH_PAUSE_CASES={case.name} BENCH_PAUSE_RUNS={n} "
      f"BENCH_PAUSE_KEYS={a.keys} BENCH_PAUSE_BIG={a.big} bench/run.sh` ({started}): "
      f"{os.cpu_count()} cores (`nproc`), {mem_gib:.0f} GiB RAM, every member on 127.0.0.1 (ports "
      f"{a.base_port + 1}–{a.base_port + 34}), plain http, etcd's default timings; etcd-migrate "
      f"{a.commit_label}, release build; {n} round{'s' if n != 1 else ''}, each variant on fresh data written at "
      f"{case.from_} ({case.from_storage}): {a.keys} small keys of {a.small_bytes} B ({a.leased} of them "
      + ("with a v2 TTL of 1 h" if case.v2 else "on 10 leases of 1 h")
      + f") and {a.big} keys of {a.big_bytes} B, "
      + ("through the v2 API" if case.v2 else "through v3 (`floor seed`)")
      + "; the cluster and the step alternating which goes first. Seconds, median [min–max] over the rounds.")
    p("")
    p(f"`uptime` before: `{load['before']}`; after: `{load['after']}`.")
    p("")
    for note in notes:  # a results JSON's "notes" (added by hand: what a run could not show)
        p(note)
        p("")
    p(f"- **cluster**: 3 members at {case.from_} under etcd-migrate; each one's etcd-migrate restarted with "
      f"`TARGET_VERSION={case.target} TARGET_STORAGE={case.to_storage} ALLOW_CLUSTER_PAUSE=1`, one after the "
      f"other, each once a write through the one before commits (the last not waited for); the "
      f"members do the pause job themselves.")
    p(f"- **job**: first SIGTERM → every member's `/version` says {case.target} and its `version.txt` "
      f"says `{case.target}/{case.to_storage}`.")
    p(f"- **pause**: a writer puts one key every {a.write_ms} ms through one member's client URL, "
      f"moving to the next member after a failure, each put with a {a.request_timeout_s:g} s deadline; "
      f"the longest span from a failed put's start to the end of the first put accepted after it. "
      + ("On this etcd2 data the writer (and the probes) put through the v2 API until the converter "
         "records 3.3.25/etcd3, through v3 after, as an etcd2 client restarted onto etcd3 would; "
         "every v2 write acknowledged before the pause must be a v3 key after it. " if case.v2 else "")
      + ("The writer (and the probes) put through v3 until the converter records 3.3.25/etcd2, "
         "through the v2 API after, as a client restarted onto etcd2 storage would; every v3 write "
         "acknowledged before the pause must be a v2 key after it, read (and the seeded keys "
         "counted) through v2. " if case.to_v2 else "")
      + "**Server side**: the converter's own log, from its line that it is alone and stops to "
        "its line that the converted data serves.")
    p(f"- **step**: one member created and written the same way (a cluster of one), stopped, then "
      f"started by etcd-migrate with `TARGET_VERSION={case.target} TARGET_STORAGE={case.to_storage}` (single-member "
      f"mode, exec, as the members run): spawn → the first {'v2' if case.to_v2 else 'v3'} put its target etcd accepts on the "
      f"member's client URL (tried every {a.poll_ms} ms). The pause likewise ends at the converter's "
      f"target taking a write, and includes the old etcd's stop, which the step does not.")
    p("")
    p("| measure | median [min–max] | goal |")
    p("|---|---|---|")
    p(f"| **pause** (the writer's) | {mr([r['pause_s'] for r in cl], 2)} | |")
    conv = [r["converter_stop_to_serve_s"] for r in cl if r["converter_stop_to_serve_s"] is not None]
    if conv:
        p(f"| – server side (the converter's stop → its converted data serves) | {mr(conv, 2)} | |")
    p(f"| **job** | {mr([r['job_s'] for r in cl])} | |")

    def phase_row(label, fa, fb):
        xs = [fb(r) - fa(r) for r in cl if fa(r) is not None and fb(r) is not None]
        if xs:
            p(f"| {label} | {mr(xs, 2)} | |")

    pm = lambda k: (lambda r: r["phase_marks"].get(k))
    last = [r["job_s"] - r["marks"]["rollout_done"] for r in cl]
    p(f"| – the job from the last member's restart (as the cluster tests count it) | {mr(last)} | |")
    phase_row("– the rollout (first SIGTERM → the last member started)", lambda r: 0.0,
              lambda r: r["marks"]["rollout_done"])
    phase_row("– then the go (every member agreed)", lambda r: r["marks"]["rollout_done"], pm("go"))
    phase_row("– then the converter alone stops (the others removed)", pm("go"), pm("converter stops"))
    phase_row("– then the converted data serves (server-side pause)", pm("converter stops"),
              pm("converted data serves"))
    phase_row("– then the first member joined", pm("converted data serves"), pm("first joined"))
    phase_row("– then the second member joined", pm("first joined"), pm("second joined"))
    p(f"| **single-member step** | {mr([r['step_s'] for r in st], 2)} | |")
    p(f"| **pause / step** (medians; per round) | {pause_med / step_med:.2f} ({mr(pr, 2)}) | ≤ 1.5 "
      f"{'✓' if pause_med / step_med <= 1.5 else '✗'} |")
    p(f"| **job / step** (medians; per round) | {job_med / step_med:.2f} ({mr(jr, 2)}) | ≤ 3 "
      f"{'✓' if job_med / step_med <= 3 else '✗'} |")
    p(f"| – the job from the last restart / step (medians) | {med(last) / step_med:.2f} | |")
    p(f"| longest gap between two accepted writes | {mr([r['longest_gap_s'] for r in cl], 2)} | |")
    for name in NAMES:
        p(f"| {name} unavailable (its probe: a put every {a.probe_ms} ms) | "
          f"{mr([r['unavailable_s'][name] for r in cl], 2)} | |")
    p(f"| writes acknowledged during the job | {mr([r['writes_ok'] for r in cl], 0)} | |")
    p(f"| writes failed during the job | {mr([r['writes_failed'] for r in cl], 0)} | |")
    p(f"| acknowledged writes lost (whole run) | {sum(r['checked']['lost'] for r in cl)} of "
      f"{sum(r['checked']['acked'] for r in cl)} | 0 |")
    p("")
    p("Per round (seconds):")
    p("")
    p("| round | converter | pause | server side | job | rollout → go | go → converter stops | serves → job end | step | pause / step | job / step | writes acked (v2) / lost | failed puts in the pause |")
    p("|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def span(r, a_, b_):
        x_, y_ = r["phase_marks"].get(a_) if a_ != "rollout" else r["marks"]["rollout_done"], \
            r["phase_marks"].get(b_) if b_ != "end" else r["job_s"]
        return "–" if x_ is None or y_ is None else f"{y_ - x_:.1f}"

    for r, x, y in zip(cl, pr, jr):
        s = by_round[r["round"]]["step_s"]
        c = r["checked"]
        sv = r["converter_stop_to_serve_s"]
        p(f"| {r['round']} | {r['converter']} | {r['pause_s']:.2f} | {'–' if sv is None else f'{sv:.2f}'} | "
          f"{r['job_s']:.1f} | {span(r, 'rollout', 'go')} | {span(r, 'go', 'converter stops')} | "
          f"{span(r, 'converted data serves', 'end')} | {s:.2f} | {x:.2f} | {y:.2f} | "
          f"{c['acked']} ({c['acked_v2']}) / {c['lost']} | {r['pause_failed_puts']} |")
    p("")
    warns = sorted({w.split(" ", 4)[-1][:160] for r in results for w in r.get("warnings", [])})
    p(f"etcd-migrate's `error` lines: 0 (a round stops at the first). Its `warn` lines: {len(warns)} distinct"
      + ("." if not warns else ":"))
    for w in warns[:10]:
        p(f"- `{w}`")
    if warns:
        p("")
    api = "v2" if case.to_v2 else "v3"
    p(f"After every round: the {a.keys} small and {a.big} big keys counted through {api} on the members' "
      f"target and on the step's, every acknowledged write of the writer read back through {api}.")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    paths = ("root", "bin-dir", "migrate", "floor", "out", "repo")
    for k in paths:
        ap.add_argument(f"--{k}", default="")
    for k, v in (("runs", 1), ("base-port", 24200), ("keys", 10000), ("leased", 1000), ("small-bytes", 128),
                 ("big", 200000), ("big-bytes", 1024), ("write-ms", 10), ("probe-ms", 20), ("poll-ms", 10),
                 ("deadline-s", 600), ("seed-conns", 16)):
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--request-timeout-s", type=float, default=1.0)
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--cases", default="etcd2,3.4.23-3.3.25")
    ap.add_argument("--variants", default="cluster,step",
                    help="both for the results; one alone only logs its figures (to look into one)")
    ap.add_argument("--commit-label", default="")
    ap.add_argument("--render", default="", help="only write the .md again from this results JSON")
    a = ap.parse_args()
    if a.render:
        with open(a.render) as f:
            d = json.load(f)
        for k, v in d["settings"].items():
            setattr(a, k, v)
        a.commit_label = d["build"]
        text = table(a, Case(d["case"]), d["rounds"], d["uptime"], d["date"], d.get("notes", ()))
        with open(a.render[:-len(".json")] + ".md", "w") as f:
            f.write(text + "\n")
        print(text)
        return
    missing = [f"--{k}" for k in paths if not getattr(a, k.replace("-", "_"))]
    if missing:
        ap.error(f"needs {', '.join(missing)} (run it through bench/run.sh)")
    if not a.commit_label:
        a.commit_label = f"at commit `{git_commit(a.repo)}`"
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            eph_lo, eph_hi = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        eph_lo, eph_hi = 32768, 60999
    if not 1024 <= a.base_port or not (a.base_port + 40 < eph_lo or a.base_port > eph_hi):
        sys.exit(f"bench: pause: ports {a.base_port}-{a.base_port + 40} are not clear of the "
                 f"ephemeral range {eph_lo}-{eph_hi}; set BENCH_PAUSE_PORT")
    cases = [Case(c.strip()) for c in a.cases.split(",") if c.strip()]
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    if not variants or set(variants) - {"cluster", "step"}:
        sys.exit(f"bench: pause: --variants {a.variants!r}: cluster, step or both")
    for c in cases:
        for v in (c.from_, c.target):
            if not os.access(os.path.join(a.bin_dir, f"etcd-{v}"), os.X_OK):
                sys.exit(f"bench: pause: etcd-{v} missing in {a.bin_dir}")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    os.makedirs(a.out, exist_ok=True)
    current = None
    try:
        for case in cases:
            started = dt.datetime.now().strftime("%Y-%m-%d")
            load = {"before": uptime()}
            log(f"case {case.name}: {case.title}; {load['before']}")
            results = []
            for i in range(a.runs):
                order = ("cluster", "step") if i % 2 == 0 else ("step", "cluster")
                order = [v for v in order if v in variants]
                for variant in order:
                    up = uptime()
                    log(f"round {i + 1}/{a.runs} {case.name}: {variant} ({up})")
                    current = PauseRound(a, case, variant, i)
                    r = current.run()
                    current = None
                    r["uptime_before"] = up
                    r["uptime_after"] = uptime()
                    results.append(r)
                    if variant == "cluster":
                        log(f"round {i + 1} {case.name} cluster: pause {r['pause_s']:.2f} s "
                            f"({r['pause_span']}, {r['pause_failed_puts']} failed puts), server side "
                            f"{r['converter_stop_to_serve_s']}, job {r['job_s']:.1f} s; converter "
                            f"{r['converter']}; phases {r['phase_marks']}; marks {r['marks']}; writes acked "
                            f"{r['checked']['acked']} (v2 {r['checked']['acked_v2']}), lost "
                            f"{r['checked']['lost']}, in the v2 store {r['checked']['in_v2_store']}; "
                            f"unavailable {r['unavailable_s']}; failed runs {r['failed_runs']}; "
                            f"write errors {r['write_errors']}")
                    else:
                        log(f"round {i + 1} {case.name} step: {r['step_s']:.2f} s to the target's first "
                            f"write ({r['attempts']} puts); recorded at {r['recorded_s']:.2f} s")
                    # The data dirs and backups go; the logs stay (BENCH_KEEP=1).
                    rd = os.path.join(a.root, f"round{i + 1}-{case.name}-{variant}")
                    for e in os.listdir(rd):
                        if e != "logs":
                            shutil.rmtree(os.path.join(rd, e), ignore_errors=True)
            load["after"] = uptime()
            if set(variants) != {"cluster", "step"}:
                log(f"case {case.name}: only {', '.join(variants)} run; no results written")
                continue
            text = table(a, case, results, load, started)
            print(text, flush=True)
            base = os.path.join(a.out, f"pause-{case.name}")
            with open(base + ".md", "w") as f:
                f.write(text + "\n")
            with open(base + ".json", "w") as f:
                json.dump(dict(case=case.name, title=case.title, cpus=os.cpu_count(), uptime=load, date=started,
                               build=a.commit_label,
                               settings=dict(base_port=a.base_port, keys=a.keys, leased=a.leased, small_bytes=a.small_bytes, big=a.big,
                                             big_bytes=a.big_bytes, write_ms=a.write_ms, probe_ms=a.probe_ms,
                                             poll_ms=a.poll_ms, request_timeout_s=a.request_timeout_s),
                               rounds=results), f, indent=1)
            log(f"wrote {base}.md and {base}.json")
    except KeyboardInterrupt:
        if current is not None:
            current.cleanup()
        raise


if __name__ == "__main__":
    main()
