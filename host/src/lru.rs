//! A least-recently-used table weighed by what each entry costs: the
//! host's memory table (bytes, each block charged to the VM whose request
//! fetched it) and a client's mappings (one each, no owners).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// One entry: its value, its place in the order, its weight, its owner.
#[derive(Debug)]
struct Entry<V> {
    value: V,
    stamp: u64,
    weight: u64,
    owner: u64,
}

/// Entries by key; the least recently used go first when a new one would
/// pass the capacity. Each entry has an owner (0: none), whose total
/// weight is kept, so that an owner over its share can be made to give up
/// its own entries first ([`Lru::insert_within`]).
#[derive(Debug)]
pub struct Lru<K, V> {
    capacity: u64,
    used: u64,
    clock: u64,
    map: HashMap<K, Entry<V>>,
    order: BTreeMap<u64, K>,
    owned: HashMap<u64, u64>,
}

impl<K: Hash + Eq + Copy, V: Clone> Lru<K, V> {
    /// An empty table holding at most `capacity` of weight.
    pub fn new(capacity: u64) -> Self {
        Lru {
            capacity,
            used: 0,
            clock: 0,
            map: HashMap::new(),
            order: BTreeMap::new(),
            owned: HashMap::new(),
        }
    }

    /// The entry of `key`, now the most recently used.
    pub fn get(&mut self, key: &K) -> Option<V> {
        let e = self.map.get_mut(key)?;
        self.order.remove(&e.stamp);
        self.clock += 1;
        e.stamp = self.clock;
        self.order.insert(self.clock, *key);
        Some(e.value.clone())
    }

    /// Puts `value` under `key` (replacing what was there), evicting the
    /// least recently used until it fits; one heavier than the whole
    /// table is not kept.
    pub fn insert(&mut self, key: K, value: V, weight: u64) {
        self.insert_within(key, value, weight, 0, u64::MAX);
    }

    /// [`Lru::insert`] charged to `owner`, who may hold at most `share` of
    /// weight: while it would hold more, its own least recently used
    /// entries go first (others' entries are not touched for it).
    pub fn insert_within(&mut self, key: K, value: V, weight: u64, owner: u64, share: u64) {
        self.remove(&key);
        if weight > self.capacity || weight > share {
            return;
        }
        while self.owned_by(owner) + weight > share {
            let oldest = self
                .order
                .values()
                .find(|k| self.map.get(k).is_some_and(|e| e.owner == owner))
                .copied();
            match oldest {
                Some(k) => {
                    self.remove(&k);
                }
                None => break,
            }
        }
        while self.used + weight > self.capacity {
            let Some((_, victim)) = self.order.pop_first() else {
                break;
            };
            self.forget(&victim);
        }
        self.clock += 1;
        self.order.insert(self.clock, key);
        self.map.insert(
            key,
            Entry {
                value,
                stamp: self.clock,
                weight,
                owner,
            },
        );
        self.used += weight;
        *self.owned.entry(owner).or_default() += weight;
    }

    /// Drops `key`'s entry; whether there was one.
    pub fn remove(&mut self, key: &K) -> bool {
        match self.map.get(key) {
            Some(e) => {
                let stamp = e.stamp;
                self.order.remove(&stamp);
                self.forget(key);
                true
            }
            None => false,
        }
    }

    /// Takes `key` out of the map and the counts (its place in the order
    /// is the caller's).
    fn forget(&mut self, key: &K) {
        if let Some(e) = self.map.remove(key) {
            self.used -= e.weight;
            if let Some(w) = self.owned.get_mut(&e.owner) {
                *w -= e.weight;
                if *w == 0 {
                    self.owned.remove(&e.owner);
                }
            }
        }
    }

    /// The weight held.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// The weight charged to `owner`.
    pub fn owned_by(&self, owner: u64) -> u64 {
        self.owned.get(&owner).copied().unwrap_or(0)
    }

    /// The entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_go_first_and_weight_is_bounded() {
        let mut t = Lru::new(10);
        t.insert(1, "a", 4);
        t.insert(2, "b", 4);
        assert_eq!(t.get(&1), Some("a"));
        t.insert(3, "c", 4);
        assert_eq!(
            (t.get(&2), t.get(&1), t.get(&3)),
            (None, Some("a"), Some("c"))
        );
        assert_eq!((t.used(), t.len()), (8, 2));
        t.insert(4, "d", 11);
        assert_eq!(t.get(&4), None, "heavier than the table");
        t.insert(1, "a2", 2);
        assert_eq!((t.get(&1), t.used()), (Some("a2"), 6));
        assert!(t.remove(&3) && !t.remove(&3));
        assert_eq!(t.used(), 2);
    }

    #[test]
    fn an_owner_over_its_share_gives_up_its_own_entries_first() {
        let mut t = Lru::new(10);
        // Owner 7 may hold 4: its third entry of 2 pushes out its first.
        t.insert_within(1, "a", 2, 7, 4);
        t.insert_within(2, "b", 2, 8, 10);
        t.insert_within(3, "c", 2, 7, 4);
        t.insert_within(4, "d", 2, 7, 4);
        assert_eq!(t.get(&1), None, "7's oldest went");
        assert_eq!((t.get(&2), t.owned_by(7), t.owned_by(8)), (Some("b"), 4, 2));
        // Past the capacity the least recently used go, whoever owns them.
        t.insert_within(5, "e", 4, 9, 10);
        assert_eq!(t.used(), 10);
        t.insert_within(6, "f", 2, 9, 10);
        assert_eq!(t.get(&3), None, "the oldest of all went");
        assert_eq!(t.owned_by(7) + t.owned_by(8) + t.owned_by(9), t.used());
        // More than the share itself is not kept.
        t.insert_within(7, "g", 5, 7, 4);
        assert_eq!(t.get(&7), None);
    }
}
