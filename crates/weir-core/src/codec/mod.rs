//! Wire codecs: HTTP/1.1 and the PROXY protocol header of L4 and HTTP connections.

pub mod http1;
pub mod proxy_protocol;
