//! This module owns the proof of health: one write of the key
//! `etcd_version` = the release, through the API the data is served by (v2
//! HTTP for etcd2 storage, v3 gRPC for etcd3). `/health` is not used: 3.5
//! answers it while refusing every v3 call as "not capable" (ETCD-NOTES).
//! Before a v3 write, the data's alarms are listed: a NOSPACE or CORRUPT
//! alarm raised before the migration makes every write fail forever, so it
//! is reported at once, with the remedy, instead of after the deadline.

use std::future::Future;
use std::time::Duration;

use etcd_client::{AlarmAction, AlarmType};

use crate::executor::{Health, HealthError};
use crate::keyspace::Fingerprint;
use crate::log::error_chain;
use crate::version::Storage;

/// The key every step writes, as the Kubernetes tool did.
pub const HEALTH_KEY: &str = "etcd_version";

/// How long one write attempt may take before the next is tried. A
/// single-member write is a few ms; 2.x holds writes up to 500 ms before it
/// has elected itself.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

/// Writes through the real APIs.
pub struct EtcdHealth {
    http: reqwest::Client,
}

impl EtcdHealth {
    /// A prober with its own HTTP client (no proxy: steps are on loopback).
    pub fn new() -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(ATTEMPT_TIMEOUT)
            .timeout(ATTEMPT_TIMEOUT)
            .build()
            .map_err(|err| format!("cannot build the HTTP client: {err}"))?;
        Ok(EtcdHealth { http })
    }

    async fn write_v2(&self, endpoint: &str, value: &str) -> Result<(), String> {
        let url = format!("{endpoint}/v2/keys/{HEALTH_KEY}");
        let response = self
            .http
            .put(&url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("value={value}"))
            .send()
            .await
            .map_err(|err| format!("v2 PUT {url}: {}", error_chain(&err)))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let body = response.text().await.unwrap_or_default();
        Err(format!("v2 PUT {url}: HTTP {status}: {}", body.trim()))
    }

    async fn write_v3(&self, endpoint: &str, value: &str) -> Result<(), HealthError> {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(ATTEMPT_TIMEOUT)
            .with_timeout(ATTEMPT_TIMEOUT);
        let mut client = etcd_client::Client::connect([endpoint], Some(options))
            .await
            .map_err(|err| {
                HealthError::NotYet(format!("v3 connect {endpoint}: {}", error_chain(&err)))
            })?;
        let alarms = client
            .alarm(AlarmAction::Get, AlarmType::None, None)
            .await
            .map_err(|err| {
                HealthError::NotYet(format!("v3 alarm list {endpoint}: {}", error_chain(&err)))
            })?;
        let raised: Vec<AlarmType> = alarms.alarms().iter().map(|a| a.alarm()).collect();
        if let Some(refusal) = refusal_for(&raised) {
            return Err(refusal);
        }
        client
            .put(HEALTH_KEY, value, None)
            .await
            .map(|_| ())
            .map_err(|err| HealthError::NotYet(format!("v3 put {endpoint}: {}", error_chain(&err))))
    }
}

impl Health for EtcdHealth {
    fn fingerprint(
        &self,
        endpoint: &str,
        storage: Storage,
    ) -> impl Future<Output = Result<Fingerprint, String>> {
        let endpoint = endpoint.to_string();
        async move { crate::keyspace::read_fingerprint(&endpoint, storage).await }
    }

    fn write(
        &self,
        endpoint: &str,
        storage: Storage,
        value: &str,
    ) -> impl Future<Output = Result<(), HealthError>> {
        let endpoint = endpoint.to_string();
        let value = value.to_string();
        async move {
            match storage {
                Storage::Etcd2 => self
                    .write_v2(&endpoint, &value)
                    .await
                    .map_err(HealthError::NotYet),
                Storage::Etcd3 => self.write_v3(&endpoint, &value).await,
            }
        }
    }
}

/// The refusal for alarms raised in the data, if any. Both kinds make etcd
/// refuse every write until an operator acts, so no retry can help.
fn refusal_for(raised: &[AlarmType]) -> Option<HealthError> {
    if raised.contains(&AlarmType::Nospace) {
        return Some(HealthError::Refused {
            reason: "the data holds a NOSPACE alarm: its backend reached the space quota (--quota-backend-bytes, 2 GiB by default) and etcd accepts no write until the alarm is cleared".to_string(),
            remedy: "to clear it, serve the data with its recorded release and run: `etcdctl endpoint status -w json` (note the revision), `etcdctl compact <revision>`, `etcdctl defrag`, `etcdctl alarm disarm`; then rerun etcd-migrate (or, if the data is meant to be this large, raise --quota-backend-bytes through ETCD_CREDS)".to_string(),
        });
    }
    if raised.contains(&AlarmType::Corrupt) {
        return Some(HealthError::Refused {
            reason: "the data holds a CORRUPT alarm: etcd found this member's data inconsistent".to_string(),
            remedy: "do not migrate it: restore this member from a backup or a snapshot (etcdctl snapshot restore), then rerun etcd-migrate".to_string(),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raised_alarms_refuse_with_a_remedy_and_none_lets_the_write_go() {
        assert_eq!(refusal_for(&[]), None);
        assert_eq!(refusal_for(&[AlarmType::None]), None);
        match refusal_for(&[AlarmType::Nospace]) {
            Some(HealthError::Refused { reason, remedy }) => {
                assert!(reason.contains("NOSPACE"), "{reason}");
                for word in ["compact", "defrag", "alarm disarm"] {
                    assert!(remedy.contains(word), "{remedy}");
                }
            }
            other => panic!("NOSPACE must refuse: {other:?}"),
        }
        assert!(matches!(
            refusal_for(&[AlarmType::Corrupt]),
            Some(HealthError::Refused { .. })
        ));
    }
}
