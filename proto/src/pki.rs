//! A private certificate authority for a cluster's mutual TLS (`regolith up --tls`, and the
//! tests): a CA, and certificates it signs for daemons (server and client use, with the IP
//! addresses and names they are reached at) and for clients. ECDSA P-256 keys (rcgen, ring).
//!
//! Production clusters bring certificates from their own PKI (cert-manager, Vault, …); this is
//! for one machine and for tests.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::error::{Error, Result};

fn pki_err(what: &str) -> impl FnOnce(rcgen::Error) -> Error + '_ {
    move |e| Error::Config(format!("making {what}: {e}"))
}

/// A certificate authority: its certificate (PEM) and what signs with it.
pub struct Ca {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

fn named(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Regolith");
    dn.push(DnType::CommonName, cn);
    dn
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Result<Self> {
        let key = KeyPair::generate().map_err(pki_err("the CA key"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = named(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params
            .self_signed(&key)
            .map_err(pki_err("the CA certificate"))?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A certificate for `cn`, valid as a server for every name and IP address of `sans` and
    /// as a client (daemons are both: a sidecar dials its peers and metad; replicas dial each
    /// other).
    pub fn issue(&self, cn: &str, sans: &[String]) -> Result<Issued> {
        let key = KeyPair::generate().map_err(pki_err("a key"))?;
        let mut params = CertificateParams::new(sans.to_vec())
            .map_err(|e| Error::Config(format!("certificate names {sans:?}: {e}")))?;
        params.distinguished_name = named(cn);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(pki_err("a certificate"))?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Paths of one issued certificate and key on disk, with the CA they chain to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Writes `text` to `path`, readable by the owner alone when `secret` (keys), through a
/// temporary file and a rename so that a daemon reloading certificates never reads half a
/// file.
pub fn write_pem(path: &Path, text: &str, secret: bool) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |e: std::io::Error| Error::Config(format!("writing {}: {e}", path.display()));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "pem".into());
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

impl Issued {
    /// Writes `DIR/NAME.crt` and `DIR/NAME.key` (0600) and returns their paths with `ca`.
    pub fn write(&self, dir: &Path, name: &str, ca: &Path) -> Result<CertFiles> {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        write_pem(&cert, &self.cert_pem, false)?;
        write_pem(&key, &self.key_pem, true)?;
        Ok(CertFiles {
            ca: ca.to_path_buf(),
            cert,
            key,
        })
    }
}

/// A new CA written to `DIR/ca.crt`, and a certificate for each of `names` (valid for its name
/// and `sans`)
/// written to `DIR/NAME.crt` and `DIR/NAME.key`: a whole cluster's TLS material at once.
pub fn make_cluster(dir: &Path, names: &[&str], sans: &[String]) -> Result<Vec<CertFiles>> {
    let ca = Ca::new("Regolith cluster CA")?;
    let ca_path = dir.join("ca.crt");
    write_pem(&ca_path, ca.cert_pem(), false)?;
    names
        .iter()
        .map(|name| {
            // A certificate names its own process too (node identity: `--tls-node-identity`).
            let mut all = vec![name.to_string()];
            all.extend(sans.iter().filter(|s| s.as_str() != *name).cloned());
            ca.issue(name, &all)?.write(dir, name, &ca_path)
        })
        .collect()
}
