//! This module owns the pause job's keys in the cluster,
//! `/etcd-migrate/pause/<job>/…`: the agreements, the `go` (written in a
//! transaction that holds only while every agreement is there and no `go`
//! is), the withdrawal (a transaction that holds only while no `go` is),
//! each leaving member's `stopping` (and, for one at a time, the
//! converter's `leave-now`: stop before your removal), the converted cluster's `served` and each
//! member's `joined`. Through the v3 API: the job needs a cluster version
//! of 3.1 or later (`JOB_FLOOR`).

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};

use crate::cluster::pause::{Go, Seen};
use crate::log::error_chain;

/// The prefix of every job's keys.
pub const PREFIX: &str = "/etcd-migrate/pause/";

/// The directory of job `job`'s keys.
pub fn dir(job: &str) -> String {
    format!("{PREFIX}{job}/")
}

/// Member `id`'s agreement.
pub fn agree_key(job: &str, id: u64) -> String {
    format!("{}agree/{id:x}", dir(job))
}

/// The go.
pub fn go_key(job: &str) -> String {
    format!("{}go", dir(job))
}

/// Member `id` knows the go and leaves the old cluster: the converter
/// may remove it.
pub fn stopping_key(job: &str, id: u64) -> String {
    format!("{}stopping/{id:x}", dir(job))
}

/// The converter asks member `id`, which said it leaves, to stop its
/// etcd before its removal ([`crate::cluster::pause::leaves_first`]).
pub fn leave_now_key(job: &str, id: u64) -> String {
    format!("{}leave-now/{id:x}", dir(job))
}

/// The converted cluster serves.
pub fn served_key(job: &str) -> String {
    format!("{}served", dir(job))
}

/// Member `id` joined the converted cluster.
pub fn joined_key(job: &str, id: u64) -> String {
    format!("{}joined/{id:x}", dir(job))
}

/// What one key under the job's directory says, into `seen`.
fn take_in(seen: &mut Seen, rest: &str, value: &[u8], revision: i64) {
    let id = |s: &str| u64::from_str_radix(s, 16).ok();
    match rest.split_once('/') {
        Some(("agree", m)) => {
            if let Some(m) = id(m) {
                seen.agreed.insert(m);
                seen.agreed_at.insert(m, revision);
            }
        }
        Some(("leave-now", m)) => seen.leave_now.extend(id(m)),
        Some(("stopping", m)) => seen.stopping.extend(id(m)),
        Some(("joined", m)) => seen.joined.extend(id(m)),
        _ if rest == "go" => seen.go = serde_json::from_slice::<Go>(value).ok(),
        _ if rest == "served" => seen.served = true,
        _ => {}
    }
}

/// Every key of job `job`, read linearizably (`serializable`: from the
/// member asked alone, which needs no quorum).
pub async fn read(
    client: &mut etcd_client::Client,
    job: &str,
    serializable: bool,
) -> Result<Seen, String> {
    let dir = dir(job);
    let mut options = GetOptions::new().with_prefix();
    if serializable {
        options = options.with_serializable();
    }
    let response = client
        .get(dir.as_str(), Some(options))
        .await
        .map_err(|e| error_chain(&e))?;
    let mut seen = Seen::default();
    for kv in response.kvs() {
        let key = String::from_utf8_lossy(kv.key());
        if let Some(rest) = key.strip_prefix(dir.as_str()) {
            take_in(&mut seen, rest, kv.value(), kv.mod_revision());
        }
    }
    Ok(seen)
}

/// Puts `value` under `key`.
pub async fn put(client: &mut etcd_client::Client, key: &str, value: &str) -> Result<(), String> {
    client
        .put(key, value, None)
        .await
        .map(|_| ())
        .map_err(|e| error_chain(&e))
}

/// Writes `go` for `job` while every one of `members` agreed and no go is
/// there; `true` when it did.
pub async fn write_go(
    client: &mut etcd_client::Client,
    job: &str,
    members: &[u64],
    go: &Go,
) -> Result<bool, String> {
    let mut when = vec![Compare::create_revision(go_key(job), CompareOp::Equal, 0)];
    for id in members {
        when.push(Compare::create_revision(
            agree_key(job, *id),
            CompareOp::Greater,
            0,
        ));
    }
    let value = serde_json::to_string(go).map_err(|e| e.to_string())?;
    let txn = Txn::new()
        .when(when)
        .and_then([TxnOp::put(go_key(job), value, None)]);
    client
        .txn(txn)
        .await
        .map(|r| r.succeeded())
        .map_err(|e| error_chain(&e))
}

/// Withdraws member `id`'s agreement to `job` while it has no go; `true`
/// when withdrawn, `false` when the go is there (the member is bound).
pub async fn withdraw(
    client: &mut etcd_client::Client,
    job: &str,
    id: u64,
) -> Result<bool, String> {
    let txn = Txn::new()
        .when([Compare::create_revision(go_key(job), CompareOp::Equal, 0)])
        .and_then([TxnOp::delete(agree_key(job, id), None)]);
    client
        .txn(txn)
        .await
        .map(|r| r.succeeded())
        .map_err(|e| error_chain(&e))
}

/// Removes every key of `job` (the job is over).
pub async fn remove_all(client: &mut etcd_client::Client, job: &str) -> Result<(), String> {
    client
        .delete(
            dir(job),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .map(|_| ())
        .map_err(|e| error_chain(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_reads_back_into_what_it_says() {
        let mut seen = Seen::default();
        let job = "abc-3.3.25-etcd3";
        let go = crate::cluster::pause::Go::new(1, &[1, 2, 3]);
        let go_json = serde_json::to_string(&go).expect("json");
        for (key, value) in [
            (agree_key(job, 0x2a), "{}"),
            (stopping_key(job, 0x2b), "{}"),
            (joined_key(job, 0x2c), "{}"),
            (leave_now_key(job, 0x2b), "{}"),
            (go_key(job), go_json.as_str()),
            (served_key(job), "{}"),
            (format!("{}agree/zz", dir(job)), "{}"),
        ] {
            let rest = key.strip_prefix(dir(job).as_str()).expect("in the job");
            take_in(&mut seen, rest, value.as_bytes(), 7);
        }
        assert_eq!(seen.agreed.iter().copied().collect::<Vec<_>>(), vec![0x2a]);
        assert_eq!(seen.agreed_at.get(&0x2a), Some(&7));
        assert_eq!(
            seen.leave_now.iter().copied().collect::<Vec<_>>(),
            vec![0x2b]
        );
        assert_eq!(
            seen.stopping.iter().copied().collect::<Vec<_>>(),
            vec![0x2b]
        );
        assert_eq!(seen.joined.iter().copied().collect::<Vec<_>>(), vec![0x2c]);
        assert_eq!(seen.go, Some(go));
        assert!(seen.served);
    }
}
