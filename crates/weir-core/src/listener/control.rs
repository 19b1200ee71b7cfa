//! The worker side of listener changes: the control plane sends each worker the sockets of
//! new listeners and the ids of listeners to stop, over a channel this task reads. Start-up
//! goes through the same path, so there is one way a listener begins and ends.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use tokio::sync::{mpsc, Notify};

use super::cap::ListenerCap;
use super::BindSlot;
use crate::worker::Worker;

/// What the control plane asks of a worker.
#[derive(Debug)]
pub enum Command {
    /// Accept on `socket` for the listener with metric slot `slot`; `id` names this socket
    /// generation (a rebind gets a new id under the same slot).
    Listen {
        id: u64,
        bind: BindSlot,
        socket: std::net::TcpListener,
        cap: ListenerCap,
        /// The UDP socket of the same address for HTTP/3 (a TLS bind of a listener with
        /// `http3` on): served by this worker's QUIC endpoint.
        quic: Option<std::net::UdpSocket>,
    },
    /// Stop accepting on the sockets of `id` and close them; open connections finish.
    Stop { id: u64 },
}

/// Tells one accept loop to end.
#[derive(Debug, Default)]
pub struct StopSignal {
    stopped: Cell<bool>,
    notify: Notify,
}

impl StopSignal {
    pub fn stop(&self) {
        self.stopped.set(true);
        self.notify.notify_waiters();
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.get()
    }

    /// Resolves once `stop` was called (immediately if it was).
    pub async fn stopped(&self) {
        let notified = self.notify.notified();
        if self.stopped.get() {
            return;
        }
        notified.await;
    }
}

/// Runs a worker's listener commands until the control plane goes away.
pub async fn control_loop(worker: Rc<Worker>, mut commands: mpsc::UnboundedReceiver<Command>) {
    let running: RefCell<HashMap<u64, Rc<StopSignal>>> = RefCell::default();
    while let Some(command) = commands.recv().await {
        match command {
            Command::Listen {
                id,
                bind,
                socket,
                cap,
                quic,
            } => match crate::sys::register_listener(mio::net::TcpListener::from_std(socket)) {
                Ok(listener) => {
                    let stop = Rc::new(StopSignal::default());
                    running.borrow_mut().insert(id, stop.clone());
                    if let Some(udp) = quic {
                        let (cap, stop) = (cap.clone(), stop.clone());
                        crate::http3::spawn(worker.clone(), bind.slot, udp, cap, stop);
                    }
                    let accept = super::accept_loop(worker.clone(), bind, listener, cap, stop);
                    tokio::task::spawn_local(accept);
                }
                Err(e) => tracing::error!(error = %e, "cannot register listener"),
            },
            Command::Stop { id } => {
                if let Some(stop) = running.borrow_mut().remove(&id) {
                    stop.stop();
                }
            }
        }
    }
}
