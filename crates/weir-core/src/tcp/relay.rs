//! The two-way relay of a TCP (L4) connection: client -> server and server -> client run
//! concurrently in one task, each moving bytes either through a user-space buffer or, on
//! Linux, with splice(2) through a pipe (zero-copy).
//!
//! Choice per direction (`splice = "auto"`): small exchanges (request/response traffic)
//! copy through the buffer: one `recv` plus one `send`, the same system calls splice
//! would need, without the pipe. A direction whose reads fill the whole buffer a few times
//! in a row is a bulk transfer and switches to splice for good. `"on"` splices from the
//! start, `"off"` never does. If splice turns out impossible on a socket (EINVAL), that
//! direction copies.
//!
//! End of stream on one side shuts down writing on the other (half-close) and the other
//! direction goes on; an error on either side ends both. No byte moving either way for
//! `idle_timeout` (`fin_timeout` once one side half-closed) closes both sides (`idle`);
//! reads, writes and splice drains all count as moving.

use std::io;
use std::os::fd::AsFd;

use tokio::io::Interest;
use tokio::net::TcpStream;
use weir_config::SpliceMode;

use super::io::{read_some, retry_eintr, shutdown_write, write_all};
use crate::buffer::Buffer;
pub use crate::idle::End;
use crate::idle::{self, Activity, Limits};
use crate::metrics::shard::Counter;
use crate::sys::{splice_unsupported, unsent_total, Pipe};
use crate::worker::Worker;

/// Consecutive full-buffer reads after which an `auto` direction switches to splice.
const FULL_READS_TO_SPLICE: u8 = 4;
/// Most bytes asked of one splice into the pipe (the default pipe holds 64 KiB).
const SPLICE_CHUNK: usize = 1 << 20;

/// What the relay needs besides the two sockets.
pub struct RelayConfig<'a> {
    /// `idle_timeout` and `fin_timeout`.
    pub limits: Limits,
    pub splice: SpliceMode,
    /// False when the kernel cannot splice at all (probed once at start).
    pub splice_available: bool,
    pub bytes_in: &'a Counter,
    pub bytes_out: &'a Counter,
}

/// Relays until both directions end, one fails, or the connection is still too long.
/// `to_server` already holds client bytes to send first (after a PROXY header).
pub async fn relay(
    worker: &Worker,
    client: &TcpStream,
    server: &TcpStream,
    to_server: Buffer,
    config: &RelayConfig<'_>,
) -> End {
    let activity = Activity::new();
    let size = to_server.capacity();
    let mode = match config.splice {
        SpliceMode::Never => Mode::Copy,
        _ if !config.splice_available => Mode::Copy,
        SpliceMode::Auto => Mode::Copy,
        SpliceMode::Always => Mode::Splice,
    };
    let auto = config.splice == SpliceMode::Auto && config.splice_available;
    let mut up = Direction::new(
        client,
        server,
        to_server,
        mode,
        auto,
        &activity,
        config.bytes_in,
    );
    let back = worker.take_buffer_sized(size);
    let mut down = Direction::new(
        server,
        client,
        back,
        mode,
        auto,
        &activity,
        config.bytes_out,
    );
    let sockets = [Some(client.as_fd()), Some(server.as_fd())];
    let probe = || unsent_total(&sockets);
    let both = idle::both_probed(
        up.run(worker),
        down.run(worker),
        &activity,
        config.limits,
        probe,
    );
    let end = End::from(both.await);
    up.finish(worker);
    down.finish(worker);
    end
}

/// Splices what `from` has into the empty `pipe`; 0 at end of stream.
async fn fill(from: &TcpStream, pipe: &Pipe) -> io::Result<usize> {
    loop {
        let r = from.try_io(Interest::READABLE, || {
            retry_eintr(|| pipe.fill_from(from.as_fd(), SPLICE_CHUNK))
        });
        match r {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => from.readable().await?,
            other => return other,
        }
    }
}

