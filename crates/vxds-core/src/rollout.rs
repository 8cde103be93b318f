//! Rollout status of a revision: how many streams it changed, how many accepted it, which
//! refused it and why, and how long accepting took.
//!
//! Each replica counts its own streams into a [`RolloutRecord`] per recent revision (the xDS
//! server's `rollout` module feeds it) and publishes the records with its client summary;
//! [`RolloutStatus::merge`] turns every replica's record of one revision into the fleet's
//! status. Pure: no clock, no I/O.

use serde::{Deserialize, Serialize};

/// NACKs kept per revision and replica, with their texts; the counts stay exact beyond it.
pub const MAX_NACKS: usize = 100;
/// NACKs a replica publishes per revision, and the length their texts are cut to there.
pub const MAX_PUBLISHED_NACKS: usize = 10;
pub const MAX_PUBLISHED_NACK_TEXT: usize = 512;

/// One client's refusal of a revision.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RolloutNack {
    pub node: String,
    pub type_url: String,
    /// The client's error text.
    pub error: String,
    /// The replica whose stream it is.
    #[serde(default)]
    pub replica: String,
    /// The stream, on its replica (to forget the refusal once the stream accepts a later
    /// revision).
    #[serde(default)]
    pub stream_id: u64,
}

/// Times to accept, in milliseconds, as a log-scale histogram (4 buckets per doubling; a
/// quantile is known to within 19%) with the exact maximum.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckTimes {
    /// `(bucket, count)`, sorted by bucket, non-zero buckets only. Bucket `b` holds times up
    /// to `2^(b/4)` ms.
    pub buckets: Vec<(u16, u64)>,
    pub max_ms: u64,
}

impl AckTimes {
    /// The smallest b with 2^(b/4) >= ms. Recorded for every stream's every accepted
    /// revision: the power of two from the bits, the quarter by comparison, no logarithm.
    fn bucket(ms: u64) -> u16 {
        /// 2^(1/4), 2^(2/4), 2^(3/4): the boundaries between two powers of two.
        const QUARTERS: [f64; 3] = [
            1.189_207_115_002_721,
            std::f64::consts::SQRT_2,
            1.681_792_830_507_429,
        ];
        if ms <= 1 {
            return 0;
        }
        let power = 63 - ms.leading_zeros(); // 2^power <= ms < 2^(power + 1)
        let base = 1u64 << power;
        if ms == base {
            return (4 * power) as u16;
        }
        let ratio = ms as f64 / base as f64;
        let quarter = QUARTERS
            .iter()
            .position(|&q| ratio <= q)
            .map_or(4, |i| i + 1);
        (4 * power + quarter as u32) as u16
    }

    fn bound(bucket: u16) -> u64 {
        2f64.powf(f64::from(bucket) / 4.0).ceil() as u64
    }

    pub fn record(&mut self, ms: u64) {
        let b = Self::bucket(ms);
        match self.buckets.binary_search_by_key(&b, |(k, _)| *k) {
            Ok(i) => self.buckets[i].1 += 1,
            Err(i) => self.buckets.insert(i, (b, 1)),
        }
        self.max_ms = self.max_ms.max(ms);
    }

    pub fn add(&mut self, other: &AckTimes) {
        for &(b, n) in &other.buckets {
            match self.buckets.binary_search_by_key(&b, |(k, _)| *k) {
                Ok(i) => self.buckets[i].1 += n,
                Err(i) => self.buckets.insert(i, (b, n)),
            }
        }
        self.max_ms = self.max_ms.max(other.max_ms);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|(_, n)| n).sum()
    }

    /// The time under which a fraction `q` of the times fall (the bucket's bound, never above
    /// the maximum); `None` when nothing was recorded.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        let rank = ((q * count as f64).ceil() as u64).clamp(1, count);
        let mut seen = 0;
        for &(b, n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return Some(Self::bound(b).min(self.max_ms));
            }
        }
        Some(self.max_ms)
    }
}

