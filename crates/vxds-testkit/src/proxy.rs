//! A TCP proxy a test can stop and resume: a database that goes away and comes back, without
//! touching the shared Postgres server. Stopped, it refuses connections and has closed every
//! one it carried, as a stopped database server does.

use std::net::SocketAddr;
use std::sync::Mutex;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

#[derive(Debug)]
pub struct TcpProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    target: SocketAddr,
    running: Mutex<Option<JoinHandle<()>>>,
}

impl TcpProxy {
    /// A proxy to `target` on a fresh loopback port, running.
    pub async fn start(target: SocketAddr) -> std::io::Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let proxy = TcpProxy {
            addr: listener.local_addr()?,
            target,
            running: Mutex::new(None),
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

    /// Accepts again, on the same port.
    pub async fn resume(&self) -> std::io::Result<()> {
        self.stop();
        // Tokio binds with SO_REUSEADDR: the port is free again at once.
        let listener = TcpListener::bind(self.addr).await?;
        self.run(listener);
        Ok(())
    }

    fn run(&self, listener: TcpListener) {
        let target = self.target;
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                connections.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
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
