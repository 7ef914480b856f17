//! The pause job's proof of a joined member on real etcd
//! (`cluster::pause::run::same_keyspace`): the converter and a member
//! that joined it must hash alike at the converter's revision, by etcd's
//! `HashKV` on 3.3 and later and by a digest of every key read in pages
//! below 3.3 (3.2's path, run here on 3.3.25, whose ranges are 3.2's).
//! A value that differs fails either proof, naming what differs; a
//! member behind the converter is told how far.

use std::str::FromStr;

use etcd_client::Client;
use etcd_migrate::cluster::pause::run::same_keyspace;
use etcd_migrate::version::Version;

use crate::harness::etcd::{connect, EtcdProcess};
use crate::harness::ports::free_port;
use crate::harness::{block_on, temp_dir, Member};

/// More than one page of the digest's reads (1,000 keys a page).
const KEYS: usize = 1200;

async fn revision(client: &mut Client) -> i64 {
    client
        .status()
        .await
        .expect("status")
        .header()
        .expect("a header")
        .revision()
}

/// Writes into `client`'s etcd until its revision is at least `to`.
async fn pad_to(client: &mut Client, to: i64) {
    while revision(client).await < to {
        client.put("pad", "x", None).await.expect("put pad");
    }
}

fn release(text: &str) -> Version {
    Version::from_str(text).expect("a version")
}

#[test]
fn a_joined_member_differing_in_one_value_fails_the_proof_by_digest_and_by_hash_kv() {
    let dir = temp_dir("pause-proof");
    let (converter, joiner) = (Member::new("proof-converter"), Member::new("proof-joiner"));
    let mut a = EtcdProcess::start(
        "3.3.25",
        &converter,
        &dir.path().join("converter"),
        free_port(),
        dir.path(),
    );
    let mut b = EtcdProcess::start(
        "3.3.25",
        &joiner,
        &dir.path().join("joiner"),
        free_port(),
        dir.path(),
    );
    block_on(async {
        a.wait_ready().await;
        b.wait_ready().await;
        let mut theirs = connect(&a.endpoint()).await.expect("connect");
        let mut ours = connect(&b.endpoint()).await.expect("connect");
        for client in [&mut theirs, &mut ours] {
            for i in 0..KEYS {
                client
                    .put(format!("k-{i:05}"), format!("value {i}"), None)
                    .await
                    .expect("seed");
            }
        }
        // The converter against itself: proven by either, at its revision.
        let mut again = connect(&a.endpoint()).await.expect("connect");
        let at = revision(&mut theirs).await;
        for proof in ["3.2.32", "3.3.25"] {
            let proven = same_keyspace(&mut theirs, &mut again, release(proof)).await;
            assert_eq!(
                proven,
                Ok(at),
                "the converter against itself, {proof}'s proof"
            );
        }

        // One value differs; the joiner has the converter's revision.
        theirs
            .put("k-01000", "the converter's", None)
            .await
            .expect("put");
        ours.put("k-01000", "the joiner's", None)
            .await
            .expect("put");
        let at = revision(&mut theirs).await;
        pad_to(&mut ours, at).await;
        let by_digest = same_keyspace(&mut theirs, &mut ours, release("3.2.32"))
            .await
            .expect_err("a differing value fails the digest");
        assert!(
            by_digest.contains(&format!("the keyspace at revision {at}"))
                && by_digest.contains("digest"),
            "{by_digest}"
        );
        let by_hash = same_keyspace(&mut theirs, &mut ours, release("3.3.25"))
            .await
            .expect_err("a differing value fails HashKV");
        assert!(
            by_hash.contains(&format!("HashKV at revision {at}")),
            "{by_hash}"
        );

        // A joiner behind the converter is not compared at all.
        let ahead = revision(&mut ours).await + 3;
        pad_to(&mut theirs, ahead).await;
        let behind = same_keyspace(&mut theirs, &mut ours, release("3.2.32"))
            .await
            .expect_err("behind");
        assert!(behind.contains("this member is at revision"), "{behind}");
    });
    a.stop();
    b.stop();
}