/// One replica's count of one revision's rollout.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutRecord {
    pub revision: u64,
    /// The earliest revision the record counts: revisions the replica applied together with
    /// this one (a burst while its dispatcher was busy) reached its streams with it, and share
    /// its count. `None`: only its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<u64>,
    /// Unix ms; `None` when the replica did not know it.
    #[serde(default)]
    pub committed_at_ms: Option<i64>,
    /// Every stream the revision concerns on this replica has been told of it.
    pub published: bool,
    /// Streams told of the revision that have not yet worked out whether it changes anything
    /// they resolve.
    pub undecided: u64,
    /// Streams whose resolved resources the revision changed.
    pub streams: u64,
    /// Of those, streams that accepted it (or a later revision).
    pub acked: u64,
    /// Streams that refused it and have accepted nothing as new since.
    pub nacked: u64,
    /// Streams still to answer.
    pub pending: u64,
    /// Streams that left (or fell too far behind to be followed) before answering.
    pub gone: u64,
    pub ack_times: AckTimes,
    /// At most [`MAX_NACKS`] (published: [`MAX_PUBLISHED_NACKS`]).
    pub nacks: Vec<RolloutNack>,
}

impl RolloutRecord {
    pub fn new(revision: u64, committed_at_ms: Option<i64>) -> Self {
        Self {
            revision,
            committed_at_ms,
            ..Default::default()
        }
    }

    /// Whether the record counts revision `n`: its own, or one applied together with it.
    pub fn covers(&self, n: u64) -> bool {
        self.revision == n
            || self
                .first
                .is_some_and(|first| first <= n && n < self.revision)
    }

    /// The copy a replica publishes: few NACKs, short texts.
    pub fn published_copy(&self, replica: &str) -> Self {
        let mut copy = self.clone();
        copy.nacks.truncate(MAX_PUBLISHED_NACKS);
        for nack in &mut copy.nacks {
            nack.replica = replica.to_owned();
            if nack.error.len() > MAX_PUBLISHED_NACK_TEXT {
                let mut end = MAX_PUBLISHED_NACK_TEXT;
                while !nack.error.is_char_boundary(end) {
                    end -= 1;
                }
                nack.error = format!("{}…", &nack.error[..end]);
            }
        }
        copy
    }
}

/// The time to accept, over the streams that accepted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AckTimeSummary {
    pub p50_ms: Option<u64>,
    pub p99_ms: Option<u64>,
    pub max_ms: Option<u64>,
}

/// Where a rollout stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RolloutState {
    /// Streams are still to answer (or to find out whether the revision concerns them).
    Progressing,
    /// Every concerned stream accepted it (or left).
    Complete,
    /// A stream refused it; others may still be answering.
    Failed,
}

/// The fleet's rollout of one revision (`GET /v1/revisions/{n}/rollout`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RolloutStatus {
    pub revision: u64,
    pub state: RolloutState,
    /// Streams, on every replica, whose resolved resources the revision changed.
    pub streams: u64,
    /// Those that accepted it or a later revision.
    pub acked: u64,
    /// Those that refused it and accepted nothing newer since.
    pub nacked: u64,
    /// Those still to answer.
    pub pending: u64,
    /// Those that left before answering, their node not back (on the same replica) within
    /// 30 s to answer for them.
    pub gone: u64,
    /// Streams still working out whether the revision concerns them, and replicas that have
    /// not yet told all their streams: `state` is `progressing` while this is not zero.
    pub undecided: u64,
    /// Replicas counted.
    pub replicas: u64,
    pub nacks: Vec<RolloutNack>,
    /// From the commit to each ACK.
    pub ack_time: AckTimeSummary,
}

