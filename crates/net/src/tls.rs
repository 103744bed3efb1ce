//! Mutual TLS for gRPC (tonic over rustls, ring's cryptography): every role and client of a
//! cluster holds a certificate of the cluster's CA and its key. A server presents its
//! certificate and refuses a client whose certificate the CA did not sign (or that has
//! none); a client checks the server's certificate against the same CA and the name in
//! the address it dials (`127.0.0.1`, `localhost`, or [`Tls::with_server_name`]).

use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};

/// What is wrong with a TLS setting, naming the file or the part.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} {path}: {error}")]
    Read { what: &'static str, path: String, error: std::io::Error },
    #[error("{what} {path} holds no PEM block `-----BEGIN {label}`")]
    NotPem { what: &'static str, path: String, label: &'static str },
    #[error("the certificate and key do not make a server identity: {0}")]
    Server(String),
    #[error("the CA, certificate and key do not make a client setting: {0}")]
    Client(String),
}

/// A process's TLS setting: its certificate chain and key, and the CA its peers' certificates
/// must come from.
#[derive(Clone)]
pub struct Tls {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Vec<u8>,
    server_name: Option<String>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Tls").field("server_name", &self.server_name).finish_non_exhaustive()
    }
}

fn read(what: &'static str, path: &Path, label: &'static str) -> Result<Vec<u8>, TlsError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|error| TlsError::Read { what, path: shown.clone(), error })?;
    if !contains_pem(&bytes, label) {
        return Err(TlsError::NotPem { what, path: shown, label });
    }
    Ok(bytes)
}

/// Whether `bytes` hold a PEM block whose label ends with `label` (`CERTIFICATE`, `PRIVATE KEY`).
fn contains_pem(bytes: &[u8], label: &str) -> bool {
    let text = String::from_utf8_lossy(bytes);
    text.lines().any(|line| {
        line.strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|found| found.ends_with(label))
    })
}

impl Tls {
    /// Reads the PEM files and checks that they make a server identity and a client setting,
    /// so a bad file is named when a process starts rather than at its first connection.
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<Tls, TlsError> {
        let tls = Tls {
            cert: read("the certificate", cert, "CERTIFICATE")?,
            key: read("the key", key, "PRIVATE KEY")?,
            ca: read("the CA certificate", ca, "CERTIFICATE")?,
            server_name: None,
        };
        tls.check()?;
        Ok(tls)
    }

    /// The name a client checks the server's certificate for, instead of the host it dials.
    pub fn with_server_name(mut self, name: impl Into<String>) -> Tls {
        self.server_name = Some(name.into());
        self
    }

    fn check(&self) -> Result<(), TlsError> {
        Server::builder().tls_config(self.server_config()).map_err(|error| TlsError::Server(error_chain(&error)))?;
        Endpoint::from_static("https://127.0.0.1:1")
            .tls_config(self.client_config())
            .map_err(|error| TlsError::Client(error_chain(&error)))?;
        Ok(())
    }

    /// A server's setting: present the certificate, require a client certificate of the CA.
    pub fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .client_ca_root(Certificate::from_pem(&self.ca))
    }

    /// A client's setting: trust only the CA, present the certificate.
    pub fn client_config(&self) -> ClientTlsConfig {
        let config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(&self.cert, &self.key));
        match &self.server_name {
            Some(name) => config.domain_name(name.clone()),
            None => config,
        }
    }
}

/// A tonic server builder, with `tls` when given (its setting was checked by [`Tls::load`],
/// so a failure here is reported as the I/O error it would be).
pub fn server_builder(tls: Option<&Tls>) -> std::io::Result<Server> {
    match tls {
        None => Ok(Server::builder()),
        Some(tls) => Server::builder()
            .tls_config(tls.server_config())
            .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidInput, error_chain(&error))),
    }
}

/// `address` with the scheme TLS needs (`https://`): tonic speaks TLS only to https URIs.
pub fn https(address: &str) -> String {
    match address.strip_prefix("http://") {
        Some(rest) => format!("https://{rest}"),
        None if address.contains("://") => address.to_string(),
        None => format!("https://{address}"),
    }
}

/// An error and its sources, joined: tonic's own message is often only "transport error".
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tls").join(name)
    }

    #[test]
    fn the_test_certificates_load_and_bad_files_are_named() {
        let tls = Tls::load(&testdata("node.pem"), &testdata("node-key.pem"), &testdata("ca.pem")).unwrap();
        assert!(!format!("{tls:?}").contains("PRIVATE"), "the key is never printed");
        let missing = Tls::load(&testdata("absent.pem"), &testdata("node-key.pem"), &testdata("ca.pem")).unwrap_err();
        assert!(missing.to_string().starts_with("the certificate ") && missing.to_string().contains("absent.pem"));
        // A certificate where the key belongs.
        let swapped = Tls::load(&testdata("node.pem"), &testdata("node.pem"), &testdata("ca.pem")).unwrap_err();
        assert!(matches!(swapped, TlsError::NotPem { what: "the key", .. }), "{swapped}");
        // A key that is not the certificate's.
        let mismatched =
            Tls::load(&testdata("node.pem"), &testdata("stranger-key.pem"), &testdata("ca.pem")).unwrap_err();
        assert!(matches!(mismatched, TlsError::Server(_)), "{mismatched}");
    }

    #[test]
    fn addresses_take_the_https_scheme() {
        assert_eq!(https("http://127.0.0.1:7400"), "https://127.0.0.1:7400");
        assert_eq!(https("127.0.0.1:7400"), "https://127.0.0.1:7400");
        assert_eq!(https("https://localhost:1"), "https://localhost:1");
    }
}
