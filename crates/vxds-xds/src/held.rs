//! What a stream tracks of a resource: the indexed variant (`Item`, shared with the index) and
//! what the client has of it (`Sent`). Below both the stream machine and the status it feeds,
//! so that neither imports the other.

use std::sync::Arc;

use bytes::Bytes;
use vxds_core::ParamSet;
use vxds_store::{IndexedResource, IndexedVariant};

use crate::wire::{Naming, Wrapped};

#[derive(Clone, Debug)]
pub(crate) struct Item {
    pub(crate) resource: Arc<IndexedResource>,
    pub(crate) variant: usize,
    /// Named with its constraints (locator subscriptions) or the legacy way.
    pub(crate) constrained: bool,
}

impl Item {
    pub(crate) fn variant(&self) -> &IndexedVariant {
        &self.resource.variants[self.variant]
    }

    pub(crate) fn version(&self) -> &Arc<str> {
        &self.variant().version
    }

    /// Whether this is the variant `params` resolved to (in the snapshot it came from).
    pub(crate) fn resolves(&self, params: &ParamSet) -> bool {
        self.resource.matcher.resolve(params) == Some(self.variant)
    }

    /// The constraints it is named with: a locator subscription's variant's, else none.
    pub(crate) fn constraints(&self) -> Option<Bytes> {
        self.constrained
            .then(|| self.variant().constraints_bytes.clone())
            .flatten()
    }

    pub(crate) fn wrapped(&self, name: &Arc<str>) -> Wrapped {
        let variant = self.variant();
        let naming = if self.constrained {
            Naming::Constrained(variant.constraints_bytes.clone())
        } else {
            Naming::Legacy
        };
        Wrapped {
            name: name.clone(),
            naming,
            version: variant.version.clone(),
            body: Some(variant.body.clone()),
            ttl: variant.ttl,
        }
    }

    /// The same variant of the same indexed resource, named alike: what the client holds of
    /// it needs no update.
    pub(crate) fn same(&self, other: &Item) -> bool {
        Arc::ptr_eq(&self.resource, &other.resource)
            && self.variant == other.variant
            && self.constrained == other.constrained
    }

    /// Its TTL: such an item is always sent wrapped, and kept alive by heartbeats.
    pub(crate) fn ttl(&self) -> Option<std::time::Duration> {
        self.variant().ttl
    }
}

/// What the client has of an item.
#[derive(Clone, Debug)]
pub(crate) enum Sent {
    /// Sent on this stream: the variant as the snapshot of the time held it.
    Delivered(Item),
    /// What the client said it had at connect (`initial_resource_versions`); never sent here.
    Reported(Arc<str>),
}

impl Sent {
    pub(crate) fn version(&self) -> &Arc<str> {
        match self {
            Sent::Delivered(item) => item.version(),
            Sent::Reported(version) => version,
        }
    }

    pub(crate) fn constraints(&self) -> Option<Bytes> {
        match self {
            Sent::Delivered(item) => item.constraints(),
            Sent::Reported(_) => None,
        }
    }
}
