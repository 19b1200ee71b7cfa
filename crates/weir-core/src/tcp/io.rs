//! Readiness-driven reads and writes on a shared `&TcpStream`, so the two directions of a
//! relay can use one socket at once without splitting it.
//!
//! A read that returns fewer bytes than asked for drained the socket's receive queue, so
//! the read readiness is cleared right away (as tokio's own `poll_read` does on Linux):
//! the next read waits for epoll instead of costing an `EAGAIN` system call. That keeps a
//! request/response exchange at one `recv` and one `send` per direction.

use std::io::{self, Read, Write};

use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::buffer::Buffer;
use crate::idle::Activity;

/// Reads once into `buf`'s free space, waiting for readiness. `Ok(0)`: end of stream (or
/// a full buffer).
pub async fn read_some(stream: &TcpStream, buf: &mut Buffer) -> io::Result<usize> {
    loop {
        let spare = buf.spare_mut();
        if spare.is_empty() {
            return Ok(0);
        }
        let want = spare.len();
        let mut got = 0;
        let result = stream.try_io(Interest::READABLE, || {
            let n = retry_eintr(|| (&*SockRef::from(stream)).read(spare))?;
            got = n;
            if n > 0 && n < want {
                // Drained: report WouldBlock so tokio clears the readiness; `got` has n.
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        match result {
            Ok(n) => {
                buf.commit(n);
                return Ok(n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if got > 0 {
                    buf.commit(got);
                    return Ok(got);
                }
                stream.readable().await?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Writes all of `buf`'s filled bytes, consuming them, waiting for readiness as needed.
/// Each write that moved bytes is noted in `activity` (a slow reader is progress).
pub async fn write_all(
    stream: &TcpStream,
    buf: &mut Buffer,
    activity: &Activity,
) -> io::Result<()> {
    while !buf.is_empty() {
        let n = write_some(stream, buf.filled()).await?;
        buf.consume(n);
        activity.touch();
    }
    Ok(())
}

/// Writes all of `bytes`.
pub async fn write_bytes(stream: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        let n = write_some(stream, bytes).await?;
        bytes = &bytes[n.min(bytes.len())..];
    }
    Ok(())
}

/// Writes some of `bytes` (at least one byte unless `bytes` is empty).
pub async fn write_some(stream: &TcpStream, bytes: &[u8]) -> io::Result<usize> {
    loop {
        let result = stream.try_io(Interest::WRITABLE, || {
            retry_eintr(|| (&*SockRef::from(stream)).write(bytes))
        });
        match result {
            Ok(0) if !bytes.is_empty() => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => stream.writable().await?,
            Err(e) => return Err(e),
        }
    }
}

/// Repeats a system call interrupted by a signal.
pub fn retry_eintr<T>(mut call: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match call() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Shuts down the writing side of `stream` (the peer reads EOF); errors mean the peer is
/// gone already, which the other direction will notice.
pub fn shutdown_write(stream: &TcpStream) {
    let _ = SockRef::from(stream).shutdown(std::net::Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    /// A short read clears the readiness; data arriving later must still wake the reader.
    #[tokio::test]
    async fn short_reads_do_not_lose_later_data() {
        let (mut c, s) = pair().await;
        let mut buf = Buffer::new(64);
        for round in 0..50u8 {
            c.write_all(&[round; 3]).await.unwrap();
            let n = read_some(&s, &mut buf).await.unwrap();
            assert_eq!(buf.filled(), &[round; 3][..n]);
            buf.consume(n);
            if n < 3 {
                while buf.len() < 3 - n {
                    read_some(&s, &mut buf).await.unwrap();
                }
                buf.clear();
            }
        }
        drop(c);
        assert_eq!(read_some(&s, &mut buf).await.unwrap(), 0, "end of stream");
    }

    #[tokio::test]
    async fn writes_everything_and_reads_it_back() {
        let (c, s) = pair().await;
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let reader = async {
            let mut got = Vec::new();
            let mut buf = Buffer::new(4096);
            while got.len() < data.len() {
                let n = read_some(&s, &mut buf).await.unwrap();
                assert!(n > 0);
                got.extend_from_slice(buf.filled());
                buf.clear();
            }
            got
        };
        let (written, got) = tokio::join!(write_bytes(&c, &data), reader);
        written.unwrap();
        assert_eq!(got, data);
    }
}
