//! Ports for tests to listen on that no one else can be handed meanwhile.
//!
//! A port the kernel picks (`bind` to port 0) comes from its ephemeral range, and so, for
//! outgoing connections, do source ports. A test that checks an ephemeral port is free and binds
//! it later, or that stops listening on one and expects connections to it to be refused, can see
//! the port go elsewhere meanwhile: to an outgoing connection (Envoy refused a listener once in
//! CI), to another test's `bind(0)`, or to a connection to the port itself (a client whose source
//! port equals the destination connects to itself). Below the ephemeral range the kernel never
//! hands a port out by itself.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// How many ports below the ephemeral range are used.
const SPAN: u32 = 10_000;

/// A port on 127.0.0.1 that nothing listens on now, below the kernel's ephemeral range, never
/// the same twice in this process (the caller binds it, or hands it to a child process).
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768);
    assert!(
        ephemeral_low > SPAN + 1024,
        "the ephemeral port range starts at {ephemeral_low}: no room below it for test ports"
    );
    let first = ephemeral_low - SPAN;
    // Test processes running at once start at different places.
    let offset = std::process::id().wrapping_mul(7_919) % SPAN;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < SPAN, "no free port left below {ephemeral_low}");
        let port = u16::try_from(first + (offset + n) % SPAN).expect("below 65536");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_never_repeat() {
        let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse().ok())
            .unwrap_or(32_768);
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        assert!(ports.iter().all(|p| *p < low), "{ports:?}");
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len());
    }
}
