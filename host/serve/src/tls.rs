//! TLS for the control plane's gRPC listener (rustls through tonic).
//!
//! The listener serves TLS when given a certificate and key
//! (`--tls-cert`/`--tls-key`), and by default whenever it listens beyond
//! loopback: a bearer token (and tenants' commands) must not cross a
//! network in the clear. With no certificate given it issues its own — a
//! CA kept in `<data>/tls/` (`ca.pem`; the key `ca.key` is 0600) and a
//! server certificate for `localhost`, the loopback addresses, the
//! listen address, the machine's host name and every `--tls-san`. Clients
//! trust it with `--ca-cert <data>/tls/ca.pem` (copy it to the nodes). The
//! CA is made once; the server certificate is reissued by the same CA
//! when the names asked for change, so clients keep trusting it.

use crate::files::{private_dir, write};
use anyhow::Context;
use arbiter_host::files::{MAX_CONFIG_FILE, read_at_most};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// When the listener serves TLS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// For non-loopback listeners, or whenever a certificate is given.
    #[default]
    Auto,
    /// Always (a self-issued certificate if none is given).
    On,
    /// Never: plaintext even beyond loopback (logged as a warning).
    Off,
}

/// The operator's TLS settings.
#[derive(Clone, Debug, Default)]
pub struct TlsSettings {
    pub mode: TlsMode,
    /// PEM certificate chain and private key to serve with; both or neither.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Extra names (DNS names or IPs) for a self-issued certificate.
    pub sans: Vec<String>,
}

/// What the listener serves with.
pub struct ServerTls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    /// The CA clients must trust, when the plane issued the certificate.
    pub ca_path: Option<PathBuf>,
}

/// The identity to serve with, or `None` for plaintext.
pub fn server_tls(
    settings: &TlsSettings,
    listen: SocketAddr,
    data: &Path,
) -> anyhow::Result<Option<ServerTls>> {
    match (&settings.cert, &settings.key) {
        (Some(cert), Some(key)) => {
            if settings.mode == TlsMode::Off {
                anyhow::bail!("--tls off with --tls-cert/--tls-key: choose one");
            }
            let read = |p: &Path| read_at_most(p, MAX_CONFIG_FILE);
            return Ok(Some(ServerTls {
                cert_pem: read(cert)?,
                key_pem: read(key)?,
                ca_path: None,
            }));
        }
        (None, None) => {}
        _ => anyhow::bail!("--tls-cert and --tls-key go together"),
    }
    let loopback = listen.ip().is_loopback();
    match settings.mode {
        TlsMode::Off => {
            if !loopback {
                tracing::warn!(%listen, "serving plaintext beyond loopback (--tls off): tokens cross the network in the clear");
            }
            Ok(None)
        }
        TlsMode::Auto if loopback => Ok(None),
        TlsMode::Auto | TlsMode::On => {
            let mut names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
            if !listen.ip().is_unspecified() {
                names.push(listen.ip().to_string());
            }
            if let Some(host) = host_name() {
                names.push(host);
            }
            names.extend(settings.sans.iter().cloned());
            self_issued(&data.join("tls"), names).map(Some)
        }
    }
}

/// This machine's host name, where the system says it.
fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// The CA's subject: fixed, so the issuer can be rebuilt from its key.
fn ca_params() -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new()).context("CA parameters")?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "Arbiter control plane CA");
    params
        .distinguished_name
        .push(DnType::OrganizationName, "Arbiter");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
    ];
    set_validity(&mut params, 10);
    Ok(params)
}

/// Valid from the start of this year for `years` years.
fn set_validity(params: &mut CertificateParams, years: i32) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Calendar years are close enough for a validity window.
    let year = 1970 + (secs / 31_556_952) as i32;
    params.not_before = rcgen::date_time_ymd(year, 1, 1);
    params.not_after = rcgen::date_time_ymd(year + years, 1, 1);
}