impl RolloutStatus {
    /// The fleet's status from each replica's record of `revision` (`replica`, record).
    pub fn merge<'a>(
        revision: u64,
        records: impl IntoIterator<Item = (&'a str, &'a RolloutRecord)>,
    ) -> Self {
        let mut status = RolloutStatus {
            revision,
            state: RolloutState::Progressing,
            streams: 0,
            acked: 0,
            nacked: 0,
            pending: 0,
            gone: 0,
            undecided: 0,
            replicas: 0,
            nacks: Vec::new(),
            ack_time: AckTimeSummary::default(),
        };
        let mut times = AckTimes::default();
        for (replica, record) in records {
            status.replicas += 1;
            status.streams += record.streams;
            status.acked += record.acked;
            status.nacked += record.nacked;
            status.pending += record.pending;
            status.gone += record.gone;
            status.undecided += record.undecided + u64::from(!record.published);
            times.add(&record.ack_times);
            for nack in &record.nacks {
                let mut nack = nack.clone();
                if nack.replica.is_empty() {
                    nack.replica = replica.to_owned();
                }
                status.nacks.push(nack);
            }
        }
        status.nacks.sort_by(|a, b| {
            (&a.node, &a.type_url, &a.replica).cmp(&(&b.node, &b.type_url, &b.replica))
        });
        status.ack_time = AckTimeSummary {
            p50_ms: times.quantile(0.5),
            p99_ms: times.quantile(0.99),
            max_ms: (times.count() > 0).then_some(times.max_ms),
        };
        status.state = if status.nacked > 0 {
            RolloutState::Failed
        } else if status.pending == 0 && status.undecided == 0 {
            RolloutState::Complete
        } else {
            RolloutState::Progressing
        };
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_the_quarter_powers_of_two_that_bound_each_time() {
        let by_logarithm = |ms: u64| -> u16 {
            if ms <= 1 {
                return 0;
            }
            ((ms as f64).log2() * 4.0).ceil() as u16
        };
        let spot = [
            u64::MAX,
            u64::MAX / 3,
            1 << 40,
            (1 << 40) + 1,
            86_400_000 * 365,
        ];
        for ms in (0..=1_000_000).chain(spot) {
            assert_eq!(AckTimes::bucket(ms), by_logarithm(ms), "{ms} ms");
        }
    }

    #[test]
    fn quantiles_are_within_a_bucket_and_never_above_the_maximum() {
        let mut t = AckTimes::default();
        assert_eq!(t.quantile(0.5), None);
        for ms in 1..=100 {
            t.record(ms);
        }
        let p50 = t.quantile(0.5).unwrap();
        assert!((50..=60).contains(&p50), "{p50}");
        let p99 = t.quantile(0.99).unwrap();
        assert!((99..=100).contains(&p99), "{p99}");
        assert_eq!(t.quantile(1.0), Some(100));
        assert_eq!(t.count(), 100);
        let mut u = AckTimes::default();
        u.record(5000);
        u.add(&t);
        assert_eq!(u.count(), 101);
        assert_eq!(u.max_ms, 5000);
    }

    #[test]
    fn merge_adds_replicas_and_fails_on_any_nack() {
        let mut a = RolloutRecord::new(7, Some(1));
        a.published = true;
        a.streams = 3;
        a.acked = 3;
        a.ack_times.record(20);
        let mut b = RolloutRecord::new(7, Some(1));
        b.published = true;
        b.streams = 2;
        b.acked = 1;
        b.pending = 1;
        let status = RolloutStatus::merge(7, [("r1", &a), ("r2", &b)]);
        assert_eq!(
            (
                status.streams,
                status.acked,
                status.pending,
                status.replicas
            ),
            (5, 4, 1, 2)
        );
        assert_eq!(status.state, RolloutState::Progressing);
        b.pending = 0;
        b.nacked = 1;
        b.nacks.push(RolloutNack {
            node: "n2".into(),
            type_url: "t".into(),
            error: "x".repeat(600),
            ..Default::default()
        });
        let b = b.published_copy("r2");
        assert!(b.nacks[0].error.len() < 600);
        let status = RolloutStatus::merge(7, [("r1", &a), ("r2", &b)]);
        assert_eq!(status.state, RolloutState::Failed);
        assert_eq!(status.nacks[0].replica, "r2");
        assert_eq!(status.ack_time.max_ms, Some(20));
        // A replica that has not told its streams yet keeps the rollout open.
        a.published = false;
        let status = RolloutStatus::merge(7, [("r1", &a)]);
        assert_eq!(status.state, RolloutState::Progressing);
        a.published = true;
        let status = RolloutStatus::merge(7, [("r1", &a)]);
        assert_eq!(status.state, RolloutState::Complete);
    }
}
