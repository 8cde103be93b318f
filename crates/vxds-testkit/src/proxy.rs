//! A TCP proxy a test can stop and resume: a database that goes away and comes back, without
//! touching the shared Postgres server. Stopped, it refuses connections and has closed every
//! one it carried, as a stopped database server does. Frozen, it forwards nothing more but
//! closes nothing either: a peer whose host vanished without a FIN.

use std::net::SocketAddr;
use std::sync::Mutex;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

#[derive(Debug)]
pub struct TcpProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    target: Mutex<SocketAddr>,
    running: Mutex<Option<JoinHandle<()>>>,
    frozen: tokio::sync::watch::Sender<bool>,
}

impl TcpProxy {
    /// A proxy to `target` on a fresh loopback port, running.
    pub async fn start(target: SocketAddr) -> std::io::Result<TcpProxy> {
        // Not an ephemeral port: once stopped, a connection to it must be refused, and an
        // ephemeral one could meanwhile go to another listener or connect to itself.
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", crate::ports::free_port())).await {
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                bound => break bound?,
            }
        };
        let proxy = TcpProxy {
            addr: listener.local_addr()?,
            target: Mutex::new(target),
            running: Mutex::new(None),
            frozen: tokio::sync::watch::channel(false).0,
        };
        proxy.run(listener);
        Ok(proxy)
    }

    /// A database URL (`scheme://[user@]host:port/...`) pointed at this proxy.
    pub fn url_for(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
        let (credentials, after) = match rest.split_once('@') {
            Some((c, a)) => (format!("{c}@"), a),
            None => (String::new(), rest),
        };
        let path = after.find(['/', '?']).map_or("", |i| &after[i..]);
        format!("{scheme}://{credentials}{}{path}", self.addr)
    }

    /// Closes every carried connection and refuses new ones.
    pub fn stop(&self) {
        if let Some(task) = self.running.lock().expect("not poisoned").take() {
            // Dropping the task's JoinSet aborts every connection's task: their sockets close.
            task.abort();
        }
    }

    /// Forwards nothing more, in either direction, and keeps every connection open: both ends
    /// hear nothing, not even a FIN.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Accepts again, on the same port, forwarding to `target` from now on: a database
    /// address re-pointed at another server (a failover).
    pub async fn resume_to(&self, target: SocketAddr) -> std::io::Result<()> {
        *self.target.lock().expect("not poisoned") = target;
        self.resume().await
    }

    /// Accepts again, on the same port.
    pub async fn resume(&self) -> std::io::Result<()> {
        self.stop();
        // Tokio binds with SO_REUSEADDR: the port is free again at once.
        let listener = TcpListener::bind(self.addr).await?;
        self.run(listener);
        Ok(())
    }

    fn run(&self, listener: TcpListener) {
        let target = *self.target.lock().expect("not poisoned");
        self.frozen.send_replace(false);
        let frozen = self.frozen.subscribe();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut frozen = frozen.clone();
                connections.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            () = async { let _ = frozen.wait_for(|f| *f).await; } => {
                                // Hold both sockets open, silent, until stopped.
                                std::future::pending::<()>().await;
                            }
                        }
                    }
                });
                // Reap finished connections as we go.
                while connections.try_join_next().is_some() {}
            }
        });
        *self.running.lock().expect("not poisoned") = Some(task);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stop();
    }
}
