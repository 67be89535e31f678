//! The HTTPS client the mocks' own tests use: trusts the test CA, speaks
//! the HTTP versions asked for.

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::pki::TestPki;

pub type TestClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The HTTP versions a client offers by ALPN.
#[derive(Clone, Copy, Debug)]
pub enum Versions {
    Http1,
    Http2,
    Any,
}

pub fn client(pki: &TestPki, versions: Versions) -> TestClient {
    let mut tls = (*pki.client_config()).clone();
    tls.alpn_protocols.clear(); // hyper-rustls sets ALPN from the enabled versions
    let builder = HttpsConnectorBuilder::new().with_tls_config(tls).https_only();
    let connector = match versions {
        Versions::Http1 => builder.enable_http1().build(),
        Versions::Http2 => builder.enable_http2().build(),
        Versions::Any => builder.enable_all_versions().build(),
    };
    Client::builder(TokioExecutor::new()).http2_only(matches!(versions, Versions::Http2)).build(connector)
}
