//! This replica's client summary, for impact preview: per subscription (by name, wildcard or
//! glob) and parameter set, how many streams hold it, with a few node ids.
//!
//! Built on demand from what each stream's status already holds (its subscriptions with their
//! parameters, updated only when they change), never on the request path: a read locks each
//! stream's status briefly, one at a time.

use std::collections::HashMap;
use std::sync::Arc;

use vxds_core::impact::{ClientSummary, Samples, SummaryBuilder};

use crate::Registry;
use crate::status::SubscriptionGroup;

/// A shared copy of grouped subscriptions, how many streams' types hold it, and their node ids.
type Held = (Arc<[SubscriptionGroup]>, u64, Samples);

impl Registry {
    /// The summary of the streams connected now.
    ///
    /// Its streams and entries are walked again only when something they read changed
    /// (`crate::status::summary_inputs`): a stream connected or left, sent its node, or changed
    /// its subscriptions. Built after every settled revision, the walk visited every stream's
    /// status on every write, though a write changes no subscription.
    pub fn summary(&self) -> ClientSummary {
        let inputs = crate::status::summary_inputs();
        let cached = self.summary_cache.lock().ok().and_then(|cache| {
            (cache.as_ref())
                .filter(|(at, _)| *at == inputs)
                .map(|(_, summary)| summary.clone())
        });
        let mut summary = cached.unwrap_or_else(|| {
            let summary = self.walk_statuses();
            if let Ok(mut cache) = self.summary_cache.lock() {
                *cache = Some((inputs, summary.clone()));
            }
            summary
        });
        // The replica's name is added where the summaries are merged.
        summary.rollouts = self.rollouts.recent("");
        summary.rollout_head = self.rollouts.head();
        summary.rollout_loaded = self.rollouts.loaded_revision();
        summary
    }

    /// The streams and entries of the summary, from every stream's status.
    ///
    /// Streams that subscribe alike share one copy of their grouped subscriptions
    /// (`crate::intern`): each copy is added once, with how many streams hold it and their
    /// smallest node ids, not once per stream — built after every settled revision, it cost
    /// every stream a key of three allocations per subscription.
    fn walk_statuses(&self) -> ClientSummary {
        let mut builder = SummaryBuilder::default();
        // By the shared copy's address: the copy held here keeps it from being reused.
        let mut shared: HashMap<*const SubscriptionGroup, Held> = HashMap::new();
        for status in self.statuses() {
            let Ok(status) = status.lock() else { continue };
            builder.stream();
            for ty in &status.types {
                let (_, streams, samples) = shared
                    .entry(Arc::as_ptr(&ty.summary).cast::<SubscriptionGroup>())
                    .or_insert_with(|| (ty.summary.clone(), 0, Samples::default()));
                *streams += 1;
                // A stream that has sent no node yet has no id to sample.
                if !status.node_id.is_empty() {
                    samples.add(&status.node_id);
                }
            }
        }
        for (groups, streams, samples) in shared.into_values() {
            let nodes = samples.into_vec();
            for group in groups.iter() {
                for subscription in &group.subscriptions {
                    builder.add(
                        &group.type_url,
                        subscription.clone(),
                        &group.params,
                        streams,
                        &nodes,
                    );
                }
            }
        }
        builder.build()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use vxds_core::ParamSet;
    use vxds_core::impact::Subscription;
    use vxds_store::Snapshot;

    use super::*;
    use crate::status::{ClientStatus, SubscriptionGroup, TypeStatus};

    const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

    fn status(
        node: &str,
        subscription: Subscription,
        params: &ParamSet,
    ) -> Arc<Mutex<ClientStatus>> {
        Arc::new(Mutex::new(ClientStatus {
            node_id: node.to_owned(),
            types: vec![TypeStatus {
                type_url: ROUTE,
                summary: Arc::from([SubscriptionGroup {
                    type_url: ROUTE.to_owned(),
                    params: Arc::new(params.clone()),
                    subscriptions: vec![subscription],
                }]),
                ..Default::default()
            }],
            ..Default::default()
        }))
    }

    #[test]
    fn streams_with_the_same_subscription_and_parameters_are_counted_together() {
        let registry = Arc::new(Registry::new(Arc::new(Snapshot::default())));
        let prod = ParamSet::new().with("env", "prod");
        let web = Subscription::Name("web".into());
        let mut held = Vec::new();
        for (id, node, params) in [
            (1, "n2", &prod),
            (2, "n1", &prod),
            (3, "", &ParamSet::new()),
        ] {
            held.push(registry.register(id, status(node, web.clone(), params)));
        }
        let summary = registry.summary();
        assert_eq!(summary.streams, 3);
        assert_eq!(summary.entries.len(), 2);
        let by_params = |p: &ParamSet| summary.entries.iter().find(|e| &e.params == p).unwrap();
        assert_eq!(by_params(&prod).streams, 2);
        assert_eq!(by_params(&prod).sample_nodes, ["n1", "n2"]);
        // A stream without a node id counts, with no sample.
        assert_eq!(by_params(&ParamSet::new()).streams, 1);
        assert!(by_params(&ParamSet::new()).sample_nodes.is_empty());

        // A stream that leaves is no longer counted.
        held.remove(0);
        assert_eq!(registry.summary().streams, 2);
    }
}
