//! TLS to a destination: its own CA bundle (`ca_file`) and a client
//! certificate (`client_cert_file`, `client_key_file`), against a local
//! HTTPS receiver that requires one. Certificates are made here by rcgen.

use hookinbox::deliveries::ErrorClass;
use hookinbox_tests::tls_receiver::{TestCa, TlsReceiver};
use hookinbox_tests::{Hook, SECRET, TestEnv};

#[tokio::test]
async fn a_destination_trusts_its_ca_file_and_presents_its_client_certificate() {
    let env = TestEnv::new().await;
    let dir = std::env::temp_dir().join(format!("{}-tls", env.prefix));
    std::fs::create_dir_all(&dir).expect("dir");
    let ca = TestCa::new("receiver CA");
    let stranger = TestCa::new("another CA");
    let receiver = TlsReceiver::start(&ca.server(), &ca).await;
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).expect("write");
    let other_ca_file = dir.join("other-ca.pem");
    std::fs::write(&other_ca_file, stranger.pem()).expect("write");
    let (cert, key) = ca.client("hookinbox").write(&dir, "client");
    let (wrong_cert, wrong_key) = stranger.client("hookinbox").write(&dir, "wrong");
    let url = &receiver.url;
    let config = env.config_file(&format!(
        r#"
[[sources]]
name = "default"
secrets = ["{SECRET}"]

# The right CA and a client certificate the receiver accepts.
[[sources.destinations]]
name = "mtls"
kind = "forward"
url = "{url}"
ca_file = "{ca}"
client_cert_file = "{cert}"
client_key_file = "{key}"
breaker = false
retry = ["1h"]

# No client certificate: the receiver refuses the handshake.
[[sources.destinations]]
name = "no-cert"
kind = "forward"
url = "{url}"
ca_file = "{ca}"
breaker = false
retry = ["1h"]

# A client certificate of another CA: refused.
[[sources.destinations]]
name = "wrong-cert"
kind = "forward"
url = "{url}"
ca_file = "{ca}"
client_cert_file = "{wrong_cert}"
client_key_file = "{wrong_key}"
breaker = false
retry = ["1h"]

# The built-in roots do not know the receiver's CA.
[[sources.destinations]]
name = "default-roots"
kind = "forward"
url = "{url}"
client_cert_file = "{cert}"
client_key_file = "{key}"
breaker = false
retry = ["1h"]

# Another CA bundle: the receiver's certificate is not trusted.
[[sources.destinations]]
name = "other-ca"
kind = "forward"
url = "{url}"
ca_file = "{other}"
client_cert_file = "{cert}"
client_key_file = "{key}"
breaker = false
retry = ["1h"]
"#,
        ca = ca_file.display(),
        cert = cert.display(),
        key = key.display(),
        wrong_cert = wrong_cert.display(),
        wrong_key = wrong_key.display(),
        other = other_ca_file.display(),
    ));
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    let report = worker.drain().await.expect("drain");
    assert_eq!(report.outcomes.len(), 5);
    assert_eq!(
        receiver.received(),
        vec![hook.body.clone()],
        "only mtls got through"
    );

    let legs: Vec<(String, String, Option<String>, Option<String>)> = env
        .db
        .query(
            "select destination, status, last_error_class, last_error from deliveries \
             order by destination",
            &[],
        )
        .await
        .expect("legs")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    for (destination, status, class, error) in &legs {
        println!("{destination}: {status} {class:?} {error:?}");
        if destination == "mtls" {
            assert_eq!(status, "completed");
        } else {
            // A TLS failure is the destination's: without a breaker,
            // retried later (never dead-lettered).
            assert_eq!(status, "failed", "{destination}");
            assert_eq!(
                class.as_deref(),
                Some(ErrorClass::Transient.as_str()),
                "{destination}"
            );
        }
    }
    env.cleanup().await;
    let _ = std::fs::remove_dir_all(dir);
}
