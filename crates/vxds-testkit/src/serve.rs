//! `vxds serve` as a child process, for end-to-end tests and the load generator: a fresh
//! SQLite database in the caller's directory, the admin API and the xDS server on ephemeral
//! ports read back from its log, the log kept in `vxds.log`, and the process killed on drop.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running `vxds serve`.
#[derive(Debug)]
pub struct ServeProcess {
    pub child: Child,
    /// The admin API, e.g. `http://127.0.0.1:41234` (`https://` when it serves TLS).
    pub admin_url: String,
    pub xds_addr: SocketAddr,
    /// The server's log (stderr).
    pub log: PathBuf,
}

impl ServeProcess {
    /// Starts `binary serve` with its database and log in `dir`, and `extra_args`; returns once
    /// both servers listen.
    pub fn start(binary: &Path, dir: &Path, extra_args: &[&str]) -> io::Result<ServeProcess> {
        Self::start_at(binary, dir, "127.0.0.1:0", extra_args)
    }

    /// Like [`Self::start`], with the xDS server at `xds_addr`: a restarted server where its
    /// clients reconnect. The database in `dir` is kept across restarts.
    pub fn start_at(
        binary: &Path,
        dir: &Path,
        xds_addr: &str,
        extra_args: &[&str],
    ) -> io::Result<ServeProcess> {
        let database = format!("sqlite://{}", dir.join("vxds.db").display());
        Self::start_on(binary, dir, &database, xds_addr, extra_args)
    }

    /// Like [`Self::start_at`], on the database at `database` (e.g. a fresh Postgres
    /// database); the log is still kept in `dir`.
    pub fn start_on(
        binary: &Path,
        dir: &Path,
        database: &str,
        xds_addr: &str,
        extra_args: &[&str],
    ) -> io::Result<ServeProcess> {
        let mut child = Command::new(binary)
            .args([
                "serve",
                "--admin-addr",
                "127.0.0.1:0",
                "--xds-addr",
                xds_addr,
            ])
            .args(["--database-url", database])
            .args(extra_args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| io::Error::other(format!("starting {}: {e}", binary.display())))?;
        let log = dir.join("vxds.log");
        let mut file = File::options().create(true).append(true).open(&log)?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| io::Error::other("vxds serve has no stderr"))?;
        let mut lines = BufReader::new(stderr).lines();
        let (mut admin, mut xds) = (None, None);
        let mut scheme = "http";
        while admin.is_none() || xds.is_none() {
            let Some(line) = lines.next() else {
                let _ = child.wait();
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(io::Error::other(format!(
                    "vxds serve exited before listening:\n{text}"
                )));
            };
            let line = line?;
            writeln!(file, "{line}")?;
            let addr = line.split("addr=").nth(1).map(|a| a.trim().to_owned());
            if line.contains("admin API listening") {
                if line.contains("scheme=\"https\"") || line.contains("scheme=https") {
                    scheme = "https";
                }
                admin = addr;
            } else if line.contains("xDS server listening") {
                xds = addr;
            }
        }
        // Keep draining the log, so that the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let _ = writeln!(file, "{line}");
            }
        });
        let xds_addr = xds
            .unwrap_or_default()
            .parse()
            .map_err(|e| io::Error::other(format!("the xDS address in the log: {e}")))?;
        Ok(ServeProcess {
            child,
            admin_url: format!("{scheme}://{}", admin.unwrap_or_default()),
            xds_addr,
            log,
        })
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            print_tail("vxds", &self.log);
        }
    }
}

/// Prints the last lines of a log, for a failing test.
pub fn print_tail(name: &str, log: &Path) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(60).collect();
    eprintln!("---- {name} log (last lines) ----");
    for line in tail.into_iter().rev() {
        eprintln!("{line}");
    }
}
