//! The client summary: per subscribed resource, the distinct parameter sets connected streams
//! hold it with, how many streams hold each, and a few of their node ids.
//!
//! A replica builds one from its streams ([`SummaryBuilder`]); replicas' summaries merge into
//! the fleet's ([`ClientSummary::merge`]). Wildcard and glob subscriptions are kept as such,
//! not expanded into the resources they reach: the summary stays as small as the distinct
//! subscriptions, and [`Population::groups`] finds the wildcard and glob subscribers of a
//! resource (one that does not exist yet included) when an impact is computed.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::params::ParamSet;
use crate::xdstp::{SubscriptionName, XdstpUrl, XdstpUrn};

/// Node ids kept per group, as samples: the smallest, so that merging is deterministic.
pub const SAMPLE_NODES: usize = 3;

/// What a stream subscribes to, of one type.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", content = "target", rename_all = "snake_case")]
pub enum Subscription {
    /// A resource by name (normal form), plainly or by locator.
    Name(String),
    /// Every resource of the type.
    Wildcard,
    /// An xdstp glob collection, as its normal-form URL (`xdstp://a/T/path/*`).
    Collection(String),
}

/// Streams that hold one subscription with one parameter set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SummaryEntry {
    pub type_url: String,
    pub subscription: Subscription,
    pub params: ParamSet,
    pub streams: u64,
    /// Up to [`SAMPLE_NODES`] node ids, sorted.
    pub sample_nodes: Vec<String>,
}

/// One replica's (or, merged, the fleet's) connected clients.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientSummary {
    /// Streams connected.
    pub streams: u64,
    /// Sorted by type, subscription and parameters.
    pub entries: Vec<SummaryEntry>,
    /// The replica's rollout records of recent revisions (`crate::rollout`); not merged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rollouts: Vec<crate::rollout::RolloutRecord>,
    /// The newest revision the replica's streams have been told of: a revision after it is
    /// still to come there; one at or before it without a record concerned none of its streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_head: Option<u64>,
    /// The revision the replica's index loaded at start (or at its last reload): its streams'
    /// answers to revisions up to it were never recorded there, so it cannot count them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_loaded: Option<u64>,
}

/// A set of at most [`SAMPLE_NODES`] node ids, the smallest seen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Samples(BTreeSet<String>);

impl Samples {
    pub fn add(&mut self, node: &str) {
        if self.0.len() >= SAMPLE_NODES {
            match self.0.last() {
                Some(last) if node < last.as_str() => {}
                _ => return,
            }
        }
        if self.0.insert(node.to_owned()) && self.0.len() > SAMPLE_NODES {
            self.0.pop_last();
        }
    }

    pub fn extend<'a>(&mut self, nodes: impl IntoIterator<Item = &'a String>) {
        for node in nodes {
            self.add(node);
        }
    }

    pub fn into_vec(self) -> Vec<String> {
        self.0.into_iter().collect()
    }
}

type EntryKey = (String, Subscription, ParamSet);

/// Collects streams' subscriptions into a summary.
#[derive(Debug, Default)]
pub struct SummaryBuilder {
    streams: u64,
    entries: BTreeMap<EntryKey, (u64, Samples)>,
}

impl SummaryBuilder {
    /// Counts one connected stream.
    pub fn stream(&mut self) {
        self.streams += 1;
    }

    /// One stream (node `node`) holds `subscription` of `type_url` with `params`. A stream
    /// should add each of its subscriptions once.
    pub fn add(
        &mut self,
        type_url: &str,
        subscription: Subscription,
        params: &ParamSet,
        streams: u64,
        nodes: &[String],
    ) {
        let (count, samples) = self
            .entries
            .entry((type_url.to_owned(), subscription, params.clone()))
            .or_default();
        *count += streams;
        samples.extend(nodes);
    }

    pub fn build(self) -> ClientSummary {
        ClientSummary {
            streams: self.streams,
            entries: self
                .entries
                .into_iter()
                .map(
                    |((type_url, subscription, params), (streams, samples))| SummaryEntry {
                        type_url,
                        subscription,
                        params,
                        streams,
                        sample_nodes: samples.into_vec(),
                    },
                )
                .collect(),
            rollouts: Vec::new(),
            rollout_head: None,
            rollout_loaded: None,
        }
    }
}

impl ClientSummary {
    /// The sum of several replicas' summaries: counts add up, samples are the smallest ids.
    pub fn merge<'a>(summaries: impl IntoIterator<Item = &'a ClientSummary>) -> ClientSummary {
        let mut builder = SummaryBuilder::default();
        for summary in summaries {
            builder.streams += summary.streams;
            for e in &summary.entries {
                builder.add(
                    &e.type_url,
                    e.subscription.clone(),
                    &e.params,
                    e.streams,
                    &e.sample_nodes,
                );
            }
        }
        builder.build()
    }
}

/// Streams that hold (or would hold) a resource with one parameter set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub params: ParamSet,
    pub streams: u64,
    pub sample_nodes: Vec<String>,
}

/// A summary indexed for looking up a resource's subscribers.
#[derive(Debug)]
pub struct Population<'a> {
    by_name: HashMap<(&'a str, &'a str), Vec<&'a SummaryEntry>>,
    wildcard: HashMap<&'a str, Vec<&'a SummaryEntry>>,
    globs: Vec<(XdstpUrl, &'a SummaryEntry)>,
}

