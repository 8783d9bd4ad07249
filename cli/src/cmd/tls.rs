//! `regolith tls init DIR --name NAME...`: a private CA and one certificate per name, for a
//! cluster's mutual TLS (docs/security.md, TLS) when no PKI of the operator's issues them.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use regolith_proto::pki::{write_pem, Ca};

use crate::args::{TlsArgs, TlsCmd};
use crate::error::{Error, Result};

pub fn run(a: &TlsArgs) -> Result<()> {
    match &a.cmd {
        TlsCmd::Init {
            dir,
            names,
            sans,
            force,
        } => init(dir, names, sans, *force),
    }
}

fn init(dir: &Path, names: &[String], sans: &[String], force: bool) -> Result<()> {
    let files: Vec<String> = std::iter::once("ca.crt".to_string())
        .chain(
            names
                .iter()
                .flat_map(|n| [format!("{n}.crt"), format!("{n}.key")]),
        )
        .collect();
    for (flag, n) in names
        .iter()
        .map(|n| ("--name", n))
        .chain(sans.iter().map(|s| ("--san", s)))
    {
        let valid = regolith_proto::tls::pki_types::ServerName::try_from(n.as_str()).is_ok();
        if !valid || n.contains('/') || n.starts_with('.') {
            return Err(Error::usage(format!(
                "{flag} {n:?}: a DNS name or an IP address"
            )));
        }
    }
    if !force {
        if let Some(f) = files.iter().find(|f| dir.join(f).exists()) {
            return Err(Error::usage(format!(
                "{} exists: --force replaces it (every process must then get the new CA)",
                dir.join(f).display()
            )));
        }
    }
    std::fs::create_dir_all(dir).map_err(|source| Error::File {
        what: "cannot create",
        path: dir.to_path_buf(),
        source,
    })?;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    let failed = |e: regolith_proto::Error| Error::Failed(e.to_string());
    let ca = Ca::new("Regolith cluster CA").map_err(failed)?;
    let ca_path = dir.join("ca.crt");
    write_pem(&ca_path, ca.cert_pem(), false).map_err(failed)?;
    for n in names {
        let mut all = vec![n.clone()];
        all.extend(sans.iter().filter(|s| *s != n).cloned());
        ca.issue(n, &all)
            .and_then(|c| c.write(dir, n, &ca_path))
            .map_err(|e| Error::usage(format!("--name {n}: {e}")))?;
    }
    for f in files {
        println!("{}", dir.join(f).display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_writes_a_ca_and_loadable_certificates_and_keeps_what_exists() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("tls");
        init(
            &dir,
            &["regolith".into(), "10.0.0.7".into()],
            &["127.0.0.1".into()],
            false,
        )
        .unwrap();
        for n in ["regolith", "10.0.0.7"] {
            let tls = regolith_proto::tls::TlsArgs {
                tls_ca: Some(dir.join("ca.crt")),
                tls_cert: Some(dir.join(format!("{n}.crt"))),
                tls_key: Some(dir.join(format!("{n}.key"))),
                ..Default::default()
            }
            .load(true)
            .unwrap();
            assert!(tls.is_some());
            let mode = std::fs::metadata(dir.join(format!("{n}.key"))).unwrap();
            assert_eq!(mode.permissions().mode() & 0o777, 0o600);
        }
        let e = init(&dir, &["regolith".into()], &[], false).unwrap_err();
        assert!(matches!(e, Error::Usage(_)), "{e}");
        init(&dir, &["regolith".into()], &[], true).unwrap();
        let e = init(&dir, &["not a name".into()], &[], true).unwrap_err();
        assert!(e.to_string().contains("not a name"), "{e}");
    }
}
