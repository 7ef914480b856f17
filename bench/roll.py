#!/usr/bin/env python3
"""The roll bench of bench/run.sh (BENCH_ROLL=1; issue 21, part 3). Stdlib
only. Not a test: prints figures.

Per round, on fresh data, twice (the order alternates between rounds):

- ours: three members created at FROM under etcd-migrate
  (TARGET_VERSION=FROM, empty data dirs, one --initial-cluster), some data
  written; then, as an operator's rollout does, each member's etcd-migrate
  is restarted with TARGET_VERSION=TARGET, one after the other, each once
  a write through its predecessor's client URL commits. The entrypoints
  roll the cluster FROM -> MID -> TARGET themselves.
- floor: the same three members as plain etcd FROM with the same flags and
  the same data; then by hand, wave MID then wave TARGET, member after
  member: SIGTERM its etcd, wait for the exit, start the next release with
  the same flags, wait until a write through that member commits (the
  same check). Between the waves the cluster version must reach MID's
  minor (etcd's own rule: a release two minors ahead of the cluster
  version is not supported), as any careful operator waits for it.

The roll's wall time runs from the first SIGTERM until every member's
`/version` (client URL) reports server TARGET and cluster version TARGET's
minor. Meanwhile a writer puts one key every --write-ms through one
member's client URL (the v3 HTTP gateway), moving to the next member after
a failure, as a client with three endpoints does; and each member's client
URL is probed with a put every --probe-ms, sent whether or not the probes
before it have answered. A member is unavailable while its probes fail
(each failed probe counts until the next probe starts).

Called by run.sh with every path resolved; see run.sh for the knobs.
"""

import argparse
import base64
import datetime as dt
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

NAMES = ("etcd-a", "etcd-b", "etcd-c")
PATH_ENV = "/usr/local/bin:/usr/bin:/bin"


def log(msg):
    print(f"bench: roll: {msg}", file=sys.stderr, flush=True)


class RollFailure(Exception):
    """Something did not converge (or a process died): the round's member
    logs are printed with it."""


def b64(text):
    return base64.b64encode(text.encode()).decode()


def minor(version):
    """'3.4.23' -> '3.4'."""
    return ".".join(version.split(".")[:2])


def port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class Http:
    """One keep-alive connection to a member's client URL; every request
    bounded by `timeout`. The v3 gateway is /v3beta on 3.3 and /v3 or
    /v3beta later; a 404 switches once and retries."""

    def __init__(self, port, timeout):
        self.port = port
        self.timeout = timeout
        self.conn = None
        self.gateway = "/v3beta"

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def request(self, method, path, body=None, form=None, ok_status=(200,)):
        """(ok, HTTP status or None, payload bytes or error text). `body` is
        sent as JSON, `form` (the v2 API's) form-encoded; a status outside
        `ok_status` fails."""
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
            ctype = "application/x-www-form-urlencoded"
        else:
            data = None if body is None else json.dumps(body).encode()
            ctype = "application/json"
        switched = retried = False
        while True:
            fresh = self.conn is None
            if fresh:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            full = (self.gateway + path) if path.startswith("/kv/") else path
            try:
                self.conn.request(method, full, body=data,
                                  headers={"Content-Type": ctype} if data else {})
                r = self.conn.getresponse()
                payload = r.read()
            except socket.timeout as e:
                self.close()
                return False, None, f"timeout: {e}"
            except (OSError, http.client.HTTPException) as e:
                self.close()
                # A keep-alive connection the server closed meanwhile (its
                # etcd restarted): once more on a new one, at once.
                if not fresh and not retried:
                    retried = True
                    continue
                return False, None, f"{type(e).__name__}: {e}"
            if r.status == 404 and path.startswith("/kv/") and not switched:
                switched = True
                self.gateway = "/v3" if self.gateway == "/v3beta" else "/v3beta"
                continue
            if r.status not in ok_status:
                return False, r.status, payload[:300]
            return True, r.status, payload

    def put(self, key, value):
        ok, status, payload = self.request("POST", "/kv/put", {"key": b64(key), "value": b64(value)})
        if ok and b'"header"' not in payload:
            return False, status, payload[:300]
        return ok, status, payload

    def put_v2(self, key, value, ttl=None):
        """A put through the v2 API (`key` starts with '/'), with a TTL in
        seconds if given (bench/pause.py's etcd2 data)."""
        form = {"value": value}
        if ttl:
            form["ttl"] = str(ttl)
        ok, status, payload = self.request("PUT", "/v2/keys" + urllib.parse.quote(key), form=form,
                                           ok_status=(200, 201))
        if ok and b'"node"' not in payload:
            return False, status, payload[:300]
        return ok, status, payload

    def version(self):
        """(server, cluster) from /version, or None."""
        ok, _, payload = self.request("GET", "/version")
        if not ok:
            return None
        try:
            v = json.loads(payload)
            return v.get("etcdserver"), v.get("etcdcluster")
        except ValueError:
            return None


