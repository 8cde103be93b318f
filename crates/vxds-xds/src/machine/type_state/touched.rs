//! A collection that remembers whether it was changed since it was last looked at for
//! freeing: an idle stream frees the B-tree nodes its bookkeeping emptied, and dropping an
//! empty B-tree costs the same whether or not it holds a node, so that a poll after every
//! ACK paid for ten drops of maps nearly always untouched.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Deref, DerefMut};

/// `T`, and whether it was borrowed mutably since [`Self::free_if_emptied`] last looked.
/// Reads go through `Deref` and leave the mark alone.
#[derive(Clone, Default)]
pub(crate) struct Touched<T> {
    inner: T,
    touched: bool,
}

pub(crate) trait Collection: Default {
    fn is_empty(&self) -> bool;
}

impl<K, V> Collection for BTreeMap<K, V> {
    fn is_empty(&self) -> bool {
        BTreeMap::is_empty(self)
    }
}

impl<K> Collection for BTreeSet<K> {
    fn is_empty(&self) -> bool {
        BTreeSet::is_empty(self)
    }
}

impl<T: Collection> Touched<T> {
    /// Replaces the collection by a new one (no node) if it was changed and is empty: an
    /// emptied B-tree keeps its first node.
    pub fn free_if_emptied(&mut self) {
        if std::mem::take(&mut self.touched) && self.inner.is_empty() {
            self.inner = T::default();
        }
    }
}

// What cannot give an empty collection a node does not mark it: the hot paths remove from,
// retain in, clear or take collections that are nearly always empty.

impl<K: Ord> Touched<BTreeSet<K>> {
    pub fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        !self.inner.is_empty() && self.deref_mut().remove(key)
    }

    pub fn retain(&mut self, keep: impl FnMut(&K) -> bool) {
        if !self.inner.is_empty() {
            self.deref_mut().retain(keep);
        }
    }

    /// Empties it, freeing its nodes.
    pub fn clear(&mut self) {
        self.inner.clear();
    }

    /// Takes what it holds, leaving it new (no node).
    pub fn take(&mut self) -> BTreeSet<K> {
        std::mem::take(&mut self.inner)
    }
}

impl<K: Ord, V> Touched<BTreeMap<K, V>> {
    pub fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        if self.inner.is_empty() {
            return None;
        }
        self.deref_mut().remove(key)
    }

    pub fn retain(&mut self, keep: impl FnMut(&K, &mut V) -> bool) {
        if !self.inner.is_empty() {
            self.deref_mut().retain(keep);
        }
    }

    /// Empties it, freeing its nodes.
    pub fn clear(&mut self) {
        self.inner.clear();
    }
}

impl<T> Deref for Touched<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> DerefMut for Touched<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.touched = true;
        &mut self.inner
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Touched<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_changed_collection_is_looked_at_and_an_emptied_one_is_replaced() {
        let mut set: Touched<BTreeSet<u32>> = Touched::default();
        assert!(!set.touched);
        assert!(!set.contains(&1), "a read leaves the mark alone");
        assert!(!set.touched);
        set.insert(1);
        set.free_if_emptied();
        assert!(!set.touched && set.contains(&1), "not empty: kept");
        set.remove(&1);
        assert!(set.touched);
        set.free_if_emptied();
        assert!(!set.touched && set.is_empty());
        // Nothing to remove, retain, clear or take: no node can have come, no mark.
        set.remove(&1);
        set.retain(|_| false);
        set.clear();
        assert!(set.take().is_empty());
        assert!(!set.touched);
        let mut map: Touched<BTreeMap<u32, u32>> = Touched::default();
        map.remove(&1);
        map.retain(|_, _| true);
        assert!(!map.touched);
        map.insert(1, 1);
        map.clear();
        assert!(map.is_empty());
    }
}
