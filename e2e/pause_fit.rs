//! The checks before a storage-changing pause job's go
//! (`cluster::pause::fit`), on real etcd 3.3.25: the whole v3 keyspace is
//! read page by page (2,345 keys: three pages of 1,000), so a key on the
//! last page that does not fit is found and named; once it is gone, the
//! keyspace fits. etcd3 → etcd2: a binary value; etcd2 → etcd3: a v2 leaf
//! on a v3 key of the same name.

use std::time::Duration;

use etcd_migrate::cluster::pause::fit::{v2_misfit, v3_clash};

use crate::harness::etcd::EtcdProcess;
use crate::harness::{block_on, temp_dir};

const KEYS: usize = 2345;

#[test]
fn a_key_on_the_last_page_that_does_not_fit_is_named_until_it_is_gone() {
    let dir = temp_dir("pause-fit");
    let mut etcd = EtcdProcess::start_in("3.3.25", dir.path(), "data", "fit");
    let endpoint = etcd.endpoint();
    block_on(async {
        etcd.wait_ready().await;
        let mut client = etcd_client::Client::connect([endpoint.as_str()], None)
            .await
            .expect("v3 client");
        for i in 0..KEYS {
            client
                .put(format!("/registry/pods/p-{i:05}"), "{}", None)
                .await
                .expect("put");
        }
        // Last in key order: on the third page.
        let binary = "/registry/zz/binary";
        client
            .put(binary, vec![0xffu8, 0xfe, 0x00], None)
            .await
            .expect("put binary");
        let misfit = v2_misfit(&mut client).await.expect("read");
        assert!(
            misfit.as_deref().is_some_and(|why| why.contains(binary)),
            "{misfit:?}"
        );
        client.delete(binary, None).await.expect("delete");
        assert_eq!(v2_misfit(&mut client).await.expect("read"), None);

        // etcd2 -> etcd3: a v2 leaf on a v3 key of the same name.
        let http = etcd_migrate::tls::client_builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("http client");
        let clash = "/registry/pods/p-02000";
        let url = format!("{endpoint}/v2/keys{clash}");
        let answer = http
            .put(&url)
            .form(&[("value", "v2")])
            .send()
            .await
            .expect("v2 put");
        assert!(answer.status().is_success(), "{answer:?}");
        let found = v3_clash(&mut client, &http, &endpoint).await.expect("read");
        assert!(
            found.as_deref().is_some_and(|why| why.contains(clash)),
            "{found:?}"
        );
        http.delete(&url).send().await.expect("v2 delete");
        assert_eq!(
            v3_clash(&mut client, &http, &endpoint).await.expect("read"),
            None
        );
    });
    etcd.stop();
}
