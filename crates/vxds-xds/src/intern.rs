//! Interning of what many streams hold alike: parameter sets, subscription names, and what
//! is derived from a stream's subscriptions alone (its interest for the registry, its
//! subscriptions as the status shows them).
//!
//! Ten thousand proxies subscribing with a handful of parameter sets to the same names would
//! otherwise each keep their own copies — a `ParamSet` is a map whose first node alone takes
//! over 500 bytes. Interned, every stream holds an `Arc` to one shared copy. A table keeps
//! each value only while some stream does: values no stream holds any more are swept out
//! once the table has doubled since the last sweep, so the tables stay within twice what is
//! in use and sweeping costs O(1) per insertion, amortized.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;
use std::sync::{Arc, LazyLock, Mutex};

use vxds_core::ParamSet;

/// A table of shared values. The tables of values a module owns live with it (the status's
/// subscription summaries, the registry's interests), so that this module depends on none.
pub(crate) struct Interner<T: ?Sized> {
    table: Mutex<Table<T>>,
}

struct Table<T: ?Sized> {
    values: HashSet<Arc<T>>,
    /// Sweep when the table reaches this size.
    sweep_at: usize,
}

/// The smallest table that is ever swept.
const MIN_SWEEP: usize = 1024;

impl<T: ?Sized + Eq + Hash> Interner<T> {
    pub(crate) fn new() -> Self {
        Self {
            table: Mutex::new(Table {
                values: HashSet::new(),
                sweep_at: MIN_SWEEP,
            }),
        }
    }

    /// The shared copy of `value`, made from it if there is none.
    fn intern<Q: Borrow<T> + Into<Arc<T>>>(&self, value: Q) -> Arc<T> {
        // A poisoned table only means another thread panicked while holding it: its values
        // are still valid, but sharing is an optimisation, so a private copy is fine too.
        let Ok(mut table) = self.table.lock() else {
            return value.into();
        };
        if let Some(shared) = table.values.get(value.borrow()) {
            return shared.clone();
        }
        if table.values.len() >= table.sweep_at {
            // Only the table holds these: no stream uses them any more.
            table.values.retain(|v| Arc::strong_count(v) > 1);
            table.sweep_at = (table.values.len() * 2).max(MIN_SWEEP);
        }
        let shared: Arc<T> = value.into();
        table.values.insert(shared.clone());
        shared
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.lock().map(|t| t.values.len()).unwrap_or(0)
    }
}

static PARAMS: LazyLock<Interner<ParamSet>> = LazyLock::new(Interner::new);
static NAMES: LazyLock<Interner<str>> = LazyLock::new(Interner::new);
static DESCRIPTIONS: LazyLock<Interner<[String]>> = LazyLock::new(Interner::new);

/// The shared copy of a parameter set.
pub(crate) fn params(params: ParamSet) -> Arc<ParamSet> {
    PARAMS.intern(params)
}

/// The shared copy of a name (a subscription's spelling or normal form).
pub(crate) fn name(name: &str) -> Arc<str> {
    NAMES.intern(name)
}

/// Values derived from a stream's subscriptions are shared only up to this many entries.
/// Streams alike are fleets of proxies with a handful of subscriptions each; a client with
/// thousands (on-demand CDS) is unlike any other, and interning its value would only cost a
/// hash of it under the table's lock and keep each replaced copy until the next sweep.
const MAX_SHARED_ENTRIES: usize = 64;

/// The shared copy of `value` when it is small (`entries`), else a private one.
pub(crate) fn small<T: ?Sized + Eq + Hash, Q: Borrow<T> + Into<Arc<T>>>(
    interner: &Interner<T>,
    entries: usize,
    value: Q,
) -> Arc<T> {
    if entries > MAX_SHARED_ENTRIES {
        return value.into();
    }
    interner.intern(value)
}

/// The shared copy of a type's subscriptions as operators read them (`/v1/clients`).
pub(crate) fn descriptions(descriptions: Vec<String>) -> Arc<[String]> {
    small(&DESCRIPTIONS, descriptions.len(), descriptions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_copy() {
        let a = params(ParamSet::new().with("env", "prod"));
        let b = params(ParamSet::new().with("env", "prod"));
        let c = params(ParamSet::new().with("env", "test"));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert!(Arc::ptr_eq(&name("web"), &name("web")));
    }

    #[test]
    fn unused_values_are_swept_as_the_table_grows() {
        let interner: Interner<str> = Interner::new();
        let kept: Vec<Arc<str>> = (0..10)
            .map(|i| {
                let n = format!("kept-{i}");
                interner.intern(n.as_str())
            })
            .collect();
        for i in 0..10 * MIN_SWEEP {
            let n = format!("dropped-{i}");
            drop(interner.intern(n.as_str()));
        }
        // Never more than twice what is in use (and at least the minimum before a sweep).
        assert!(interner.len() <= MIN_SWEEP + 1, "{}", interner.len());
        for (i, k) in kept.iter().enumerate() {
            let n = format!("kept-{i}");
            assert!(Arc::ptr_eq(k, &interner.intern(n.as_str())));
        }
    }

    #[test]
    fn large_values_are_kept_private() {
        let few: Vec<String> = (0..3).map(|i| format!("n{i}")).collect();
        let many: Vec<String> = (0..=MAX_SHARED_ENTRIES).map(|i| format!("n{i}")).collect();
        assert!(Arc::ptr_eq(&descriptions(few.clone()), &descriptions(few)));
        assert!(!Arc::ptr_eq(
            &descriptions(many.clone()),
            &descriptions(many)
        ));
    }
}
