//! The access-log writer: one thread per log target, fed whole batches of lines.
//!
//! Workers never write to the file themselves: they hand a full buffer to the writer with
//! `try_send` on a bounded channel. When the writer falls behind the channel is full, the
//! batch is dropped and its lines are counted (`weir_access_log_dropped_total`), so a slow
//! disk can never stall request handling. `reopen()` (SIGUSR1) makes every writer reopen its
//! file before the next batch, for logrotate.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use weir_config::LogTarget;

/// Batches that may wait for the writer before new ones are dropped.
const QUEUE_BATCHES: usize = 32;

/// Bumped by every `reopen()`; each writer reopens when it differs from the value it last
/// saw. A generation, not a flag: with several log files, each writer must see the request
/// (a flag taken by the first writer left the other files written through the old inode).
static REOPEN: AtomicU64 = AtomicU64::new(0);

/// Asks every access-log writer to reopen its file (log rotation).
pub fn reopen() {
    REOPEN.fetch_add(1, Ordering::Release);
}

/// A batch of complete lines and how many lines it holds.
pub struct Batch {
    pub bytes: Vec<u8>,
    pub lines: u64,
}

/// The sending side of one log target, shared by all workers.
pub struct Sink {
    sender: SyncSender<Batch>,
    dropped: Arc<AtomicU64>,
}

impl Sink {
    /// Hands a batch to the writer, or drops and counts it if the writer is behind.
    pub fn send(&self, batch: Batch) {
        match self.sender.try_send(batch) {
            Ok(()) => {}
            Err(TrySendError::Full(b) | TrySendError::Disconnected(b)) => {
                self.dropped.fetch_add(b.lines, Ordering::Relaxed);
            }
        }
    }
}

/// A started writer thread; join it after the last sink is dropped.
pub struct WriterThread(JoinHandle<()>);

impl WriterThread {
    pub fn join(self) {
        let _ = self.0.join();
    }
}

/// Opens the target and starts its writer thread.
pub fn start(target: &LogTarget, dropped: Arc<AtomicU64>) -> io::Result<(Arc<Sink>, WriterThread)> {
    let out = Output::open(target)?;
    let (sender, receiver) = sync_channel(QUEUE_BATCHES);
    let thread = std::thread::Builder::new()
        .name("weir-access-log".into())
        .spawn(move || write_loop(out, receiver))?;
    Ok((Arc::new(Sink { sender, dropped }), WriterThread(thread)))
}

enum Output {
    Stdout,
    File { path: PathBuf, file: File },
}

impl Output {
    fn open(target: &LogTarget) -> io::Result<Output> {
        Ok(match target {
            LogTarget::Stdout => Output::Stdout,
            LogTarget::File(path) => Output::File {
                file: open_append(path)?,
                path: path.clone(),
            },
        })
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Output::Stdout => io::stdout().lock().write_all(bytes),
            Output::File { file, .. } => file.write_all(bytes),
        }
    }

    fn reopen(&mut self) {
        if let Output::File { path, file } = self {
            match open_append(path) {
                Ok(f) => *file = f,
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "cannot reopen access log")
                }
            }
        }
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

fn write_loop(mut out: Output, batches: Receiver<Batch>) {
    let mut last_error_logged = false;
    let mut opened_at = REOPEN.load(Ordering::Acquire);
    while let Ok(batch) = batches.recv() {
        let requested = REOPEN.load(Ordering::Acquire);
        if requested != opened_at {
            opened_at = requested;
            out.reopen();
        }
        match out.write(&batch.bytes) {
            Ok(()) => last_error_logged = false,
            Err(e) if !last_error_logged => {
                tracing::error!(error = %e, "access log write failed");
                last_error_logged = true;
            }
            Err(_) => {}
        }
    }
}
