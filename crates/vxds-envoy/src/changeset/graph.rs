//! The rules across resources, on a validated changeset: what it does to the aggregate-cluster
//! graph and to the redirects, and the problems either graph has after it, pointed at its
//! operations. The store runs them under its write lock, over the graphs it holds.

use std::collections::{BTreeMap, BTreeSet};

use super::{Action, Problem, ValidatedChangeset, ValidatedOperation};
use crate::pointer::Pointer;
use crate::resource::CLUSTER;
use crate::rules::{self, GraphProblem};

/// The clusters an operation's cluster points to as an aggregate after it; `None` when it has
/// none (deleted, not an aggregate, or not a cluster).
fn aggregate_edges(op: &ValidatedOperation) -> Option<&BTreeSet<String>> {
    match &op.action {
        Action::Put(resource) if op.key.type_url.ends_with(CLUSTER) => resource
            .aggregate_children
            .as_ref()
            .filter(|children| !children.is_empty()),
        _ => None,
    }
}

impl ValidatedChangeset {
    /// Whether this changeset gives some cluster aggregate edges. Only an edge can close a
    /// cycle or deepen a chain: a changeset that adds none (removing edges, deleting clusters,
    /// leaf clusters) cannot break the aggregate graph's rules, and need not load the graph.
    pub fn adds_aggregate_edges(&self) -> bool {
        self.operations
            .iter()
            .any(|op| aggregate_edges(op).is_some())
    }

    /// Takes `edges` (aggregate cluster → the clusters it points to) to what they are after
    /// this changeset: the clusters it touches get their new edges, or none (deleted, or not an
    /// aggregate). Names are copied only for the edges it adds.
    pub fn update_aggregate_edges(&self, edges: &mut BTreeMap<String, BTreeSet<String>>) {
        for op in &self.operations {
            if !op.key.type_url.ends_with(CLUSTER) {
                continue;
            }
            match aggregate_edges(op) {
                Some(children) => edges.insert(op.key.name.clone(), children.clone()),
                None => edges.remove(&op.key.name),
            };
        }
    }

    /// Resources this changeset touches, with the targets of their redirect variants (empty:
    /// none, or deleted).
    pub fn redirect_updates(&self) -> BTreeMap<(String, String), BTreeSet<String>> {
        self.operations
            .iter()
            .map(|op| {
                let targets = match &op.action {
                    Action::Put(resource) => resource.redirects.clone(),
                    Action::Delete => BTreeSet::new(),
                };
                ((op.key.type_url.to_string(), op.key.name.clone()), targets)
            })
            .collect()
    }

    /// The one-hop redirect rule over `edges` (every redirect after this changeset), as
    /// problems pointing at this changeset's operations.
    pub fn redirect_problems(
        &self,
        edges: &BTreeMap<(String, String), BTreeSet<String>>,
    ) -> Vec<Problem> {
        let changed: BTreeSet<(String, String)> = self.redirect_updates().into_keys().collect();
        crate::collections::check_redirect_graph(edges, &changed)
            .into_iter()
            .map(|p| {
                let op = self
                    .operations
                    .iter()
                    .find(|op| op.key.type_url == p.source.0 && op.key.name == p.source.1)
                    .map_or(0, |op| op.index);
                Problem::new(
                    Pointer::root().push("operations").push(op),
                    p.code,
                    p.message,
                )
                .at(op, None)
            })
            .collect()
    }

    /// The aggregate-graph rules over `edges` (the whole graph after this changeset), as
    /// problems pointing at this changeset's cluster operations.
    pub fn graph_problems(&self, edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Problem> {
        // A problem lies on the graph: of the clusters this changeset touches, only those in
        // it are copied (a changeset of 100,000 clusters would otherwise copy every name).
        let nodes: BTreeSet<&str> = edges
            .iter()
            .flat_map(|(parent, children)| std::iter::once(parent).chain(children))
            .map(String::as_str)
            .collect();
        let changed: BTreeSet<String> = self
            .operations
            .iter()
            .filter(|op| op.key.type_url.ends_with(CLUSTER) && nodes.contains(op.key.name.as_str()))
            .map(|op| op.key.name.clone())
            .collect();
        drop(nodes);
        rules::check_aggregate_graph(edges, &changed)
            .into_iter()
            .map(
                |GraphProblem {
                     cluster,
                     code,
                     message,
                 }| {
                    let op = self
                        .operations
                        .iter()
                        .find(|op| op.key.type_url.ends_with(CLUSTER) && op.key.name == cluster)
                        .map_or(0, |op| op.index);
                    Problem::new(Pointer::root().push("operations").push(op), code, message)
                        .at(op, None)
                },
            )
            .collect()
    }
}
