//! A test server's thread: a listener on `127.0.0.1:0` served by an accept loop on its own
//! current-thread runtime, stopped (and the thread joined) when dropped.

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub(crate) struct ServerThread {
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerThread {
    /// Binds, then runs `serve(listener)` on a new thread until dropped.
    pub fn spawn<F, Fut>(serve: F) -> ServerThread
    where
        F: FnOnce(TcpListener) -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("testkit: bind");
        std_listener
            .set_nonblocking(true)
            .expect("testkit: nonblocking");
        let addr = std_listener.local_addr().expect("testkit: addr");
        let (tx, rx) = oneshot::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("testkit: runtime");
            runtime.block_on(async move {
                let listener = TcpListener::from_std(std_listener).expect("testkit: listener");
                tokio::select! {
                    _ = rx => {}
                    _ = serve(listener) => {}
                }
            });
        });
        ServerThread {
            addr,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            // A panic on the server thread is not re-raised from drop.
            let _ = thread.join();
        }
    }
}
