//! Wire codecs. Only HTTP/1.1 for now; HTTP/2 and L4 join here.

pub mod http1;
