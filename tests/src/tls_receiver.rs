//! A local HTTPS receiver that requires a client certificate, and the
//! certificates for it, made in the test by rcgen: a CA, a server
//! certificate for `127.0.0.1` and `localhost`, and client certificates
//! signed by that CA or by another.
//!
//! The server is hyper's HTTP/1 over tokio-rustls (ring, as reqwest's
//! rustls uses). It answers 200 to every request that completed the
//! handshake, and records the subject of the client certificate it saw.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, SanType,
};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};

/// A certificate authority made for one test.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate and its key, in PEM.
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
    der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("a CA certificate");
        Self { cert, key }
    }

    /// The CA's certificate, in PEM.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A server certificate for `127.0.0.1` and `localhost`.
    pub fn server(&self) -> Issued {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        params
            .distinguished_name
            .push(DnType::CommonName, "receiver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    /// A client certificate with common name `name`.
    pub fn client(&self, name: &str) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    fn issue(&self, params: CertificateParams) -> Issued {
        let key = KeyPair::generate().expect("a key");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("signed");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }
}

impl Issued {
    /// Writes the certificate and the key as `<stem>.crt` and `<stem>.key`
    /// in `dir`; returns both paths.
    pub fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, &self.cert_pem).expect("write the certificate");
        std::fs::write(&key, &self.key_pem).expect("write the key");
        (cert, key)
    }
}

/// A running HTTPS receiver that requires a client certificate.
pub struct TlsReceiver {
    /// `https://127.0.0.1:<port>/hook`.
    pub url: String,
    /// The requests that got through: the body of each.
    received: Arc<Mutex<Vec<Vec<u8>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsReceiver {
    /// Serves `server` (issued by some CA) and accepts only client
    /// certificates issued by `clients`.
    pub async fn start(server: &Issued, clients: &TestCa) -> Self {
        let mut roots = RootCertStore::empty();
        roots.add(clients.cert.der().clone()).expect("a root");
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .expect("a client verifier");
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![server.der.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server.key_der.clone())),
            )
            .expect("the server certificate");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr: SocketAddr = listener.local_addr().expect("addr");
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = received.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let log = log.clone();
                tokio::spawn(async move {
                    // A refused handshake ends here: nothing is recorded.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service =
                        service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                            let log = log.clone();
                            async move {
                                let body = request
                                    .into_body()
                                    .collect()
                                    .await
                                    .map(|b| b.to_bytes().to_vec())
                                    .unwrap_or_default();
                                log.lock().expect("lock").push(body);
                                Ok::<_, hyper::Error>(hyper::Response::new(Full::new(
                                    bytes::Bytes::from_static(b"ok"),
                                )))
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            url: format!("https://127.0.0.1:{}/hook", addr.port()),
            received,
            task,
        }
    }

    /// The bodies received so far.
    pub fn received(&self) -> Vec<Vec<u8>> {
        self.received.lock().expect("lock").clone()
    }
}

impl Drop for TlsReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
