//! A least-recently-used table weighed by what each entry costs: the
//! host's memory table (bytes) and a client's mappings (one each).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// Entries by key; the least recently used go first when a new one would
/// pass the capacity.
#[derive(Debug)]
pub struct Lru<K, V> {
    capacity: u64,
    used: u64,
    clock: u64,
    map: HashMap<K, (V, u64, u64)>,
    order: BTreeMap<u64, K>,
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
        }
    }

    /// The entry of `key`, now the most recently used.
    pub fn get(&mut self, key: &K) -> Option<V> {
        let (value, stamp, _) = self.map.get_mut(key)?;
        self.order.remove(stamp);
        self.clock += 1;
        *stamp = self.clock;
        self.order.insert(self.clock, *key);
        Some(value.clone())
    }

    /// Puts `value` under `key` (replacing what was there), evicting the
    /// least recently used until it fits; one heavier than the whole
    /// table is not kept.
    pub fn insert(&mut self, key: K, value: V, weight: u64) {
        self.remove(&key);
        if weight > self.capacity {
            return;
        }
        while self.used + weight > self.capacity {
            let Some((_, victim)) = self.order.pop_first() else {
                break;
            };
            if let Some((_, _, w)) = self.map.remove(&victim) {
                self.used -= w;
            }
        }
        self.clock += 1;
        self.order.insert(self.clock, key);
        self.map.insert(key, (value, self.clock, weight));
        self.used += weight;
    }

    /// Drops `key`'s entry; whether there was one.
    pub fn remove(&mut self, key: &K) -> bool {
        match self.map.remove(key) {
            Some((_, stamp, w)) => {
                self.order.remove(&stamp);
                self.used -= w;
                true
            }
            None => false,
        }
    }

    /// The weight held.
    pub fn used(&self) -> u64 {
        self.used
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
        assert_eq!((t.get(&2), t.get(&1), t.get(&3)), (None, Some("a"), Some("c")));
        assert_eq!((t.used(), t.len()), (8, 2));
        t.insert(4, "d", 11);
        assert_eq!(t.get(&4), None, "heavier than the table");
        t.insert(1, "a2", 2);
        assert_eq!((t.get(&1), t.used()), (Some("a2"), 6));
        assert!(t.remove(&3) && !t.remove(&3));
        assert_eq!(t.used(), 2);
    }
}
