#!/usr/bin/env bash
# Benchmark (not a test): etcd-migrate's step time vs the floor, and the
# no-op hand-over time. Prints a table on stdout; progress on stderr.
#
# Usage: bench/run.sh
#
# Environment (all optional):
#   BENCH_RUNS=7          rounds of step measurements (ours + 4 floor variants each)
#   BENCH_NOOP_RUNS=50    runs of each no-op measurement
#   BENCH_BIN_DIR         etcd binaries (default: <repo>/.cache/etcd/bin)
#   BENCH_CLIENT_PORT=23791, BENCH_PEER_PORT=23801   loopback ports used throughout
#   BENCH_POLL_MS=10      the floor's pause between put attempts
#   BENCH_KEYS=1000 BENCH_LEASED=100 BENCH_VALUE_BYTES=512   the 3.3.25 data set
#   BENCH_TMP             where the scratch dir goes (default: $TMPDIR or /tmp;
#                         must be a real disk for fsync figures to mean anything)
#   BENCH_ELECTION_RUNS=0 if > 0, also time the floor with other raft timings
#                         (10/100 and 5/25 ms besides dialect.rs's 10/50)
#   BENCH_KEEP=1          keep the scratch dir (logs of every run, raw.json)
#   BENCH_NO_BUILD=1      skip the cargo builds
#   BENCH_SCALE=10k,100k,200k,1M,150k@10240
#                         the scale bench instead (issue 12): per data size
#                         (keys, @value bytes, default 1024), ours (whole walk
#                         and one hop) vs the floor of the starts the plan
#                         needs, on fresh copies of the same data, and our
#                         peak RSS (ratios of the medians, and paired: the
#                         median of each round's own ratio); writes scale.csv,
#                         scale-summary.json and
#                         scale.svg to BENCH_OUT (default <repo>/bench/results)
#   BENCH_SCALE_RUNS=3    rounds per size up to ~300 MB of values
#   BENCH_BIG_RUNS=1      rounds per larger size
#   BENCH_FLOOR_TIMEOUT_S=60   the floor's wait for its write (raise it for GBs)
#   BENCH_ROLL=1          the roll bench instead (issue 21): 3 members on
#                         loopback rolled 3.3.25 -> 3.5.16 by their
#                         etcd-migrate entrypoints (each restarted once with
#                         TARGET_VERSION=3.5.16, as a rollout does) against the
#                         same rolling restarts done by hand with plain etcd,
#                         writes and per-member probes running (bench/roll.py);
#                         writes roll-3.3.25-3.5.16.{md,json,svg} to BENCH_OUT
#                         (default <repo>/bench/results)
#   BENCH_ROLL_RUNS=3     rounds (each: ours and the floor, on fresh data)
#   BENCH_ROLL_PORT=24100 first of the ports used (up to +24; keep them below
#                         the ephemeral range)
#   BENCH_ROLL_DEADLINE_S=300  what a roll (or any wait in it) may take before
#                         the round fails with the members' logs
#   BENCH_ROLL_KEYS=1000  keys seeded before each roll (BENCH_VALUE_BYTES,
#                         BENCH_LEASED as above)
#   BENCH_ROLL_COMMIT     how the table names the build measured (default: the
#                         checkout's commit, flagged when src/ has changes)
#   BENCH_PAUSE=1         the pause bench instead (issue 28, item 9): per case, 3
#                         members on loopback created at FROM under etcd-migrate,
#                         data written, then each member's etcd-migrate restarted
#                         with TARGET_VERSION=<target> TARGET_STORAGE=<the
#                         case's> ALLOW_CLUSTER_PAUSE=1, one after the other (a rollout):
#                         the writer's pause (first failed put -> first accepted
#                         put after it) and the whole job (first restart -> every
#                         member serves and records the target), against the
#                         single-member step on the same data (a cluster of one
#                         written the same way, migrated by etcd-migrate alone:
#                         spawn -> its target accepts a put); every write the
#                         writer got acknowledged is read back; writes
#                         pause-<case>.{md,json} to BENCH_OUT (default
#                         <repo>/bench/results) (bench/pause.py)
#   BENCH_PAUSE_CASES=etcd2,3.4.23-3.3.25   etcd2: 3.3.25 etcd2 -> etcd3 (the
#                         data written through the v2 API); etcd3-etcd2: 3.3.25
#                         etcd3 -> etcd2 (written through v3, read back and
#                         counted through v2: keep BENCH_PAUSE_BIG small, the v2
#                         read has no keys-only); F-T: etcd3 F -> T (written
#                         through v3 by `floor seed`)
#   BENCH_PAUSE_VARIANTS=cluster,step  one alone only logs its figures (to look
#                         into one; no results written)
#   BENCH_PAUSE_RUNS=1    rounds per case (each: the cluster and the step, on
#                         fresh data, alternating which goes first)
#   BENCH_PAUSE_KEYS=10000 small keys (BENCH_PAUSE_SMALL_BYTES=128 each), of which
#                         BENCH_PAUSE_LEASED=1000 with a 1 h TTL (etcd2) or on
#                         10 leases of 1 h (etcd3)
#   BENCH_PAUSE_BIG=200000 big keys of BENCH_PAUSE_BIG_BYTES=1024
#   BENCH_PAUSE_PORT=24200 first of the ports used (up to +34; keep them below
#                         the ephemeral range)
#   BENCH_PAUSE_DEADLINE_S=600  what a job, a seeding (or any wait) may take
#                         before the round fails with the members' logs
#   BENCH_PAUSE_SEED_CONNS=16  connections (8 puts pipelined on each) seeding
#                         etcd2 data through the v2 API
#   BENCH_PAUSE_COMMIT    how the table names the build measured (as
#                         BENCH_ROLL_COMMIT)
#
# Needs: cargo (+ protoc for etcd-client), python3 (stdlib only), and
# etcd-3.3.25, etcd-3.4.23, etcd-3.5.16 in the bin dir.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin_dir=${BENCH_BIN_DIR:-$repo/.cache/etcd/bin}
runs=${BENCH_RUNS:-7}
noop_runs=${BENCH_NOOP_RUNS:-50}
client_port=${BENCH_CLIENT_PORT:-23791}
peer_port=${BENCH_PEER_PORT:-23801}
poll_ms=${BENCH_POLL_MS:-10}
python=${PYTHON:-python3}

