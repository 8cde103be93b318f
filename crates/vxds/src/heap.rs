//! The server's allocator (jemalloc) and its heap figures on `/metrics`.
//!
//! RSS alone cannot tell a leak from an allocator that keeps freed pages: a soak saw RSS grow
//! ~3 %/h with no way to say which. jemalloc's statistics can: `allocated` is what the program
//! holds (a leak grows it), `resident` what the allocator keeps mapped (retention and
//! fragmentation grow it while `allocated` stays flat). They are read at scrape time, so they
//! cost nothing between scrapes.
//!
//! jemalloc is built unprefixed: it is `malloc` for the whole process, C code included, so
//! SQLite's memory is in these figures and its freed pages are returned like the rest (with
//! glibc's allocator they stayed resident after a big write). Its options come from
//! `MALLOC_CONF` (on Linux; on macOS jemalloc stays prefixed: `_RJEM_MALLOC_CONF`).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};
use tikv_jemalloc_ctl::{Access, AsName, background_thread, epoch, max_background_threads, stats};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Turns on jemalloc's background purging: a thread returns freed pages to the system as
/// they age (`dirty_decay_ms`), instead of only when some thread next allocates in that arena.
/// Without it a quiet server keeps what a burst freed, and its RSS creeps up over hours with a
/// flat heap (the soak measured +3.5 %/h). One thread is enough for a server of this size.
pub fn purge_in_background() -> Result<(), tikv_jemalloc_ctl::Error> {
    max_background_threads::write(1)?;
    background_thread::write(true)
}

/// How long freed pages stay resident before the background thread returns them: 1 s, not
/// jemalloc's 10 s. A big write frees what it parsed and validated while the index it builds
/// allocates elsewhere (other threads, other arenas): with 10 s both were resident at once, and
/// a 100,000-resource changeset peaked at 4.7× its body instead of 3.0× (docs/benchmarks.md).
/// Writes are rare next to the time pages are kept, so returning them sooner costs little.
pub const DIRTY_DECAY_MS: isize = 1000;

/// jemalloc's own default for `dirty_decay_ms`.
const JEMALLOC_DIRTY_DECAY_MS: isize = 10_000;

/// Sets how long freed pages stay resident ([`DIRTY_DECAY_MS`]), for the arenas that exist
/// and those made later — unless the operator chose a time (`MALLOC_CONF`), which is
/// kept. Only arenas at jemalloc's default are changed: its arena for huge allocations purges
/// at once (0) and stays so.
pub fn decay_freed_pages_within(ms: isize) -> Result<(), tikv_jemalloc_ctl::Error> {
    let default: isize = b"arenas.dirty_decay_ms\0".name().read()?;
    if default != JEMALLOC_DIRTY_DECAY_MS {
        return Ok(());
    }
    b"arenas.dirty_decay_ms\0".name().write(ms)?;
    let arenas: u32 = b"arenas.narenas\0".name().read()?;
    for arena in 0..arenas {
        let key = format!("arena.{arena}.dirty_decay_ms\0");
        let name = key.as_bytes().name();
        // Arenas not in use yet refuse to be read: they take the default above when they start.
        if name.read() == Ok(JEMALLOC_DIRTY_DECAY_MS) {
            let _ = name.write(ms);
        }
    }
    Ok(())
}

/// Registers the heap gauges (`vxds_heap_allocated_bytes`, `vxds_heap_resident_bytes`).
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(HeapCollector));
}

/// Reads jemalloc's statistics on each scrape.
#[derive(Debug)]
struct HeapCollector;

/// The figures one scrape reports, in bytes.
#[derive(Debug, Clone, Copy)]
struct Heap {
    allocated: u64,
    resident: u64,
}

impl Heap {
    /// None when jemalloc's control interface answers with an error (it should not): the
    /// scrape then leaves the gauges out rather than report a false zero.
    fn read() -> Option<Self> {
        // jemalloc caches its statistics; advancing the epoch refreshes them.
        epoch::advance().ok()?;
        Some(Self {
            allocated: stats::allocated::read().ok()? as u64,
            resident: stats::resident::read().ok()? as u64,
        })
    }
}

impl Collector for HeapCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(heap) = Heap::read() else {
            return Ok(());
        };
        let bytes = Unit::Bytes;
        for (name, help, value) in [
            (
                "vxds_heap_allocated",
                "Heap bytes the server holds (jemalloc stats.allocated): grows with a leak",
                heap.allocated,
            ),
            (
                "vxds_heap_resident",
                "Bytes the allocator keeps resident (jemalloc stats.resident): above allocated by what it retains",
                heap.resident,
            ),
        ] {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            let metric =
                encoder.encode_descriptor(name, help, Some(&bytes), gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `name` in a text exposition.
    fn value(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    #[test]
    fn background_purging_can_be_turned_on() {
        purge_in_background().expect("jemalloc takes background threads");
        assert!(background_thread::read().expect("read"));
    }

    #[test]
    fn freed_pages_decay_within_a_second() {
        decay_freed_pages_within(DIRTY_DECAY_MS).expect("jemalloc takes a decay time");
        let default: isize = b"arenas.dirty_decay_ms\0".name().read().expect("read");
        assert_eq!(default, DIRTY_DECAY_MS);
        let first: isize = b"arena.0.dirty_decay_ms\0".name().read().expect("read");
        assert_eq!(first, DIRTY_DECAY_MS);
    }

    #[test]
    fn heap_gauges_are_on_the_metrics_page_and_follow_allocations() {
        let mut registry = Registry::default();
        register(&mut registry);
        let scrape = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
            text
        };
        let before = scrape();
        let allocated = value(&before, "vxds_heap_allocated_bytes").expect(&before);
        let resident = value(&before, "vxds_heap_resident_bytes").expect(&before);
        assert!(allocated > 0.0 && resident >= allocated, "{before}");
        assert!(
            before.contains("# UNIT vxds_heap_allocated_bytes bytes"),
            "{before}"
        );

        // 64 MiB held: `allocated` must see it (it is the figure a leak grows).
        let held = vec![1u8; 64 << 20];
        let after = scrape();
        let grown = value(&after, "vxds_heap_allocated_bytes").expect(&after) - allocated;
        assert!(grown >= f64::from(60u32 << 20), "grew by {grown} bytes");
        drop(held);
    }
}
