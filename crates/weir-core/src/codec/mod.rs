//! Wire codecs: HTTP/1.1, the PROXY protocol header of L4 and HTTP connections, and the
//! TLS ClientHello's server name (SNI routing on TCP listeners).

pub mod http1;
pub mod proxy_protocol;
pub mod tls_client_hello;