/// Splices up to `len` bytes from `pipe` to `to`; at least one.
async fn drain(to: &TcpStream, pipe: &Pipe, len: usize) -> io::Result<usize> {
    loop {
        let r = to.try_io(Interest::WRITABLE, || {
            retry_eintr(|| pipe.drain_to(to.as_fd(), len))
        });
        match r {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => to.writable().await?,
            other => return other,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Copy,
    Splice,
}

/// One direction: bytes read from `from` are written to `to`.
struct Direction<'a> {
    from: &'a TcpStream,
    to: &'a TcpStream,
    buf: Option<Buffer>,
    pipe: Option<Pipe>,
    /// Bytes sitting in the pipe.
    in_pipe: usize,
    mode: Mode,
    auto: bool,
    full_reads: u8,
    activity: &'a Activity,
    moved: &'a Counter,
}

impl<'a> Direction<'a> {
    fn new(
        from: &'a TcpStream,
        to: &'a TcpStream,
        buf: Buffer,
        mode: Mode,
        auto: bool,
        activity: &'a Activity,
        moved: &'a Counter,
    ) -> Direction<'a> {
        Direction {
            from,
            to,
            buf: Some(buf),
            pipe: None,
            in_pipe: 0,
            mode,
            auto,
            full_reads: 0,
            activity,
            moved,
        }
    }

    async fn run(&mut self, worker: &Worker) -> io::Result<()> {
        loop {
            let more = match self.mode {
                Mode::Copy => self.copy_once().await?,
                Mode::Splice => self.splice_once(worker).await?,
            };
            if !more {
                shutdown_write(self.to);
                return Ok(());
            }
        }
    }

    /// Flushes what is buffered, then reads once. False at end of stream.
    async fn copy_once(&mut self) -> io::Result<bool> {
        let Some(buf) = self.buf.as_mut() else {
            return Err(io::ErrorKind::Other.into());
        };
        write_all(self.to, buf, self.activity).await?;
        if self.full_reads >= FULL_READS_TO_SPLICE {
            self.mode = Mode::Splice;
            return Ok(true);
        }
        let n = read_some(self.from, buf).await?;
        if n == 0 {
            return Ok(false);
        }
        let full = n == buf.capacity();
        self.transferred(n);
        if self.auto && full {
            self.full_reads += 1;
        } else {
            self.full_reads = 0;
        }
        Ok(true)
    }

    /// Splices one pipeful in and out. False at end of stream. Falls back to copying when
    /// splice is impossible here.
    async fn splice_once(&mut self, worker: &Worker) -> io::Result<bool> {
        // Bytes already buffered (after a PROXY header) go first.
        if let Some(buf) = self.buf.as_mut().filter(|b| !b.is_empty()) {
            write_all(self.to, buf, self.activity).await?;
        }
        if self.pipe.is_none() {
            match worker.take_pipe() {
                Ok(pipe) => self.pipe = Some(pipe),
                Err(e) => return self.fall_back(&e),
            }
        }
        // The pipe stays in `self` across the awaits: if the relay ends meanwhile (idle,
        // the other direction failed), `finish` still sees it and how full it is.
        let Some(pipe) = self.pipe.as_ref() else {
            return Ok(true);
        };
        if self.in_pipe == 0 {
            let n = match fill(self.from, pipe).await {
                Ok(n) => n,
                Err(e) if splice_unsupported(&e) => return self.fall_back(&e),
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Ok(false);
            }
            self.in_pipe = n;
            self.transferred(n);
        }
        while self.in_pipe > 0 {
            let n = drain(self.to, pipe, self.in_pipe).await?;
            self.in_pipe -= n.min(self.in_pipe);
            // A drain to a slow reader is progress too.
            self.activity.touch();
        }
        Ok(true)
    }

    /// Switches to copying after splice failed with `e` (before any byte entered the pipe).
    fn fall_back(&mut self, e: &io::Error) -> io::Result<bool> {
        tracing::debug!(error = %e, "splice not possible on this connection; copying");
        self.mode = Mode::Copy;
        self.auto = false;
        self.full_reads = 0;
        Ok(true)
    }

    fn transferred(&self, n: usize) {
        self.moved.add(n as u64);
        self.activity.touch();
    }

    /// Returns the buffer and an empty pipe to the worker for reuse.
    fn finish(&mut self, worker: &Worker) {
        if let Some(buf) = self.buf.take() {
            worker.give_buffer(buf);
        }
        if let Some(pipe) = self.pipe.take().filter(|_| self.in_pipe == 0) {
            worker.give_pipe(pipe);
        }
    }
}
