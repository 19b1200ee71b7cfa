//! Access logs: per-worker line buffers handed in batches to a writer thread per target.
//!
//! A worker formats each line into its own buffer (no lock, no syscall) and passes the
//! buffer to the writer when it is large enough, or when the worker's periodic flush runs,
//! so a line waits at most `FLUSH_INTERVAL`.

mod line;
pub mod time;
mod writer;

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

pub use line::{Outcome, RequestFields};
use weir_config::AccessLogFormat;
pub use writer::{reopen, start, Sink, WriterThread};

/// A worker flushes its log buffers at least this often.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(200);
/// A buffer is handed to the writer once it holds this much.
const BATCH_BYTES: usize = 256 * 1024;

/// One worker's buffer for one listener's access log.
pub struct LogBuffer {
    format: AccessLogFormat,
    sink: Arc<Sink>,
    state: RefCell<BufferState>,
}

#[derive(Default)]
struct BufferState {
    bytes: Vec<u8>,
    lines: u64,
    time: time::TimeCache,
}

impl LogBuffer {
    pub fn new(format: AccessLogFormat, sink: Arc<Sink>) -> LogBuffer {
        LogBuffer {
            format,
            sink,
            state: RefCell::default(),
        }
    }

    /// Formats one line; hands the buffer over when it is full enough.
    pub fn log(&self, req: &RequestFields, outcome: &Outcome<'_>) {
        let mut state = self.state.borrow_mut();
        let BufferState { bytes, lines, time } = &mut *state;
        line::push_line(bytes, self.format, req, outcome, time);
        *lines += 1;
        if bytes.len() >= BATCH_BYTES {
            self.hand_over(&mut state);
        }
    }

    /// Hands whatever is buffered to the writer.
    pub fn flush(&self) {
        let mut state = self.state.borrow_mut();
        if state.lines > 0 {
            self.hand_over(&mut state);
        }
    }

    fn hand_over(&self, state: &mut BufferState) {
        let bytes = std::mem::replace(&mut state.bytes, Vec::with_capacity(BATCH_BYTES + 1024));
        let lines = std::mem::take(&mut state.lines);
        self.sink.send(writer::Batch { bytes, lines });
    }
}

/// Each listener's log format and sink (`None`: logging off), sharing one writer per target.
pub type ListenerSinks = Vec<Option<(AccessLogFormat, Arc<Sink>)>>;

/// An access log that cannot be opened: listener `index`'s `access_log.path`.
#[derive(Debug, thiserror::Error)]
#[error("listener {listener:?}: cannot open the access log {}: {error}", path.display())]
pub struct OpenError {
    pub index: usize,
    pub listener: String,
    pub path: std::path::PathBuf,
    pub error: std::io::Error,
}

impl OpenError {
    pub fn fix(&self) -> String {
        let dir = self.path.parent().unwrap_or(std::path::Path::new("/"));
        match self.error.kind() {
            std::io::ErrorKind::NotFound => format!("create the directory {}", dir.display()),
            std::io::ErrorKind::PermissionDenied => format!(
                "make {} writable by the user weir runs as (or the file, if it exists)",
                dir.display()
            ),
            _ => "give a path where weir can create and append to a file, or \"stdout\"".into(),
        }
    }
}

/// Starts one writer per distinct log target of `config`.
pub fn start_all(
    config: &weir_config::Config,
    dropped: &Arc<std::sync::atomic::AtomicU64>,
) -> Result<(ListenerSinks, Vec<WriterThread>), OpenError> {
    let mut started: Vec<(weir_config::LogTarget, Arc<Sink>)> = Vec::new();
    let mut threads = Vec::new();
    let mut sinks = Vec::new();
    for (index, listener) in config.listeners.iter().enumerate() {
        let Some(log) = &listener.access_log else {
            sinks.push(None);
            continue;
        };
        let sink = match started.iter().find(|(t, _)| *t == log.target) {
            Some((_, sink)) => sink.clone(),
            None => {
                let (sink, thread) =
                    start(&log.target, dropped.clone()).map_err(|error| OpenError {
                        index,
                        listener: listener.name.clone(),
                        path: match &log.target {
                            weir_config::LogTarget::File(p) => p.clone(),
                            weir_config::LogTarget::Stdout => "stdout".into(),
                        },
                        error,
                    })?;
                started.push((log.target.clone(), sink.clone()));
                threads.push(thread);
                sink
            }
        };
        sinks.push(Some((log.format, sink)));
    }
    Ok((sinks, threads))
}