class Member:
    def __init__(self, i, name, root, base_port, initial_cluster):
        self.i = i
        self.name = name
        self.client_port = base_port + 10 * i + 1
        self.peer_port = base_port + 10 * i + 2
        # etcd-migrate's own --port/--peer-port (intermediate etcds: none
        # run in cluster mode, but no two members share a default).
        self.step_port = base_port + 10 * i + 3
        self.step_peer_port = base_port + 10 * i + 4
        self.client_url = f"http://127.0.0.1:{self.client_port}"
        self.peer_url = f"http://127.0.0.1:{self.peer_port}"
        self.data = os.path.join(root, name)
        self.logpath = os.path.join(root, "logs", f"{name}.log")
        self.args = [
            f"--name={name}",
            f"--data-dir={self.data}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={initial_cluster}",
            "--initial-cluster-state=new",
            "--initial-cluster-token=etcd-bench-roll",
        ]
        self.proc = None
        self.starts = []  # (monotonic time, what was started)

    def ports(self):
        return (self.client_port, self.peer_port, self.step_port, self.step_peer_port)

    def log_tail(self, n=80):
        try:
            with open(self.logpath, errors="replace") as f:
                lines = f.readlines()
        except OSError as e:
            return f"(no log: {e})"
        return "".join(lines[-n:])


class Sampler(threading.Thread):
    """Calls `fn` every `period` s until stopped; records (start, end, ok,
    extra) on the monotonic clock."""

    def __init__(self, name, period, fn):
        super().__init__(name=name, daemon=True)
        self.period = period
        self.fn = fn
        self.samples = []
        self.stop_ev = threading.Event()

    def run(self):
        nxt = time.monotonic()
        while not self.stop_ev.is_set():
            s = time.monotonic()
            ok, extra = self.fn()
            e = time.monotonic()
            self.samples.append((s, e, ok, extra))
            nxt = max(nxt + self.period, e)
            self.stop_ev.wait(max(0.0, nxt - time.monotonic()))

    def stop(self):
        self.stop_ev.set()
        self.join(timeout=10)


class Prober(threading.Thread):
    """Starts a put through one member's client URL every `period` s,
    whether or not the ones before have answered (up to `workers` in
    flight, each on its own keep-alive connection): a request that hangs
    until its deadline (a proposal dropped at a leader change) does not
    hide the answers of those sent after it. Records (start, end, ok).
    `put(http, key, value)` is the put sent (default: the v3 gateway's)."""

    def __init__(self, name, port, period, timeout, workers=64, put=None):
        super().__init__(name=f"probe-{name}", daemon=True)
        self.key = f"/bench/probe/{name}"
        self.port = port
        self.period = period
        self.timeout = timeout
        self.samples = []
        self.stop_ev = threading.Event()
        self.local = threading.local()
        self.conns = []
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"probe-{name}")
        self.put = put or Http.put

    def one(self):
        h = getattr(self.local, "h", None)
        if h is None:
            h = self.local.h = Http(self.port, self.timeout)
            self.conns.append(h)
        s = time.monotonic()
        ok, _, _ = self.put(h, self.key, "x")
        self.samples.append((s, time.monotonic(), ok, None))

    def run(self):
        nxt = time.monotonic()
        while not self.stop_ev.is_set():
            self.pool.submit(self.one)
            nxt += self.period
            self.stop_ev.wait(max(0.0, nxt - time.monotonic()))

    def stop(self):
        self.stop_ev.set()
        self.join(timeout=10)
        self.pool.shutdown(wait=True)
        for h in self.conns:
            h.close()
        self.samples.sort()


