//! TLS for the Apache servers (`RocketMqOptions::tls`): a private CA and a server certificate
//! for `127.0.0.1`, made with the `openssl` command, and the Java system properties of
//! Apache RocketMQ's `TlsSystemConfig` that make the name server and brokers accept TLS only
//! (`tls.server.mode=enforcing`) and speak it to each other.
//!
//! Guarantee: the files live in the directory given (under the cluster's root); nothing is
//! installed system-wide. Clients trust the CA explicitly (`ClientSecurity::trusting`, or
//! `$SSL_CERT_FILE` for a relay process).

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The CA and the servers' certificate and key (PEM; the key PKCS#8, as Netty wants it).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    /// A new CA and a certificate it signs for `127.0.0.1` and `localhost`, in `dir`.
    pub fn make(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let files = TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        };
        let (ca_key, csr, ext) = (
            dir.join("ca.key"),
            dir.join("server.csr"),
            dir.join("ext.cnf"),
        );
        let path = |p: &Path| p.display().to_string();
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "7",
            "-subj",
            "/CN=outbox-relay devenv CA",
            "-keyout",
            &path(&ca_key),
            "-out",
            &path(&files.ca),
        ])?;
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            &path(&files.key),
            "-out",
            &path(&csr),
        ])?;
        std::fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n",
        )?;
        openssl(&[
            "x509",
            "-req",
            "-days",
            "7",
            "-in",
            &path(&csr),
            "-CA",
            &path(&files.ca),
            "-CAkey",
            &path(&ca_key),
            "-CAcreateserial",
            "-extfile",
            &path(&ext),
            "-out",
            &path(&files.cert),
        ])?;
        Ok(files)
    }

    /// The JVM flags of a name server or broker: TLS only, with these files, and TLS (checking
    /// the CA) on its own connections to the other servers.
    pub fn server_flags(&self) -> Vec<String> {
        let mut flags = vec![
            "-Dtls.server.mode=enforcing".to_string(),
            format!("-Dtls.server.certPath={}", self.cert.display()),
            format!("-Dtls.server.keyPath={}", self.key.display()),
            "-Dtls.server.need.client.auth=none".to_string(),
        ];
        flags.extend(self.client_flags());
        flags
    }

    /// The JVM flags of a Java client (`mqadmin`): TLS, trusting the CA.
    pub fn client_flags(&self) -> Vec<String> {
        vec![
            "-Dtls.enable=true".to_string(),
            // Off, or servers present a throw-away self-signed certificate and clients trust
            // anything.
            "-Dtls.test.mode.enable=false".to_string(),
            "-Dtls.client.authServer=true".to_string(),
            format!("-Dtls.client.trustCertPath={}", self.ca.display()),
        ]
    }
}

fn openssl(args: &[&str]) -> io::Result<()> {
    let output = Command::new("openssl").args(args).output().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot run `openssl` (needed for RocketMqOptions::tls): {e}"),
        )
    })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "openssl {} failed: {}",
            args[0],
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}
