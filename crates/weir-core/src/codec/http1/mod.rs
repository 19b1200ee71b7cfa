//! HTTP/1.1 codec: request and response heads, chunked bodies, head serialisation.

pub mod chunked;
pub mod header;
pub mod request;
pub mod response;
pub mod write;

pub use chunked::{ChunkError, ChunkedDecoder};
pub use header::{ConnectionOptions, HeaderKind, HeaderSpan};
pub use request::{fill_written, parse_request, BodyFraming, HeadLimits, RequestHead};
pub use response::{parse_response, ResponseHead};