#   BENCH_WALK=3.5.16:3.7.1   the walk bench instead (issue 18): data written
#                         by the first release, walked to the second by
#                         etcd-migrate with BENCH_BUNDLE (default
#                         3.5.16,3.5.30,3.6.14,3.7.1; a bin dir holding them
#                         all: BENCH_BIN_DIR), against one start of each
#                         release the plan runs, BENCH_RUNS rounds
walk_releases=3.3.25,3.4.23,3.5.16
if [[ -n ${BENCH_WALK:-} ]]; then
  BENCH_BUNDLE=${BENCH_BUNDLE:-3.5.16,3.5.30,3.6.14,3.7.1}
  walk_releases=$BENCH_BUNDLE
fi
missing=()
for v in ${walk_releases//,/ }; do
  [[ -x $bin_dir/etcd-$v ]] || missing+=("$bin_dir/etcd-$v")
done
if ((${#missing[@]})); then
  echo "bench: missing etcd binaries: ${missing[*]}" >&2
  echo "bench: fetch them with: images/fetch-etcd.sh 3.3.25 3.4.23 3.5.16   (or set BENCH_BIN_DIR)" >&2
  exit 1
fi
command -v "$python" >/dev/null || { echo "bench: python3 not found (set PYTHON)" >&2; exit 1; }

if [[ ${BENCH_NO_BUILD:-0} != 1 ]]; then
  echo "bench: building (cargo build --release; cargo build --release --example floor)" >&2
  # Two invocations: the first builds etcd-migrate exactly as users do
  # (an example build also unifies dev-dependency features).
  (cd "$repo" && cargo build --release --quiet && cargo build --release --quiet --example floor \
    && cargo build --release --quiet --example plot)
fi
target_dir=${CARGO_TARGET_DIR:-$repo/target}
migrate=$target_dir/release/etcd-migrate
floor=$target_dir/release/examples/floor
plot=$target_dir/release/examples/plot
[[ -x $migrate && -x $floor ]] || { echo "bench: $migrate or $floor missing (build failed?)" >&2; exit 1; }

work=$(mktemp -d "${BENCH_TMP:-${TMPDIR:-/tmp}}/etcd-migrate-bench.XXXXXX")

# Every process this bench starts has $work in its command line (data dir);
# stop exactly those, by pid, then remove the scratch dir.
cleanup() {
  local rc=$? pids=() pid cmd d
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [[ $pid == "$$" ]] && continue
    cmd=$(tr '\0' ' ' 2>/dev/null <"$d/cmdline") || continue
    [[ $cmd == *"$work"* ]] && pids+=("$pid")
  done
  if ((${#pids[@]})); then
    echo "bench: stopping leftover processes ${pids[*]}" >&2
    kill -TERM "${pids[@]}" 2>/dev/null || true
    sleep 1
    kill -KILL "${pids[@]}" 2>/dev/null || true
  fi
  if [[ ${BENCH_KEEP:-0} == 1 ]]; then
    echo "bench: kept $work" >&2
  else
    rm -rf "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ ${BENCH_ROLL:-0} == 1 ]]; then
  roll_port=${BENCH_ROLL_PORT:-24100}
  echo "bench: scratch dir $work; ports $((roll_port + 1))-$((roll_port + 24))" >&2
  "$python" "$repo/bench/roll.py" \
    --root "$work" --bin-dir "$bin_dir" --migrate "$migrate" --floor "$floor" --repo "$repo" \
    --out "${BENCH_OUT:-$repo/bench/results}" --runs "${BENCH_ROLL_RUNS:-3}" \
    --base-port "$roll_port" --deadline-s "${BENCH_ROLL_DEADLINE_S:-300}" \
    --keys "${BENCH_ROLL_KEYS:-1000}" --leased "${BENCH_LEASED:-100}" \
    --value-bytes "${BENCH_VALUE_BYTES:-512}" --poll-ms "$poll_ms" \
    ${BENCH_ROLL_COMMIT:+--commit-label "$BENCH_ROLL_COMMIT"}
  exit 0
fi
if [[ ${BENCH_PAUSE:-0} == 1 ]]; then
  pause_port=${BENCH_PAUSE_PORT:-24200}
  echo "bench: scratch dir $work; ports $((pause_port + 1))-$((pause_port + 34))" >&2
  "$python" "$repo/bench/pause.py" \
    --root "$work" --bin-dir "$bin_dir" --migrate "$migrate" --floor "$floor" --repo "$repo" \
    --out "${BENCH_OUT:-$repo/bench/results}" --runs "${BENCH_PAUSE_RUNS:-1}" \
    --cases "${BENCH_PAUSE_CASES:-etcd2,3.4.23-3.3.25}" --variants "${BENCH_PAUSE_VARIANTS:-cluster,step}" \
    --base-port "$pause_port" --deadline-s "${BENCH_PAUSE_DEADLINE_S:-600}" \
    --keys "${BENCH_PAUSE_KEYS:-10000}" --leased "${BENCH_PAUSE_LEASED:-1000}" \
    --small-bytes "${BENCH_PAUSE_SMALL_BYTES:-128}" \
    --big "${BENCH_PAUSE_BIG:-200000}" --big-bytes "${BENCH_PAUSE_BIG_BYTES:-1024}" \
    --seed-conns "${BENCH_PAUSE_SEED_CONNS:-16}" --poll-ms "$poll_ms" \
    ${BENCH_PAUSE_COMMIT:+--commit-label "$BENCH_PAUSE_COMMIT"}
  exit 0
fi
echo "bench: scratch dir $work; ports client $client_port, peer $peer_port" >&2
if [[ -n ${BENCH_WALK:-} ]]; then
  "$python" "$repo/bench/driver.py" \
    --root "$work" --bin-dir "$bin_dir" --migrate "$migrate" --floor "$floor" \
    --name etcd-bench --runs "$runs" --client-port "$client_port" --peer-port "$peer_port" \
    --poll-ms "$poll_ms" --keys "${BENCH_KEYS:-1000}" --leased "${BENCH_LEASED:-100}" \
    --value-bytes "${BENCH_VALUE_BYTES:-512}" --walk "$BENCH_WALK" --bundle "$BENCH_BUNDLE"
  exit 0
fi
if [[ -n ${BENCH_SCALE:-} ]]; then
  out=${BENCH_OUT:-$repo/bench/results}
  "$python" "$repo/bench/driver.py" \
    --root "$work" --bin-dir "$bin_dir" --migrate "$migrate" --floor "$floor" \
    --name etcd-bench --client-port "$client_port" --peer-port "$peer_port" --poll-ms "$poll_ms" \
    --leased "${BENCH_LEASED:-100}" --scale "$BENCH_SCALE" --out "$out" \
    --scale-runs "${BENCH_SCALE_RUNS:-3}" --big-runs "${BENCH_BIG_RUNS:-1}" \
    --floor-timeout-s "${BENCH_FLOOR_TIMEOUT_S:-60}"
  if [[ -x $plot ]]; then
    "$plot" "$out/scale.csv" "$out/scale.svg" "walk 3.3.25 → 3.5.16: etcd-migrate vs the floor"
  fi
  exit 0
fi
"$python" "$repo/bench/driver.py" \
  --root "$work" --bin-dir "$bin_dir" --migrate "$migrate" --floor "$floor" \
  --name etcd-bench --runs "$runs" --noop-runs "$noop_runs" \
  --client-port "$client_port" --peer-port "$peer_port" --poll-ms "$poll_ms" \
  --keys "${BENCH_KEYS:-1000}" --leased "${BENCH_LEASED:-100}" \
  --value-bytes "${BENCH_VALUE_BYTES:-512}" --election-runs "${BENCH_ELECTION_RUNS:-0}"
