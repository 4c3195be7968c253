//! The gate's CA and its TLS configurations, for the hosts it terminates (see `terminate`):
//! on this machine the CA is made in the gate process's memory on first use and its key is
//! never written anywhere; a cluster-mode gate loads one from files (a Secret mounted into the
//! gate's Pod only), because its replicas and restarts must share the CA the agent Pods trust
//! (`ai-sandbox gate ca DIR` makes the pair). Each terminated host gets a leaf for its one name,
//! re-issued daily; the upstream side verifies the real server against the host's roots plus a
//! session's `upstream_ca`.

use super::proto::Proto;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The gate's CA.
pub(crate) struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// The CA certificate (public), which the launcher mounts into sandboxes.
    pub(crate) pem: String,
    /// Each host's config and when its leaf was made.
    leaves: Mutex<HashMap<String, (std::time::Instant, Arc<rustls::ServerConfig>)>>,
}

/// A leaf older than this is made again (leaves are valid 30 days; a gate can run longer).
const LEAF_REISSUE: std::time::Duration = std::time::Duration::from_secs(86_400);

/// Certificates are valid from yesterday for `days`.
fn validity(p: &mut rcgen::CertificateParams, days_valid: i64) {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| (d.as_secs() / 86_400) as i64)
        .unwrap_or(0);
    let ymd = |d: i64| {
        let (y, m, d) = super::log::civil(d);
        rcgen::date_time_ymd(y, m, d)
    };
    p.not_before = ymd(days - 1);
    p.not_after = ymd(days + days_valid);
}

/// A CA certificate's parameters: `cn`, may sign leaves only (path length 0), `days` valid.
fn ca_params(cn: &str, days: i64) -> rcgen::CertificateParams {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyUsagePurpose};
    let mut p = CertificateParams::default();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut p, days);
    p
}

/// A CA for a cluster-mode gate, as PEM (certificate, private key): `ai-sandbox gate ca`.
pub(crate) fn new_pair() -> anyhow::Result<(String, String)> {
    let key = rcgen::KeyPair::generate()?;
    let cert = ca_params("ai-sandbox cluster gate CA", 365).self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

impl Ca {
    /// A CA in this process's memory only.
    pub(crate) fn new() -> anyhow::Result<Ca> {
        let key = rcgen::KeyPair::generate()?;
        let cn = format!(
            "ai-sandbox gate CA (pid {}; its key is in that process's memory only)",
            std::process::id()
        );
        let p = ca_params(&cn, 365);
        let pem = p.self_signed(&key)?.pem();
        Ok(Ca { issuer: rcgen::Issuer::new(p, key), pem, leaves: Mutex::default() })
    }

    /// A CA from PEM files (a cluster-mode gate's mounted Secret).
    pub(crate) fn from_pem(cert: &str, key: &str) -> anyhow::Result<Ca> {
        let key = rcgen::KeyPair::from_pem(key).map_err(|e| anyhow::anyhow!("the CA key: {e}"))?;
        let issuer = rcgen::Issuer::from_ca_cert_pem(cert, key)
            .map_err(|e| anyhow::anyhow!("the CA certificate: {e}"))?;
        let ca = Ca { issuer, pem: cert.to_string(), leaves: Mutex::default() };
        // A key that is not the certificate's would sign leaves no client accepts: refuse now.
        let probe = "ca-check.ai-sandbox.invalid";
        handshake(&upstream_config(Some(cert))?, &ca.server_config(probe, Proto::H1)?, probe)
            .map_err(|e| anyhow::anyhow!("the key does not sign for the certificate: {e}"))?;
        ca.leaves.lock().unwrap_or_else(|e| e.into_inner()).clear();
        Ok(ca)
    }

    /// The server side's config for `host`: a leaf certificate for that one name (made once).
    pub(crate) fn server_config(
        &self,
        host: &str,
        version: Proto,
    ) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let h1 = self.leaf(host)?;
        Ok(match version {
            Proto::H1 => h1,
            Proto::H2 => {
                let mut c = (*h1).clone();
                c.alpn_protocols = vec![Proto::H2.alpn().to_vec()];
                Arc::new(c)
            }
        })
    }

    /// The host's leaf (made once, reissued after `LEAF_REISSUE`), answering HTTP/1.1.
    fn leaf(&self, host: &str) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair};
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((made, c)) = leaves.get(host)
            && made.elapsed() < LEAF_REISSUE
        {
            return Ok(c.clone());
        }
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(vec![host.to_string()])?;
        p.distinguished_name.push(DnType::CommonName, host);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut p, 30);
        let cert = p.signed_by(&key, &self.issuer)?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], PrivateKeyDer::Pkcs8(key.serialize_der().into()))?;
        // The version the upstream chose is answered (ADR 0065): HTTP/1.1 here, h2 by `server_config`.
        cfg.alpn_protocols = vec![Proto::H1.alpn().to_vec()];
        let cfg = Arc::new(cfg);
        leaves.insert(host.to_string(), (std::time::Instant::now(), cfg.clone()));
        Ok(cfg)
    }
}

