//! Throwaway Postgres servers of a test's own: a primary and a streaming standby made with the
//! machine's Postgres binaries (`initdb`, `pg_ctl`, `pg_basebackup` from
//! `/usr/lib/postgresql/<version>/bin`, or `VXDS_PG_BIN`), in a temporary folder, on free
//! ports, for failover tests. The shared server the other tests use is never touched. Run as
//! root, the binaries run as the `postgres` user (`runuser`), as Postgres refuses root.
//!
//! Missing binaries fail the test loudly: these tests are never skipped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// One Postgres server: its own data folder, port and log.
#[derive(Debug)]
pub struct PgServer {
    pub port: u16,
    data: PathBuf,
    log: PathBuf,
    bin: PathBuf,
    /// Holds the data folder until dropped.
    _dir: tempfile::TempDir,
}

/// How a primary replicates to its standby.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replication {
    /// The default: a commit is acknowledged once it is on the primary's disk.
    Asynchronous,
    /// `synchronous_commit = on` with the standby named in `synchronous_standby_names`: a
    /// commit is acknowledged once the standby has it too.
    Synchronous,
}

/// The `application_name` the standby connects with (and the primary names when synchronous).
pub const STANDBY_NAME: &str = "vxds_standby";

impl PgServer {
    /// A new primary on a free port, running, trusting local connections (user `postgres`).
    pub fn primary(replication: Replication) -> PgServer {
        let (dir, data, bin) = prepare();
        run(
            &bin,
            "initdb",
            &[
                "-D",
                path_str(&data),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
            ],
        );
        let port = crate::ports::free_port();
        let mut conf = common_conf(port, dir.path());
        conf.push_str("wal_level = replica\nmax_wal_senders = 4\nwal_keep_size = '64MB'\n");
        if replication == Replication::Synchronous {
            conf.push_str(&format!(
                "synchronous_commit = on\nsynchronous_standby_names = '{STANDBY_NAME}'\n"
            ));
        }
        append(&data.join("postgresql.conf"), &conf);
        let server = PgServer {
            port,
            log: dir.path().join("postgres.log"),
            data,
            bin,
            _dir: dir,
        };
        server.start();
        server
    }

    /// A streaming standby of the primary reached at `upstream` (the primary, or a proxy in
    /// front of it), on a free port, running and connected.
    pub fn standby_of(upstream: SocketAddr) -> PgServer {
        let (dir, data, bin) = prepare();
        run(
            &bin,
            "pg_basebackup",
            &[
                "-h",
                &upstream.ip().to_string(),
                "-p",
                &upstream.port().to_string(),
                "-U",
                "postgres",
                "-D",
                path_str(&data),
                "-X",
                "stream",
                "--no-sync",
                "-R",
            ],
        );
        let port = crate::ports::free_port();
        let mut conf = common_conf(port, dir.path());
        // Reconnects at once when the upstream comes back (a re-pointed proxy).
        // The primary's settings came with the backup: once promoted, this server must not
        // wait for a standby of its own.
        conf.push_str(
            "hot_standby = on\nwal_retrieve_retry_interval = '200ms'\n\
             synchronous_standby_names = ''\n",
        );
        append(&data.join("postgresql.conf"), &conf);
        // After `-R`'s own line: the last setting wins.
        append(
            &data.join("postgresql.auto.conf"),
            &format!(
                "primary_conninfo = 'host={} port={} user=postgres application_name={STANDBY_NAME}'\n",
                upstream.ip(),
                upstream.port()
            ),
        );
        let server = PgServer {
            port,
            log: dir.path().join("postgres.log"),
            data,
            bin,
            _dir: dir,
        };
        server.start();
        server
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// A URL for database `postgres` on this server.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn start(&self) {
        run(
            &self.bin,
            "pg_ctl",
            &[
                "-D",
                path_str(&self.data),
                "-l",
                path_str(&self.log),
                "-w",
                "-t",
                "30",
                "start",
            ],
        );
    }

    /// Stops the server the way a crash does (`-m immediate`): nothing is flushed or sent.
    pub fn crash(&self) {
        run(
            &self.bin,
            "pg_ctl",
            &["-D", path_str(&self.data), "-m", "immediate", "-w", "stop"],
        );
    }

    /// Promotes a standby to a primary, and waits until it takes writes.
    pub fn promote(&self) {
        run(
            &self.bin,
            "pg_ctl",
            &["-D", path_str(&self.data), "-w", "-t", "30", "promote"],
        );
    }

    /// What the server logged, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // Whatever state it is in; errors (already stopped) do not matter.
        let _ = postgres_command(&self.bin, "pg_ctl")
            .args(["-D", path_str(&self.data), "-m", "immediate", "-w", "stop"])
            .output();
    }
}

/// Waits until `check` holds, for at most `limit`; panics with `what` otherwise.
pub fn wait_until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "{what} (waited {limit:?})");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The folder of the newest Postgres binaries on this machine.
pub fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("VXDS_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "the failover tests need Postgres's server binaries (initdb, pg_ctl, pg_basebackup) \
             in /usr/lib/postgresql/<version>/bin (Debian: apt-get install postgresql), or \
             VXDS_PG_BIN naming their folder"
        )
    })
}

fn prepare() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let bin = bin_dir();
    let dir = tempfile::Builder::new()
        .prefix("vxds-pg-")
        .tempdir()
        .expect("a temporary folder");
    if running_as_root() {
        let status = Command::new("chown")
            .args(["postgres:", path_str(dir.path())])
            .status()
            .expect("running chown");
        assert!(
            status.success(),
            "handing {} to the postgres user",
            dir.path().display()
        );
    }
    let data = dir.path().join("data");
    (dir, data, bin)
}

fn common_conf(port: u16, dir: &Path) -> String {
    format!(
        "\n# vxds-testkit\nport = {port}\nlisten_addresses = '127.0.0.1'\n\
         unix_socket_directories = '{}'\nfsync = off\nfull_page_writes = off\n\
         shared_buffers = '16MB'\nmax_connections = 60\n",
        dir.display()
    )
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    file.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("Uid:"))?;
            line.split_whitespace().nth(1).map(|uid| uid == "0")
        })
        .unwrap_or(false)
}

fn postgres_command(bin: &Path, program: &str) -> Command {
    let program = bin.join(program);
    if running_as_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn run(bin: &Path, program: &str, args: &[&str]) {
    let output = postgres_command(bin, program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program} from {}: {e}", bin.display()));
    assert!(
        output.status.success(),
        "{program} {args:?} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}
