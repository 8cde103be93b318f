//! Heartbeats, coalesced: one task ticks every [`TICK`] over the streams that hold TTL'd
//! resources and wakes those whose heartbeat is due. A stream registers here only while it
//! holds a TTL'd resource, with the period it needs (a fraction of its shortest TTL); streams
//! without one are never visited or woken. No timer per stream or resource, no database: the
//! woken stream builds its heartbeats from its own state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};

use super::Registry;
use super::wake::{HEARTBEAT, Wake};

/// How often the task looks: a heartbeat is at most this late.
pub const TICK: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct Beat {
    every: Duration,
    next: Instant,
    due: Arc<Wake>,
}

/// The streams that hold TTL'd resources, and when each is next due.
#[derive(Debug, Default)]
pub struct Heartbeats {
    streams: Mutex<HashMap<u64, Beat>>,
}

impl Heartbeats {
    /// Stream `id` wants `due` raised every `every`; `None`: it holds nothing with a TTL.
    pub fn set(&self, id: u64, every: Option<Duration>, due: &Arc<Wake>) {
        let Ok(mut streams) = self.streams.lock() else {
            return;
        };
        let Some(every) = every else {
            streams.remove(&id);
            return;
        };
        let next = Instant::now() + every;
        streams
            .entry(id)
            .and_modify(|beat| {
                // A shorter period takes effect at once; a longer one after the next beat.
                beat.every = every;
                beat.next = beat.next.min(next);
            })
            .or_insert_with(|| Beat {
                every,
                next,
                due: due.clone(),
            });
    }

    pub fn remove(&self, id: u64) {
        if let Ok(mut streams) = self.streams.lock() {
            streams.remove(&id);
        }
    }

    /// Wakes every stream due at `now`; returns how many. Raised outside the lock.
    pub fn tick(&self, now: Instant) -> usize {
        let due: Vec<Arc<Wake>> = match self.streams.lock() {
            Ok(mut streams) => streams
                .values_mut()
                .filter(|beat| beat.next <= now)
                .map(|beat| {
                    beat.next = now + beat.every;
                    beat.due.clone()
                })
                .collect(),
            Err(_) => return 0,
        };
        due.iter().for_each(|wake| wake.raise(HEARTBEAT));
        due.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many streams hold TTL'd resources.
    pub fn len(&self) -> usize {
        self.streams.lock().map_or(0, |s| s.len())
    }
}

/// The one heartbeat task of a registry.
pub async fn run(registry: Arc<Registry>) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let now = interval.tick().await;
        registry.heartbeats.tick(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_tick_wakes_only_the_due_streams() {
        let beats = Heartbeats::default();
        let fast = Arc::new(Wake::default());
        let slow = Arc::new(Wake::default());
        beats.set(1, Some(Duration::from_secs(1)), &fast);
        beats.set(2, Some(Duration::from_secs(3)), &slow);
        beats.set(3, None, &slow);
        // After the sets: each is due one period after it was set.
        let start = Instant::now();
        assert_eq!(beats.len(), 2);
        assert_eq!(beats.tick(start), 0);
        assert_eq!(beats.tick(start + Duration::from_secs(1)), 1);
        assert_eq!(beats.tick(start + Duration::from_secs(2)), 1);
        assert_eq!(beats.tick(start + Duration::from_secs(3)), 2);
        // A stream that no longer holds a TTL'd resource is no longer visited.
        beats.set(1, None, &fast);
        beats.remove(2);
        assert_eq!(beats.len(), 0);
        assert_eq!(beats.tick(start + Duration::from_secs(10)), 0);
    }
}
