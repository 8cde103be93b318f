//! Impact preview: which connected clients a change to a resource's variant set would move,
//! before it is committed.
//!
//! [`resource_impact`] is the whole computation, pure: the variant set before, the variant set
//! after, and the parameter sets clients subscribe to the resource with ([`summary::Group`]s,
//! from the fleet's [`ClientSummary`]) give, per group, the variant it resolves to before and
//! after with the same matcher the streams use. A group then switches variant, keeps its
//! variant with a new body, loses the resource, gains it, or is untouched.

pub mod summary;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::constraints::CanonicalConstraints;
use crate::variants::VariantMatcher;
pub use summary::{
    ClientSummary, Group, Population, SAMPLE_NODES, Samples, Subscription, SummaryBuilder,
    SummaryEntry,
};

/// A variant as impact sees it: its constraints (its identity) and its version (its content).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VariantState {
    pub constraints: CanonicalConstraints,
    /// Changes whenever the body (or TTL) does.
    pub version: String,
}

/// What happens to a group of clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveKind {
    /// They resolve to another variant.
    Switch,
    /// They keep their variant, whose body (or TTL) changes.
    Update,
    /// They had a variant and would have none (no variant matches, or the resource is deleted).
    Lose,
    /// They had none and would get one.
    Gain,
}

impl MoveKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MoveKind::Switch => "switch",
            MoveKind::Update => "update",
            MoveKind::Lose => "lose",
            MoveKind::Gain => "gain",
        }
    }
}

/// Clients that move the same way between the same variants.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Move {
    pub kind: MoveKind,
    /// The variant they hold now (its constraints in the text syntax, `*` when unconstrained);
    /// `None` for a gain.
    pub from: Option<String>,
    /// The variant they would hold; `None` for a loss.
    pub to: Option<String>,
    pub streams: u64,
    /// A few of their node ids.
    pub sample_nodes: Vec<String>,
}

/// What a change to one resource does to the clients that subscribe to it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ResourceImpact {
    /// Streams that subscribe to the resource (by name, wildcard or glob).
    pub streams: u64,
    /// Sorted by kind, then variants.
    pub moves: Vec<Move>,
    /// Streams whose variant and body stay as they are.
    pub unchanged: u64,
    /// Streams that match no variant before or after.
    pub unmatched: u64,
}

impl ResourceImpact {
    /// Streams that would receive something different.
    pub fn affected(&self) -> u64 {
        self.moves.iter().map(|m| m.streams).sum()
    }
}

/// A move's kind and its variants (from, to), as text.
type MoveKey = (MoveKind, Option<String>, Option<String>);

/// The impact of replacing `before` by `after` (each in stored order; empty when the resource
/// does not exist) on clients subscribing with `groups`.
pub fn resource_impact(
    before: &[VariantState],
    after: &[VariantState],
    groups: &[Group],
) -> ResourceImpact {
    let matcher = |set: &[VariantState]| {
        let constraints: Vec<CanonicalConstraints> =
            set.iter().map(|v| v.constraints.clone()).collect();
        VariantMatcher::new(&constraints)
    };
    let (old, new) = (matcher(before), matcher(after));
    let mut impact = ResourceImpact::default();
    let mut moves: BTreeMap<MoveKey, (u64, Samples)> = BTreeMap::new();
    for group in groups {
        impact.streams += group.streams;
        let was = old.resolve(&group.params).map(|i| &before[i]);
        let will = new.resolve(&group.params).map(|i| &after[i]);
        let text = |v: &VariantState| v.constraints.to_string();
        let kind = match (was, will) {
            (None, None) => {
                impact.unmatched += group.streams;
                continue;
            }
            (Some(a), Some(b)) if a.constraints.id() != b.constraints.id() => MoveKind::Switch,
            (Some(a), Some(b)) if a.version != b.version => MoveKind::Update,
            (Some(_), Some(_)) => {
                impact.unchanged += group.streams;
                continue;
            }
            (Some(_), None) => MoveKind::Lose,
            (None, Some(_)) => MoveKind::Gain,
        };
        let (count, samples) = moves
            .entry((kind, was.map(text), will.map(text)))
            .or_default();
        *count += group.streams;
        samples.extend(&group.sample_nodes);
    }
    impact.moves = moves
        .into_iter()
        .map(|((kind, from, to), (streams, samples))| Move {
            kind,
            from,
            to,
            streams,
            sample_nodes: samples.into_vec(),
        })
        .collect();
    impact
}

#[cfg(test)]
#[path = "impact/tests.rs"]
mod tests;
