//! This replica's client summary, for impact preview: per subscription (by name, wildcard or
//! glob) and parameter set, how many streams hold it, with a few node ids.
//!
//! Built on demand from what each stream's status already holds (its subscriptions with their
//! parameters, updated only when they change), never on the request path: a read locks each
//! stream's status briefly, one at a time.

use vxds_core::impact::{ClientSummary, SummaryBuilder};

use crate::Registry;

impl Registry {
    /// The summary of the streams connected now.
    pub fn summary(&self) -> ClientSummary {
        let mut builder = SummaryBuilder::default();
        for status in self.statuses() {
            let Ok(status) = status.lock() else { continue };
            builder.stream();
            // A stream that has sent no node yet has no id to sample.
            let nodes = if status.node_id.is_empty() {
                Vec::new()
            } else {
                vec![status.node_id.clone()]
            };
            for ty in &status.types {
                for (subscription, params) in &ty.summary {
                    builder.add(&ty.type_url, subscription.clone(), params, 1, &nodes);
                }
            }
        }
        builder.build()
    }
}
