//! How clients (the CLI, the node agent) reach the control plane: one
//! place that turns a URL and an optional CA certificate into an endpoint.
//!
//! `http://` is plaintext — what a loopback listener serves by default.
//! `https://` is TLS (rustls): the server's certificate must chain to
//! `ca_pem` when one is given (the `<data>/tls/ca.pem` a self-signing
//! `arbiter serve` writes), else to the system's trusted roots. A bare
//! `host:port` is read as `http://host:port`.

use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

/// What went wrong building an endpoint.
#[derive(Debug)]
pub enum EndpointError {
    /// The URL does not parse.
    Url(String),
    /// A CA certificate was given for a plaintext URL: a mistake worth saying.
    CaWithoutTls(String),
    /// The TLS configuration was refused.
    Tls(String),
}

impl std::fmt::Display for EndpointError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndpointError::Url(e) => write!(f, "bad server URL: {e}"),
            EndpointError::CaWithoutTls(url) => write!(
                f,
                "a CA certificate was given but `{url}` is plaintext; use https://"
            ),
            EndpointError::Tls(e) => write!(f, "TLS configuration: {e}"),
        }
    }
}

impl std::error::Error for EndpointError {}

/// The URL a client connects to: `server` as given, `http://` added to a bare address.
pub fn url(server: &str) -> String {
    if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    }
}

/// An endpoint for `server`, with TLS for `https://` (see the module docs).
pub fn endpoint(
    server: &str,
    ca_pem: Option<&[u8]>,
    connect_timeout: Duration,
) -> Result<Endpoint, EndpointError> {
    let url = url(server);
    let endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| EndpointError::Url(format!("`{url}`: {e}")))?
        .connect_timeout(connect_timeout);
    if !url.starts_with("https://") {
        return match ca_pem {
            Some(_) => Err(EndpointError::CaWithoutTls(url)),
            None => Ok(endpoint),
        };
    }
    let tls = match ca_pem {
        Some(pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
        None => ClientTlsConfig::new().with_native_roots(),
    };
    endpoint
        .tls_config(tls)
        .map_err(|e| EndpointError::Tls(e.to_string()))
}

/// An error's causes on one line, each said once. tonic's transport errors
/// repeat their source in their own message (`tcp connect error: tcp
/// connect error: Connection refused`); a cause already said is not
/// repeated. The CLI's last line and the node agent's link warnings use it.
pub fn cause_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(cause) = next {
        let text = cause.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = cause.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_tls_and_mistakes() {
        let t = Duration::from_secs(1);
        assert_eq!(url("127.0.0.1:7070"), "http://127.0.0.1:7070");
        assert!(endpoint("127.0.0.1:7070", None, t).is_ok());
        assert!(endpoint("https://localhost:7070", None, t).is_ok());
        assert!(matches!(
            endpoint("http://localhost:7070", Some(b"pem"), t),
            Err(EndpointError::CaWithoutTls(_))
        ));
        assert!(matches!(
            endpoint("http://exa mple:1", None, t),
            Err(EndpointError::Url(_))
        ));
    }

    /// tonic's shape: a wrapper whose message repeats its source's, under a
    /// context of our own.
    #[test]
    fn a_cause_repeated_by_its_wrapper_is_said_once() {
        #[derive(Debug)]
        struct Layer(&'static str, Option<Box<Layer>>);
        impl std::fmt::Display for Layer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for Layer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1
                    .as_deref()
                    .map(|l| l as &(dyn std::error::Error + 'static))
            }
        }
        let inner = Layer("tcp connect error", None);
        let outer = Layer("tcp connect error", Some(Box::new(inner)));
        let refused = Layer("Connection refused", None);
        let e = Layer(
            "connecting to http://127.0.0.1:1",
            Some(Box::new(Layer("transport error", Some(Box::new(outer))))),
        );
        assert_eq!(
            cause_line(&e),
            "connecting to http://127.0.0.1:1: transport error: tcp connect error"
        );
        assert_eq!(cause_line(&refused), "Connection refused");
    }
}