/// The plane's own CA and a server certificate for `names`, made or reused in `dir`.
pub fn self_issued(dir: &Path, mut names: Vec<String>) -> anyhow::Result<ServerTls> {
    names.sort();
    names.dedup();
    private_dir(dir)?;
    let (ca_pem, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let ca_keypair = if ca_key.exists() && ca_pem.exists() {
        let pem = std::fs::read_to_string(&ca_key)
            .with_context(|| format!("reading {}", ca_key.display()))?;
        KeyPair::from_pem(&pem).with_context(|| format!("{} is not a key", ca_key.display()))?
    } else {
        let key = KeyPair::generate().context("generating the CA key")?;
        let cert = ca_params()?.self_signed(&key).context("issuing the CA")?;
        write(&ca_key, key.serialize_pem().as_bytes(), true)?;
        write(&ca_pem, cert.pem().as_bytes(), false)?;
        tracing::info!(ca = %ca_pem.display(), "issued the control plane's CA");
        key
    };
    let (cert_path, key_path, names_path) = (
        dir.join("server.pem"),
        dir.join("server.key"),
        dir.join("server.names"),
    );
    let wanted = names.join("\n");
    let current = std::fs::read_to_string(&names_path).unwrap_or_default();
    if current != wanted || !cert_path.exists() || !key_path.exists() {
        let issuer = Issuer::new(ca_params()?, ca_keypair);
        let mut params = CertificateParams::new(names.clone()).context("server names")?;
        params
            .distinguished_name
            .push(DnType::CommonName, "arbiter serve");
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        set_validity(&mut params, 2);
        let key = KeyPair::generate().context("generating the server key")?;
        let cert = params
            .signed_by(&key, &issuer)
            .context("issuing the server certificate")?;
        write(&key_path, key.serialize_pem().as_bytes(), true)?;
        write(&cert_path, cert.pem().as_bytes(), false)?;
        write(&names_path, wanted.as_bytes(), false)?;
        tracing::info!(names = ?names, "issued the server certificate");
    }
    let read = |p: &Path| read_at_most(p, MAX_CONFIG_FILE);
    Ok(ServerTls {
        cert_pem: read(&cert_path)?,
        key_pem: read(&key_path)?,
        ca_path: Some(ca_pem),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_is_made_once_and_the_server_certificate_follows_the_names() {
        let dir = tempfile::tempdir().unwrap();
        let tls = dir.path().join("tls");
        let first = self_issued(&tls, vec!["localhost".into()]).unwrap();
        let ca = std::fs::read(tls.join("ca.pem")).unwrap();
        let again = self_issued(&tls, vec!["localhost".into()]).unwrap();
        assert_eq!(first.cert_pem, again.cert_pem, "same names: reused");
        let renamed = self_issued(&tls, vec!["localhost".into(), "gpu-head".into()]).unwrap();
        assert_ne!(first.cert_pem, renamed.cert_pem, "new names: reissued");
        assert_eq!(
            std::fs::read(tls.join("ca.pem")).unwrap(),
            ca,
            "by the same CA"
        );
        use std::os::unix::fs::PermissionsExt;
        for secret in ["ca.key", "server.key"] {
            let mode = std::fs::metadata(tls.join(secret))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{secret}");
        }
        let mode = std::fs::metadata(&tls).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn loopback_stays_plaintext_unless_asked_and_half_a_pair_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let lo: SocketAddr = "127.0.0.1:7070".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:7070".parse().unwrap();
        let auto = TlsSettings::default();
        assert!(server_tls(&auto, lo, dir.path()).unwrap().is_none());
        assert!(server_tls(&auto, any, dir.path()).unwrap().is_some());
        let on = TlsSettings {
            mode: TlsMode::On,
            ..TlsSettings::default()
        };
        assert!(server_tls(&on, lo, dir.path()).unwrap().is_some());
        let off = TlsSettings {
            mode: TlsMode::Off,
            ..TlsSettings::default()
        };
        assert!(server_tls(&off, any, dir.path()).unwrap().is_none());
        let half = TlsSettings {
            cert: Some(dir.path().join("x.pem")),
            ..TlsSettings::default()
        };
        assert!(server_tls(&half, lo, dir.path()).is_err());
    }
}
