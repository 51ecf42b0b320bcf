//! `agenthost-http`: the HTTP pieces every client of agenthost shares, the provider clients
//! (`agenthost-llm`) and the API client (`agenthost-api`) alike.
//!
//! **Owns**: the incremental server-sent-events decoder ([`sse::Decoder`]),
//! [`client_builder`] (and, with the `blocking` feature, `blocking_client_builder`), where every
//! reqwest client of agenthost starts, and [`describe`], how their errors are told.
//!
//! **Must not**: depend on any other agenthost crate, or set process-wide state (no global
//! crypto provider, no global client).

pub mod sse;

use std::sync::Arc;

/// A reqwest client builder whose TLS uses ring and the system's trust store, given to this
/// client only: nothing process-wide is installed, so an embedder's own choice of crypto provider
/// stands (reqwest is built without a bundled provider; see the workspace manifest). Every HTTP
/// client of agenthost starts here.
pub fn client_builder() -> Result<reqwest::ClientBuilder, String> {
    Ok(reqwest::Client::builder().tls_backend_preconfigured(tls()?))
}

/// An HTTP client's error with its causes, which hold the useful part ("connection refused")
/// and which reqwest's and hyper's `Display` leave out.
pub fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// [`client_builder`] for a blocking client, with the same TLS.
#[cfg(feature = "blocking")]
pub fn blocking_client_builder() -> Result<reqwest::blocking::ClientBuilder, String> {
    Ok(reqwest::blocking::Client::builder().tls_backend_preconfigured(tls()?))
}

/// TLS with ring and the system's trust store, for one client.
fn tls() -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls_platform_verifier::Verifier::new(provider.clone())
        .map_err(|e| format!("cannot load the system's TLS trust store: {e}"))?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot configure TLS: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tls)
}

#[cfg(test)]
mod tests {
    /// Building a client sets no process-wide state: an embedder's choice of rustls crypto
    /// provider, or its absence, stands.
    #[test]
    fn clients_install_no_process_wide_crypto_provider() {
        let client = super::client_builder()
            .expect("a builder")
            .build()
            .expect("a client");
        drop(client);
        assert!(
            rustls::crypto::CryptoProvider::get_default().is_none(),
            "a library installed a process-wide crypto provider"
        );
    }
}
