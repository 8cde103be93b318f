//! A TCP proxy a test can stop and resume: a database that goes away and comes back, without
//! touching the shared Postgres server. Stopped, it refuses connections and has closed every
//! one it carried, as a stopped database server does. Frozen, it forwards nothing more but
//! closes nothing either: a peer whose host vanished without a FIN. Paused, it holds what
//! both sides send until it is unpaused, then delivers it: a network that stalls and recovers.

use std::net::SocketAddr;
use std::sync::Mutex;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

#[derive(Debug)]
pub struct TcpProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    target: Mutex<SocketAddr>,
    running: Mutex<Option<JoinHandle<()>>>,
    frozen: watch::Sender<bool>,
    paused: watch::Sender<bool>,
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
            frozen: watch::channel(false).0,
            paused: watch::channel(false).0,
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

    /// Holds what either side sends, closing nothing, until [`Self::unpause`].
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Delivers what was held and forwards again.
    pub fn unpause(&self) {
        self.paused.send_replace(false);
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
        self.paused.send_replace(false);
        let frozen = self.frozen.subscribe();
        let paused = self.paused.subscribe();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((inbound, _)) = listener.accept().await {
                let mut frozen = frozen.clone();
                let paused = paused.clone();
                connections.spawn(async move {
                    if let Ok(outbound) = TcpStream::connect(target).await {
                        // Owned here, lent to the pumps: frozen, the pumps are dropped and
                        // the sockets stay open.
                        let (mut from_client, mut to_client) = inbound.into_split();
                        let (mut from_server, mut to_server) = outbound.into_split();
                        let both = futures::future::join(
                            pump(&mut from_client, &mut to_server, paused.clone()),
                            pump(&mut from_server, &mut to_client, paused),
                        );
                        tokio::select! {
                            _ = both => {}
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

/// Copies `from` to `to` until either ends, holding each chunk while paused; then passes the
/// end of the stream on (a FIN for a FIN), once unpaused.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut paused: watch::Receiver<bool>,
) {
    let mut chunk = vec![0; 64 * 1024];
    loop {
        let read = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if paused.wait_for(|p| !*p).await.is_err() || to.write_all(&chunk[..read]).await.is_err() {
            break;
        }
    }
    let _ = paused.wait_for(|p| !*p).await;
    let _ = to.shutdown().await;
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An echo server behind the proxy.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = socket.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        addr
    }

    async fn read_within(socket: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
        let mut buf = [0; 16];
        match tokio::time::timeout(within, socket.read(&mut buf)).await {
            Ok(Ok(n)) => Some(buf[..n].to_vec()),
            Ok(Err(e)) => panic!("{e}"),
            Err(_) => None,
        }
    }

    #[tokio::test]
    async fn paused_holds_and_delivers_frozen_stays_open_and_silent() {
        let proxy = TcpProxy::start(echo().await).await.unwrap();
        let mut socket = TcpStream::connect(proxy.addr).await.unwrap();
        let short = Duration::from_millis(300);
        socket.write_all(b"a").await.unwrap();
        assert_eq!(
            read_within(&mut socket, Duration::from_secs(5))
                .await
                .unwrap(),
            b"a"
        );

        proxy.pause();
        socket.write_all(b"b").await.unwrap();
        assert_eq!(
            read_within(&mut socket, short).await,
            None,
            "delivered while paused"
        );
        proxy.unpause();
        assert_eq!(
            read_within(&mut socket, Duration::from_secs(5))
                .await
                .unwrap(),
            b"b"
        );

        proxy.freeze();
        socket.write_all(b"c").await.unwrap();
        // Neither the byte nor an end of stream (`Some(vec![])`): the peer just went silent.
        assert_eq!(read_within(&mut socket, short).await, None);
    }
}
