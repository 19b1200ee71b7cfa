//! `AsyncRead` / `AsyncWrite` for enums of streams (plain or TLS, whole or split halves):
//! each method forwards to the variant's own. Used by `client_stream` and
//! `connector::stream`, so the two stay one implementation.

/// `AsyncRead` for an enum whose variants all implement it.
macro_rules! forward_read {
    ($ty:ty, $($variant:ident),+) => {
        impl ::tokio::io::AsyncRead for $ty {
            #[inline]
            fn poll_read(
                self: ::std::pin::Pin<&mut Self>,
                cx: &mut ::std::task::Context<'_>,
                buf: &mut ::tokio::io::ReadBuf<'_>,
            ) -> ::std::task::Poll<::std::io::Result<()>> {
                match self.get_mut() {
                    $(Self::$variant(s) => ::std::pin::Pin::new(s).poll_read(cx, buf),)+
                }
            }
        }
    };
}

/// `AsyncWrite` (vectored writes included) for an enum whose variants all implement it.
macro_rules! forward_write {
    ($ty:ty, $($variant:ident),+) => {
        impl ::tokio::io::AsyncWrite for $ty {
            #[inline]
            fn poll_write(
                self: ::std::pin::Pin<&mut Self>,
                cx: &mut ::std::task::Context<'_>,
                buf: &[u8],
            ) -> ::std::task::Poll<::std::io::Result<usize>> {
                match self.get_mut() {
                    $(Self::$variant(s) => ::std::pin::Pin::new(s).poll_write(cx, buf),)+
                }
            }

            #[inline]
            fn poll_write_vectored(
                self: ::std::pin::Pin<&mut Self>,
                cx: &mut ::std::task::Context<'_>,
                bufs: &[::std::io::IoSlice<'_>],
            ) -> ::std::task::Poll<::std::io::Result<usize>> {
                match self.get_mut() {
                    $(Self::$variant(s) => ::std::pin::Pin::new(s).poll_write_vectored(cx, bufs),)+
                }
            }

            #[inline]
            fn is_write_vectored(&self) -> bool {
                match self {
                    $(Self::$variant(s) => s.is_write_vectored(),)+
                }
            }

            fn poll_flush(self: ::std::pin::Pin<&mut Self>, cx: &mut ::std::task::Context<'_>) -> ::std::task::Poll<::std::io::Result<()>> {
                match self.get_mut() {
                    $(Self::$variant(s) => ::std::pin::Pin::new(s).poll_flush(cx),)+
                }
            }

            fn poll_shutdown(self: ::std::pin::Pin<&mut Self>, cx: &mut ::std::task::Context<'_>) -> ::std::task::Poll<::std::io::Result<()>> {
                match self.get_mut() {
                    $(Self::$variant(s) => ::std::pin::Pin::new(s).poll_shutdown(cx),)+
                }
            }
        }
    };
}
