//! TLS client settings shared by the network backends (FTPS, PostgreSQL, etcd, S3): rustls with
//! ring, the server's certificate chain verified against the profile's `ca_file` or else the
//! system's CA bundle. Nothing here ever turns verification off; the one relaxation is
//! PostgreSQL's `verify-ca`/`require`, which verify the chain but not the host name.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::error::{Result, err, shown};
use crate::files;
use rustls::pki_types::pem::PemObject;

/// Well-known locations of the system's CA bundle (as OpenSSL's probe looks for them).
const CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
];

/// Appended to a failed handshake's message when no `ca_file` was given.
pub fn hint(ca_file: Option<&Path>) -> &'static str {
    if ca_file.is_none() {
        " (certificates are verified against the system CAs; a private CA needs `ca_file`)"
    } else {
        ""
    }
}

/// The PEM file to trust and how to name it in errors: `ca_file`, else `$SSL_CERT_FILE`,
/// else the first system bundle that exists.
fn source(ca_file: Option<&Path>) -> Result<(PathBuf, &'static str)> {
    if let Some(f) = ca_file {
        return Ok((f.to_path_buf(), "ca_file"));
    }
    let from_env = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
    let found = from_env.or_else(|| CA_BUNDLES.iter().map(PathBuf::from).find(|p| p.exists()));
    match found {
        Some(f) => Ok((f, "system CA bundle")),
        None => Err(err!(
            Config,
            "no system CA bundle found (tried $SSL_CERT_FILE, {}); give `ca_file`",
            CA_BUNDLES.join(", ")
        )),
    }
}

/// The trusted certificates; a file that cannot be read or holds none is a config error.
pub fn roots(ca_file: Option<&Path>) -> Result<(RootCertStore, PathBuf)> {
    read_roots(ca_file).map(|(roots, file, _)| (roots, file))
}

/// [`roots`] and the PEM text they came from. The file is opened without blocking, must be a
/// regular file and is read at most [`files::CONFIG_CAP`] (issue 15: `ca_file = "/dev/zero"`).
fn read_roots(ca_file: Option<&Path>) -> Result<(RootCertStore, PathBuf, Vec<u8>)> {
    let (file, what) = source(ca_file)?;
    let pem = files::read_regular(&file, what, files::CONFIG_CAP)?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| err!(Config, "cannot read {what} {}: {e}", shown(&file)))?;
        roots
            .add(cert)
            .map_err(|e| err!(Config, "{what} {}: unusable certificate: {e}", shown(&file)))?;
    }
    if roots.is_empty() {
        return Err(err!(
            Config,
            "{what} {} holds no certificates",
            shown(&file)
        ));
    }
    Ok((roots, file, pem))
}

/// A client configuration that verifies the server's chain against `roots`, and its name
/// too when `check_name` (always, but for PostgreSQL's `require` and `verify-ca`).
pub fn client_config(ca_file: Option<&Path>, check_name: bool) -> Result<rustls::ClientConfig> {
    let (roots, _) = roots(ca_file)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| err!(Config, "TLS setup: {e}"))?;
    let config = if check_name {
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| err!(Config, "TLS setup: {e}"))?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyName(inner)))
            .with_no_client_auth()
    };
    Ok(config)
}

/// The trusted certificates as PEM text, for clients that take PEM (tonic, for etcd); the
/// file is checked with [`roots`] first so that a bad one fails here, clearly.
pub fn ca_pem(ca_file: Option<&Path>) -> Result<Vec<u8>> {
    read_roots(ca_file).map(|(_, _, pem)| pem)
}

/// Verifies the chain exactly as rustls does, then accepts a certificate issued for another
/// name: webpki checks the chain before the name, so a name error means the chain was good.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