class Round:
    """One round of one variant ('ours' or 'floor') on fresh data."""

    def __init__(self, a, variant, index):
        self.a = a
        self.variant = variant
        self.index = index
        self.root = os.path.join(a.root, f"round{index + 1}-{variant}")
        os.makedirs(os.path.join(self.root, "logs"))
        initial = ",".join(f"{n}=http://127.0.0.1:{a.base_port + 10 * i + 2}" for i, n in enumerate(NAMES))
        self.members = [Member(i, n, self.root, a.base_port, initial) for i, n in enumerate(NAMES)]
        self.ctl = {m.name: Http(m.client_port, a.request_timeout_s) for m in self.members}

    # ---------- processes ----------
    def etcd(self, version):
        return os.path.join(self.a.bin_dir, f"etcd-{version}")

    def spawn(self, m, version_or_target):
        """Starts member m: under etcd-migrate with TARGET_VERSION (ours), or
        plain etcd-<version> (floor), with the member's own etcd flags."""
        if self.variant == "ours":
            cmd = [self.a.migrate,
                   "--bin-dir", self.a.bin_dir,
                   "--bundled-versions", ",".join((self.a.from_, self.a.mid, self.a.target)),
                   "--port", str(m.step_port), "--peer-port", str(m.step_peer_port),
                   "--", *m.args]
            env = {"PATH": PATH_ENV, "TARGET_VERSION": version_or_target}
            what = f"etcd-migrate TARGET_VERSION={version_or_target}"
        else:
            cmd = [self.etcd(version_or_target), *m.args]
            env = {"PATH": PATH_ENV}
            what = f"etcd-{version_or_target}"
        with open(m.logpath, "a") as f:
            f.write(f"=== bench: {dt.datetime.now().isoformat(timespec='milliseconds')} start {what}: "
                    f"{' '.join(cmd)}\n")
            f.flush()
            m.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=env,
                                      start_new_session=True)
        m.starts.append((time.monotonic(), what))

    def stop_member(self, m, deadline_s=30):
        """SIGTERM, wait for the exit; its exit status."""
        if m.proc is None:
            return None
        m.proc.send_signal(signal.SIGTERM)
        try:
            rc = m.proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            raise RollFailure(f"{m.name} (pid {m.proc.pid}) did not exit within {deadline_s} s of SIGTERM")
        with open(m.logpath, "a") as f:
            f.write(f"=== bench: {dt.datetime.now().isoformat(timespec='milliseconds')} exited {rc}\n")
        return rc

    def check_alive(self):
        for m in self.members:
            if m.proc is not None and m.proc.poll() is not None:
                raise RollFailure(f"{m.name} (pid {m.proc.pid}) exited {m.proc.returncode} unasked")

    def cleanup(self):
        """Every process this round started: SIGTERM, then SIGKILL of its
        group; then anything still naming the round's dir (an etcd that a
        killed entrypoint supervised leads its own group), by pid."""
        for m in self.members:
            p = m.proc
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for m in self.members:
            p = m.proc
            if p is None:
                continue
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for pid in procs_naming(self.root):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for h in self.ctl.values():
            h.close()

    # ---------- waits ----------
    def wait_until(self, what, cond, deadline_s=None, poll=0.02):
        deadline = time.monotonic() + (deadline_s or self.a.deadline_s)
        while True:
            if cond():
                return time.monotonic()
            self.check_alive()
            if time.monotonic() > deadline:
                raise RollFailure(f"{what}: not within {deadline_s or self.a.deadline_s} s")
            time.sleep(poll)

    def write_commits(self, m):
        """The health check, ours and the floor alike: a put through the
        member's client URL commits."""
        ok, _, _ = self.ctl[m.name].put(f"/bench/health/{m.name}", "x")
        return ok

    def versions(self):
        return [self.ctl[m.name].version() for m in self.members]

    def all_report(self, server, cluster_minor):
        vs = self.versions()
        return all(v is not None and (server is None or v[0] == server)
                   and v[1] is not None and minor(v[1]) == cluster_minor for v in vs)

    def wait_ports_free(self):
        ports = [p for m in self.members for p in m.ports()]
        self.wait_until(f"ports {ports} free", lambda: all(port_free(p) for p in ports), 30, 0.2)

    # ---------- the round ----------
    def create(self):
        """Three members at FROM, data written through member a."""
        self.wait_ports_free()
        for m in self.members:
            self.spawn(m, self.a.from_)
        self.wait_until(f"the {self.a.from_} cluster forms",
                        lambda: self.all_report(self.a.from_, minor(self.a.from_)))
        for m in self.members:
            self.wait_until(f"a write through {m.name}", lambda: self.write_commits(m), poll=0.05)
        r = subprocess.run([self.a.floor, "seed", "--endpoint", self.members[0].client_url,
                            "--keys", str(self.a.keys), "--leased", str(self.a.leased), "--leases", "10",
                            "--value-bytes", str(self.a.value_bytes)],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RollFailure(f"seeding failed: {r.stderr.strip()}")
        if self.variant == "ours":
            for m in self.members:
                got = read_text(os.path.join(m.data, "version.txt"))
                if got != f"{self.a.from_}/etcd3":
                    raise RollFailure(f"{m.name}: version.txt is {got!r} after the creation")

    def start_load(self):
        a = self.a
        writer_http = [Http(m.client_port, a.request_timeout_s) for m in self.members]
        state = {"seq": 0, "at": 0}
        tag = f"{self.index + 1}-{self.variant}"

        def put_one():
            seq = state["seq"]
            state["seq"] += 1
            at = state["at"]
            ok, status, err = writer_http[at].put(f"/bench/w/{tag}/{seq:08d}", str(seq))
            if not ok:
                state["at"] = (at + 1) % len(writer_http)
            return ok, (seq, at, None if ok else f"{status} {err!r}"[:200])

        self.writer = Sampler("writer", a.write_ms / 1000, put_one)
        self.probes = {m.name: Prober(m.name, m.client_port, a.probe_ms / 1000, a.request_timeout_s)
                       for m in self.members}
        vh = {m.name: Http(m.client_port, a.request_timeout_s) for m in self.members}

        def versions():
            return True, {n: h.version() for n, h in vh.items()}

        self.monitor = Sampler("versions", 0.1, versions)
        self.writer_http = writer_http
        self.load = [self.writer, self.monitor, *self.probes.values()]
        for t in self.load:
            t.start()

    def stop_load(self):
        for t in self.load:
            t.stop()
        for h in self.writer_http:
            h.close()

    def roll(self):
        """The timed part; returns marks on the monotonic clock."""
        a = self.a
        marks = {}
        if self.variant == "ours":
            marks["t0"] = time.monotonic()
            self.t0_wall = time.time()
            for m in self.members:
                rc = self.stop_member(m)
                self.spawn(m, a.target)
                self.wait_until(f"{m.name} serves again after its retarget",
                                lambda: self.write_commits(m), poll=a.poll_ms / 1000)
                log(f"round {self.index + 1} ours: {m.name} retargeted (its etcd exited {rc}), "
                    f"a write through it commits at {time.monotonic() - marks['t0']:.1f} s")
            marks["rollout_done"] = time.monotonic()
        else:
            marks["t0"] = time.monotonic()
            self.t0_wall = time.time()
            for wave in (a.mid, a.target):
                for m in self.members:
                    rc = self.stop_member(m)
                    self.spawn(m, wave)
                    self.wait_until(f"{m.name} serves {wave}",
                                    lambda: self.write_commits(m), poll=a.poll_ms / 1000)
                    log(f"round {self.index + 1} floor: {m.name} on {wave} (its etcd exited {rc}), "
                        f"a write through it commits at {time.monotonic() - marks['t0']:.1f} s")
                marks[f"wave {wave} done"] = time.monotonic()
                if wave == a.mid:
                    self.wait_until(f"cluster version {minor(a.mid)}",
                                    lambda: self.all_report(None, minor(a.mid)), poll=0.05)
                    marks[f"cluster {minor(a.mid)}"] = time.monotonic()
        self.wait_until(f"every member serves {a.target} at cluster version {minor(a.target)}",
                        lambda: self.all_report(a.target, minor(a.target)), poll=0.05)
        marks["end"] = time.monotonic()
        return marks

    def verify(self, marks):
        """After the roll: ours records the target in every version.txt and
        leaves no restart mark; both keep the seeded keys and every
        acknowledged write."""
        a = self.a
        if self.variant == "ours":
            want = f"{a.target}/etcd3"

            def recorded():
                return all(read_text(os.path.join(m.data, "version.txt")) == want
                           and not os.path.exists(os.path.join(m.data, ".etcd-migrate.restart"))
                           for m in self.members)

            marks["recorded"] = self.wait_until(f"every version.txt records {want}", recorded, poll=0.05)
        r = subprocess.run([a.floor, "count", "--endpoint", self.members[1].client_url],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RollFailure(f"count after the roll failed: {r.stderr.strip()}")
        counted = json.loads(r.stdout)
        if counted["keys"] != a.keys:
            raise RollFailure(f"{counted['keys']} keys under /registry after the roll, {a.keys} seeded")
        tag = f"{self.index + 1}-{self.variant}"
        prefix = f"/bench/w/{tag}/"
        ok, _, payload = self.ctl[self.members[2].name].request(
            "POST", "/kv/range", {"key": b64(prefix), "range_end": b64(prefix[:-1] + "0"), "keys_only": True})
        if not ok:
            raise RollFailure(f"reading the writer's keys failed: {payload!r}")
        present = {base64.b64decode(kv["key"]).decode() for kv in json.loads(payload).get("kvs", [])}
        acked = [extra[0] for (_, _, ok_, extra) in self.writer.samples if ok_]
        lost = [s for s in acked if f"{prefix}{s:08d}" not in present]
        if lost:
            raise RollFailure(f"{len(lost)} acknowledged writes missing after the roll, e.g. {lost[:5]}")
        return dict(keys=counted["keys"], leases=counted.get("leases"), writes_present=len(present))

    def run(self):
        a = self.a
        try:
            self.create()
            self.start_load()
            time.sleep(a.warmup_s)
            marks = self.roll()
            time.sleep(0.3)
            self.stop_load()
            checked = self.verify(marks)
            stats = self.figures(marks)
            stats["checked"] = checked
            counts = {}
            if self.variant == "ours":
                text = "".join(read_text(m.logpath) for m in self.members)
                for msg in ("upgrade lock taken", "member proven", "leadership moved", "waiting for"):
                    counts[msg] = text.count(msg)
                # etcd-migrate's own error lines (none expected in a roll).
                errors = [ln for ln in text.splitlines() if ln.startswith("[etcd-migrate] ")
                          and ln.split(" ", 3)[2:3] == ["error"]]
                counts["error lines"] = len(errors)
                stats["errors"] = errors
            stats["log_counts"] = counts
            return stats
        except RollFailure as e:
            self.fail(str(e))
        finally:
            self.cleanup()

    def fail(self, msg):
        log(f"ERROR: round {self.index + 1} ({self.variant}): {msg}")
        for m in self.members:
            state = "not started" if m.proc is None else (
                f"pid {m.proc.pid} " + ("running" if m.proc.poll() is None else f"exited {m.proc.returncode}"))
            print(f"\n----- {m.name} ({state}), last lines of {m.logpath} -----\n{m.log_tail()}",
                  file=sys.stderr, flush=True)
        w = getattr(self, "writer", None)
        if w is not None:
            errs = [x[3][2] for x in w.samples[-2000:] if not x[2]]
            print(f"\n----- writer: {len(errs)} failures in its last {min(2000, len(w.samples))} puts; "
                  f"last: {errs[-3:]}", file=sys.stderr, flush=True)
        self.cleanup()
        sys.exit(1)

    # ---------- figures ----------
    def figures(self, marks):
        t0, end = marks["t0"], marks["end"]
        out = dict(variant=self.variant, round=self.index + 1, wall_s=end - t0,
                   t0_utc=dt.datetime.fromtimestamp(self.t0_wall, dt.timezone.utc).isoformat(timespec="milliseconds"),
                   marks={k: v - t0 for k, v in marks.items()})
        # Per member: a failed probe counts from its start to the next
        # probe's start, clipped to the roll.
        unavail = {}
        outages = {}
        spans = {}
        for name, p in self.probes.items():
            s = p.samples
            total = 0.0
            runs = []  # [start, end] of each run of failed probes, from t0
            prev_failed = False
            for k in range(len(s) - 1):
                a_, b_ = max(s[k][0], t0), min(s[k + 1][0], end)
                failed = not s[k][2] and b_ > a_
                if failed:
                    total += b_ - a_
                    if prev_failed:
                        runs[-1][1] = b_ - t0
                    else:
                        runs.append([a_ - t0, b_ - t0])
                prev_failed = failed
            unavail[name] = total
            outages[name] = len(runs)
            spans[name] = [[round(x, 3), round(y, 3)] for x, y in runs]
        out["unavailable_s"] = unavail
        out["outages"] = outages
        out["outage_spans"] = spans
        w = self.writer.samples
        in_roll = [x for x in w if t0 <= x[0] <= end]
        out["writes_ok"] = sum(1 for x in in_roll if x[2])
        out["writes_failed"] = sum(1 for x in in_roll if not x[2])
        done = sorted(x[1] for x in w if x[2])
        gap, gap_at = 0.0, None
        for x, y in zip(done, done[1:]):
            if y > t0 and x < end and y - x > gap:
                gap, gap_at = y - x, x - t0
        out["longest_gap_s"] = gap
        out["longest_gap_from_s"] = gap_at
        errs = {}
        for x in in_roll:
            if not x[2]:
                k = (x[3][2] or "")[:60]
                errs[k] = errs.get(k, 0) + 1
        out["write_errors"] = dict(sorted(errs.items(), key=lambda kv: -kv[1])[:5])
        # When each member first reports each release, and the cluster
        # version each minor (the monitor's 100 ms rounds).
        firsts = {}
        for (s, _, _, vs) in self.monitor.samples:
            for name, v in vs.items():
                if v is None:
                    continue
                firsts.setdefault(f"{name} {v[0]}", s - t0)
                if v[1]:
                    firsts.setdefault(f"cluster {minor(v[1])}", s - t0)
        out["first_seen"] = firsts
        return out


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def procs_naming(path):
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if path in cmd:
            pids.append(int(d))
    return pids


# ---------- output ----------
def med(xs):
    return statistics.median(xs)


def mr(xs, digits=1):
    return f"{med(xs):.{digits}f} [{min(xs):.{digits}f}–{max(xs):.{digits}f}]"


def git_commit(repo):
    r = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    commit = r.stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock"],
                           capture_output=True, text=True).stdout.strip()
    return commit + (" with uncommitted changes to src/" if dirty else "")


def table(a, results, load_before, load_after, started):
    ours = [r for r in results if r["variant"] == "ours"]
    floor = [r for r in results if r["variant"] == "floor"]
    n = len(ours)
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    out = []
    p = out.append
    p(f"# The roll {a.from_} → {a.target}, 3 members on loopback: etcd-migrate vs the floor")
    p("")
    p(f"Measured by `BENCH_ROLL=1 BENCH_ROLL_RUNS={n} bench/run.sh` ({started}): "
      f"{os.cpu_count()} cores, {mem_gib:.0f} GiB RAM, every member on 127.0.0.1 (ports "
      f"{a.base_port + 1}–{a.base_port + 24}), plain http, etcd's default timings (heartbeat 100 ms, "
      f"election 1 s); etcd-migrate {a.commit_label}, release build; {n} rounds, each on fresh data "
      f"({a.keys} keys of {a.value_bytes} B, {a.leased} on 10 leases, written at {a.from_}), ours and "
      f"the floor alternating which goes first; load average (1 min) {load_before:.1f} before, "
      f"{load_after:.1f} after. Seconds, median [min–max] over the rounds.")
    p("")
    p(f"- **ours**: each member's etcd-migrate restarted with `TARGET_VERSION={a.target}`, one after "
      f"the other, each once a write through the one before commits (an operator's rollout); the "
      f"entrypoints roll {a.from_} → {a.mid} → {a.target} themselves.")
    p(f"- **floor**: the same rolling restarts by hand with plain etcd: wave {a.mid} then wave "
      f"{a.target}, member after member SIGTERM, wait for the exit, start the next release with the "
      f"same flags, wait until a write through it commits; between the waves, wait for cluster "
      f"version {minor(a.mid)}.")
    p(f"- **roll**: first SIGTERM → every member's `/version` says server {a.target} and cluster "
      f"{minor(a.target)}. **Unavailable**: a put through the member's client URL every "
      f"{a.probe_ms} ms, sent whether or not the ones before have answered, each with a "
      f"{a.request_timeout_s:g} s deadline; a failed one counts until the next starts. **Writes**: one put "
      f"every {a.write_ms} ms through one member, moving to the next after a failure; the longest "
      f"gap is between two successful puts' completions.")
    p("")
    p("| measure | ours (etcd-migrate) | floor (by hand) | ours / floor (medians) |")
    p("|---|---|---|---|")

    def row(label, fo, ff, digits=1, ratio=True):
        xo = [fo(r) for r in ours]
        xf = [fo(r) if ff is None else ff(r) for r in floor]
        rat = (f"{med(xo) / med(xf):.2f}" if med(xf) > 0 else "–") if ratio else ""
        p(f"| {label} | {mr(xo, digits)} | {mr(xf, digits)} | {rat} |")

    cm, ct = minor(a.mid), minor(a.target)
    last_on = lambda r: max(r["first_seen"][f"{n_} {a.target}"] for n_ in NAMES)
    row("**roll wall time**", lambda r: r["wall_s"], None)
    row(f"– every member restarted into {a.mid} and taking writes (ours: the rollout)",
        lambda r: r["marks"]["rollout_done"], lambda r: r["marks"][f"wave {a.mid} done"])
    row(f"– then until cluster version {cm} (etcd's own update)",
        lambda r: r["first_seen"][f"cluster {cm}"] - r["marks"]["rollout_done"],
        lambda r: r["first_seen"][f"cluster {cm}"] - r["marks"][f"wave {a.mid} done"], 2)
    row(f"– then until every member serves {a.target} (the second wave)",
        lambda r: last_on(r) - r["first_seen"][f"cluster {cm}"], None, 2)
    row(f"– then until cluster version {ct} (etcd's own update)", lambda r: r["wall_s"] - last_on(r), None, 2)
    for name in NAMES:
        row(f"{name} unavailable", lambda r, n_=name: r["unavailable_s"][n_], None, 2)
    p(f"| outages per member (a, b, c), median | "
      f"{', '.join('%g' % med([r['outages'][n_] for r in ours]) for n_ in NAMES)} | "
      f"{', '.join('%g' % med([r['outages'][n_] for r in floor]) for n_ in NAMES)} | |")
    row("longest gap between two successful writes", lambda r: r["longest_gap_s"], None, 2)
    row("failed writes", lambda r: r["writes_failed"], None, 0, False)
    row("successful writes", lambda r: r["writes_ok"], None, 0, False)
    p("")
    p("Per round (seconds; unavailable a / b / c):")
    p("")
    p("| round | who | roll | unavailable a / b / c | outages | longest write gap | writes failed / ok |")
    p("|---|---|---|---|---|---|---|")
    for r in results:
        una = " / ".join("%.2f" % r["unavailable_s"][n_] for n_ in NAMES)
        outs = " / ".join(str(r["outages"][n_]) for n_ in NAMES)
        p(f"| {r['round']} | {r['variant']} | {r['wall_s']:.1f} | {una} | {outs} | "
          f"{r['longest_gap_s']:.2f} | {r['writes_failed']} / {r['writes_ok']} |")
    p("")
    errs = [(r["round"], e) for r in ours for e in r.get("errors", [])]
    p(f"etcd-migrate's own `error` lines during the rolls: {len(errs)}"
      + ("." if not errs else ":"))
    for rnd, e in errs:
        p(f"- round {rnd}: `{e[:300]}`")
    if errs:
        p("")
    recorded = [r["marks"]["recorded"] - r["marks"]["end"] for r in ours if "recorded" in r["marks"]]
    if recorded:
        p(f"Ours: every `version.txt` recorded {a.target} at most {max(recorded):.1f} s after the roll's end "
          f"(the last member records once proven, then lets the lock go). After every round, ours and "
          f"the floor: the {a.keys} seeded keys counted and every acknowledged write present.")
    return "\n".join(out)


def svg(a, results, path):
    """Two panels of paired bars (median, min–max whisker): the roll's
    wall time; each member's unavailable time and the longest write gap."""
    ours = [r for r in results if r["variant"] == "ours"]
    floor = [r for r in results if r["variant"] == "floor"]
    panels = [
        ("roll wall time (s)", [("roll", lambda r: r["wall_s"])]),
        ("unavailable time and longest write gap (s)",
         [(n, lambda r, n_=n: r["unavailable_s"][n_]) for n in NAMES]
         + [("write gap", lambda r: r["longest_gap_s"])]),
    ]
    colors = {"ours": "#1f77b4", "floor": "#ff7f0e"}
    W, H = 820, 375
    top, bottom = 68, 315
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">roll {a.from_} → {a.target}, '
             f'3 members on loopback, {len(ours)} rounds: etcd-migrate vs the floor (median, min–max)</text>']
    x0s = [(60, 230), (330, 800)]
    for (pi, (title, groups)), (xa, xb) in zip(enumerate(panels), x0s):
        vals = [f(r) for _, f in groups for r in ours + floor]
        meds = [med([f(r) for r in rs]) for _, f in groups for rs in (ours, floor)]
        # An outlier round must not flatten the bars: the axis stops at
        # 2.5x the largest median; a whisker past it is cut, its max written.
        vmax = min(max(vals + [0.001]), 2.5 * max(meds + [0.001])) * 1.15
        digits = 1 if pi == 0 else 2
        step = nice_step(vmax / 5)
        y = lambda v: bottom - (bottom - top) * v / vmax
        parts.append(f'<text x="{(xa + xb) / 2}" y="{top - 26}" text-anchor="middle">{title}</text>')
        t = 0.0
        while t <= vmax:
            parts.append(f'<line x1="{xa}" x2="{xb}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#ddd"/>')
            parts.append(f'<text x="{xa - 5}" y="{y(t) + 4:.1f}" text-anchor="end">{fmt_tick(t)}</text>')
            t += step
        parts.append(f'<line x1="{xa}" x2="{xa}" y1="{top}" y2="{bottom}" stroke="#333"/>')
        parts.append(f'<line x1="{xa}" x2="{xb}" y1="{bottom}" y2="{bottom}" stroke="#333"/>')
        gw = (xb - xa) / len(groups)
        bw = min(40, gw / 3)
        for g, (label, f) in enumerate(groups):
            cx = xa + gw * (g + 0.5)
            for k, (who, rs) in enumerate((("ours", ours), ("floor", floor))):
                xs = [f(r) for r in rs]
                bx = cx - bw - 2 + k * (bw + 4)
                m = med(xs)
                parts.append(f'<rect x="{bx:.1f}" y="{y(m):.1f}" width="{bw:.1f}" '
                             f'height="{bottom - y(m):.1f}" fill="{colors[who]}"/>')
                wx = bx + bw / 2
                hi = min(max(xs), vmax)
                parts.append(f'<line x1="{wx:.1f}" x2="{wx:.1f}" y1="{y(min(xs)):.1f}" '
                             f'y2="{y(hi):.1f}" stroke="#000"/>')
                for v in (min(xs), hi):
                    parts.append(f'<line x1="{wx - 4:.1f}" x2="{wx + 4:.1f}" y1="{y(v):.1f}" '
                                 f'y2="{y(v):.1f}" stroke="#000"/>')
                text = f"{m:.{digits}f}"
                if max(xs) > vmax:
                    text += f" (max {max(xs):.{digits}f} ↑)"
                parts.append(f'<text x="{wx:.1f}" y="{y(hi) - 4:.1f}" text-anchor="middle" '
                             f'font-size="10">{text}</text>')
            parts.append(f'<text x="{cx:.1f}" y="{bottom + 16}" text-anchor="middle">{label}</text>')
    lx = 330
    for k, (who, text) in enumerate((("ours", "etcd-migrate (the entrypoints roll)"),
                                     ("floor", "floor (rolling restarts by hand)"))):
        parts.append(f'<rect x="{lx + k * 240}" y="{H - 28}" width="12" height="12" fill="{colors[who]}"/>')
        parts.append(f'<text x="{lx + k * 240 + 18}" y="{H - 18}">{text}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def nice_step(raw):
    mag = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 10 ** -len(str(int(1 / raw)))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def fmt_tick(t):
    return f"{t:.0f}" if t == int(t) else f"{t:g}"


def main():
    ap = argparse.ArgumentParser()
    paths = ("root", "bin-dir", "migrate", "floor", "out", "repo")
    for k in paths:
        ap.add_argument(f"--{k}", default="")
    for k, v in (("runs", 3), ("base-port", 24100), ("keys", 1000), ("leased", 100),
                 ("value-bytes", 512), ("write-ms", 10), ("probe-ms", 20), ("poll-ms", 10),
                 ("deadline-s", 300)):
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--request-timeout-s", type=float, default=1.0)
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--from", dest="from_", default="3.3.25")
    ap.add_argument("--mid", default="3.4.23")
    ap.add_argument("--target", default="3.5.16")
    ap.add_argument("--commit-label", default="")
    ap.add_argument("--replot", default="", help="only redraw the SVG beside this results JSON")
    a = ap.parse_args()
    if a.replot:
        with open(a.replot) as f:
            rounds = json.load(f)["rounds"]
        svg(a, rounds, a.replot[:-len(".json")] + ".svg")
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
    if not 1024 <= a.base_port or not (a.base_port + 30 < eph_lo or a.base_port > eph_hi):
        sys.exit(f"bench: roll: ports {a.base_port}-{a.base_port + 30} are not clear of the "
                 f"ephemeral range {eph_lo}-{eph_hi}; set BENCH_ROLL_PORT")
    for v in (a.from_, a.mid, a.target):
        if not os.access(os.path.join(a.bin_dir, f"etcd-{v}"), os.X_OK):
            sys.exit(f"bench: roll: etcd-{v} missing in {a.bin_dir}")
    started = dt.datetime.now().strftime("%Y-%m-%d")
    load_before = os.getloadavg()[0]
    results = []

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    current = None
    try:
        for i in range(a.runs):
            order = ("ours", "floor") if i % 2 == 0 else ("floor", "ours")
            for variant in order:
                log(f"round {i + 1}/{a.runs}: {variant}")
                current = Round(a, variant, i)
                r = current.run()
                current = None
                results.append(r)
                log(f"round {i + 1} {variant}: roll {r['wall_s']:.1f} s; unavailable "
                    + ", ".join(f"{n} {r['unavailable_s'][n]:.2f} s ({r['outages'][n]}×)" for n in NAMES)
                    + f"; longest write gap {r['longest_gap_s']:.2f} s; writes failed {r['writes_failed']}"
                    f" of {r['writes_failed'] + r['writes_ok']} (longest gap from {r['longest_gap_from_s']:.2f} s)"
                    f"; log counts {r['log_counts']}; "
                    f"first SIGTERM at {r['t0_utc']}; outages (s from "
                    f"the first SIGTERM) {r['outage_spans']}; first seen {r['first_seen']}")
                for n in NAMES:  # the data dirs; the logs stay (BENCH_KEEP=1)
                    shutil.rmtree(os.path.join(a.root, f"round{i + 1}-{variant}", n), ignore_errors=True)
    except KeyboardInterrupt:
        if current is not None:
            current.cleanup()
        raise
    load_after = os.getloadavg()[0]
    text = table(a, results, load_before, load_after, started)
    print(text, flush=True)
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, f"roll-{a.from_}-{a.target}")
    with open(base + ".md", "w") as f:
        f.write(text + "\n")
    with open(base + ".json", "w") as f:
        json.dump(dict(cpus=os.cpu_count(), load_before=load_before, load_after=load_after, date=started,
                       build=a.commit_label, rounds=results), f, indent=1)
    svg(a, results, base + ".svg")
    log(f"wrote {base}.md, {base}.json and {base}.svg")


if __name__ == "__main__":
    main()