impl<'a> Population<'a> {
    pub fn new(summary: &'a ClientSummary) -> Self {
        let mut population = Population {
            by_name: HashMap::new(),
            wildcard: HashMap::new(),
            globs: Vec::new(),
        };
        for e in &summary.entries {
            match &e.subscription {
                Subscription::Name(name) => population
                    .by_name
                    .entry((e.type_url.as_str(), name.as_str()))
                    .or_default()
                    .push(e),
                Subscription::Wildcard => population
                    .wildcard
                    .entry(e.type_url.as_str())
                    .or_default()
                    .push(e),
                // A collection that does not parse (a summary from a newer replica, say)
                // reaches nothing.
                Subscription::Collection(url) => {
                    if let Ok(SubscriptionName::Glob(url)) = SubscriptionName::parse(url) {
                        population.globs.push((url, e));
                    }
                }
            }
        }
        population
    }

    /// The parameter sets `type_url`/`name` (normal form) is subscribed with, by name, by
    /// wildcard or by a glob that covers it, whether or not it exists; one group per set.
    pub fn groups(&self, type_url: &str, name: &str) -> Vec<Group> {
        let mut groups: BTreeMap<&ParamSet, (u64, Samples)> = BTreeMap::new();
        let mut add = |e: &'a SummaryEntry| {
            let (count, samples) = groups.entry(&e.params).or_default();
            *count += e.streams;
            samples.extend(&e.sample_nodes);
        };
        for e in self.by_name.get(&(type_url, name)).into_iter().flatten() {
            add(e);
        }
        for e in self.wildcard.get(type_url).into_iter().flatten() {
            add(e);
        }
        if !self.globs.is_empty()
            && let Ok(urn) = XdstpUrn::parse(name)
        {
            for (url, e) in &self.globs {
                if e.type_url == type_url && url.glob_matches(&urn) {
                    add(e);
                }
            }
        }
        groups
            .into_iter()
            .map(|(params, (streams, samples))| Group {
                params: params.clone(),
                streams,
                sample_nodes: samples.into_vec(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

    fn p(pairs: &[(&str, &str)]) -> ParamSet {
        pairs.iter().copied().collect()
    }

    #[test]
    fn samples_keep_the_smallest_ids() {
        let mut s = Samples::default();
        for n in ["n5", "n1", "n4", "n2", "n3", "n1"] {
            s.add(n);
        }
        assert_eq!(s.into_vec(), ["n1", "n2", "n3"]);
    }

    #[test]
    fn builder_counts_streams_per_subscription_and_params() {
        let mut b = SummaryBuilder::default();
        for (node, env) in [("a", "prod"), ("b", "prod"), ("c", "test")] {
            b.stream();
            b.add(
                T,
                Subscription::Name("r".into()),
                &p(&[("env", env)]),
                1,
                &[node.to_owned()],
            );
        }
        let s = b.build();
        assert_eq!(s.streams, 3);
        assert_eq!(s.entries.len(), 2);
        assert_eq!(s.entries[0].params, p(&[("env", "prod")]));
        assert_eq!(s.entries[0].streams, 2);
        assert_eq!(s.entries[0].sample_nodes, ["a", "b"]);
        assert_eq!(s.entries[1].streams, 1);
    }

    #[test]
    fn merge_adds_counts_and_keeps_sorted_samples() {
        let one = |node: &str| {
            let mut b = SummaryBuilder::default();
            b.stream();
            b.add(T, Subscription::Wildcard, &p(&[]), 1, &[node.to_owned()]);
            b.build()
        };
        let merged = ClientSummary::merge(&[one("z"), one("b"), one("y"), one("a")]);
        assert_eq!(merged.streams, 4);
        assert_eq!(merged.entries.len(), 1);
        assert_eq!(merged.entries[0].streams, 4);
        assert_eq!(merged.entries[0].sample_nodes, ["a", "b", "y"]);
    }

    #[test]
    fn groups_gather_names_wildcards_and_globs() {
        let urn = "xdstp://auth/envoy.config.route.v3.RouteConfiguration/routes/r1";
        let glob = "xdstp://auth/envoy.config.route.v3.RouteConfiguration/routes/*";
        let other = "xdstp://auth/envoy.config.route.v3.RouteConfiguration/elsewhere/*";
        let mut b = SummaryBuilder::default();
        let prod = p(&[("env", "prod")]);
        b.add(T, Subscription::Name(urn.into()), &prod, 2, &["n1".into()]);
        b.add(T, Subscription::Wildcard, &prod, 1, &["n2".into()]);
        b.add(
            T,
            Subscription::Collection(glob.into()),
            &p(&[]),
            4,
            &["n3".into()],
        );
        b.add(
            T,
            Subscription::Collection(other.into()),
            &p(&[]),
            8,
            &["n4".into()],
        );
        b.add("other", Subscription::Wildcard, &prod, 16, &["n5".into()]);
        let s = b.build();
        let population = Population::new(&s);
        let groups = population.groups(T, urn);
        assert_eq!(
            groups,
            [
                Group {
                    params: p(&[]),
                    streams: 4,
                    sample_nodes: vec!["n3".into()]
                },
                Group {
                    params: prod.clone(),
                    streams: 3,
                    sample_nodes: vec!["n1".into(), "n2".into()]
                },
            ]
        );
        // A name nobody names: only the wildcard reaches it.
        let groups = population.groups(T, "plain");
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].streams, 1);
    }

    #[test]
    fn summaries_round_trip_through_json() {
        let mut b = SummaryBuilder::default();
        b.stream();
        b.add(
            T,
            Subscription::Name("r".into()),
            &p(&[("k", "v")]),
            1,
            &["n".into()],
        );
        b.add(T, Subscription::Wildcard, &p(&[]), 1, &["n".into()]);
        let s = b.build();
        let json = serde_json::to_string(&s).unwrap();
        assert!(
            json.contains(r#""subscription":{"kind":"wildcard"}"#),
            "{json}"
        );
        assert!(
            json.contains(r#""subscription":{"kind":"name","target":"r"}"#),
            "{json}"
        );
        let back: ClientSummary = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
    }
}