/// The upstream side's config: the host's roots (the system bundle, or `SSL_CERT_FILE`), and
/// the session's `upstream_ca` (PEM) for a private CA.
pub(crate) fn upstream_config(extra_pem: Option<&str>) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(c);
    }
    if let Some(pem) = extra_pem {
        let mut n = 0;
        for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(c.map_err(|e| anyhow::anyhow!("upstream_ca: {e:?}"))?)?;
            n += 1;
        }
        anyhow::ensure!(n > 0, "upstream_ca holds no PEM certificate");
    }
    anyhow::ensure!(!roots.is_empty(), "no trusted roots for upstream TLS (the system bundle is empty)");
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // Each connection offers what its client offered (`upstream::with_alpn`).
    cfg.alpn_protocols = vec![Proto::H1.alpn().to_vec()];
    Ok(Arc::new(cfg))
}

/// Drives a client and a server in memory until the handshake ends: the client's verdict.
fn handshake(
    client: &Arc<rustls::ClientConfig>,
    server: &Arc<rustls::ServerConfig>,
    name: &'static str,
) -> Result<(), rustls::Error> {
    let mut c = rustls::ClientConnection::new(client.clone(), name.try_into().unwrap())?;
    let mut s = rustls::ServerConnection::new(server.clone())?;
    while c.is_handshaking() {
        let mut buf = Vec::new();
        c.write_tls(&mut buf).unwrap();
        s.read_tls(&mut buf.as_slice()).unwrap();
        s.process_new_packets()?;
        let mut buf = Vec::new();
        s.write_tls(&mut buf).unwrap();
        c.read_tls(&mut buf.as_slice()).unwrap();
        c.process_new_packets()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_issues_a_leaf_for_the_host_that_a_client_trusting_the_ca_accepts() {
        let ca = Ca::new().unwrap();
        let cfg = ca.server_config("api.example.test", Proto::H1).unwrap();
        assert_eq!(cfg.alpn_protocols, [b"http/1.1".to_vec()]);
        // Made once per host.
        assert!(Arc::ptr_eq(&cfg, &ca.server_config("api.example.test", Proto::H1).unwrap()));
        let h2 = ca.server_config("api.example.test", Proto::H2).unwrap();
        assert_eq!(h2.alpn_protocols, [b"h2".to_vec()], "the same leaf, answering h2");
        let client = upstream_config(Some(&ca.pem)).unwrap();
        assert_eq!(
            handshake(&client, &cfg, "api.example.test"),
            Ok(()),
            "a client trusting the CA accepts it"
        );
        // Control: the same leaf for another name is refused by the client.
        assert!(
            handshake(&client, &cfg, "other.example.test").is_err(),
            "a leaf for another name is refused"
        );
    }

    #[test]
    fn the_ca_pem_holds_a_certificate_and_no_key() {
        let ca = Ca::new().unwrap();
        assert!(ca.pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(!ca.pem.contains("PRIVATE KEY"));
        assert!(upstream_config(Some("not pem")).is_err());
    }
}
