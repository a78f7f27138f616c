//! Session-local handles for driver objects (modules, functions, streams, events).
//!
//! The guest never sees a host pointer for these: it gets a small integer from a per-session
//! counter, and every op looks the integer up in the session's table for that kind. An id the
//! table does not hold (made up, already destroyed, of another kind, of another session) is
//! simply not found. Id 0 is never issued, because 0 means "the legacy stream" on the wire.

use std::collections::HashMap;

/// Issues handle ids for one session: 1, 2, 3, ... shared by all kinds, so an id names at
/// most one object of the session.
#[derive(Debug, Default)]
pub(crate) struct HandleCounter {
    last: u64,
}

impl HandleCounter {
    /// The last id handed out (0: none yet).
    pub(crate) fn last(&self) -> u64 {
        self.last
    }

    /// A counter that goes on after `last` (a restored state's).
    pub(crate) fn after(last: u64) -> Self {
        Self { last }
    }

    /// The next id, or `None` once the 64-bit space is spent (never, in practice).
    pub(crate) fn next_id(&mut self) -> Option<u64> {
        self.last = self.last.checked_add(1)?;
        Some(self.last)
    }
}

/// Objects of one kind, by handle id, with a size limit.
#[derive(Debug)]
pub(crate) struct HandleTable<T> {
    entries: HashMap<u64, T>,
    limit: usize,
}

impl<T> HandleTable<T> {
    /// An empty table that holds at most `limit` objects.
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            entries: HashMap::new(),
            limit,
        }
    }

    /// True if one more object fits. Check before creating the driver object, so that a full
    /// table never leaves an object without a handle.
    pub(crate) fn has_room(&self) -> bool {
        self.entries.len() < self.limit
    }

    /// Stores `value` under a fresh id. `None` if the table is full or ids are spent.
    pub(crate) fn insert(&mut self, ids: &mut HandleCounter, value: T) -> Option<u64> {
        if !self.has_room() {
            return None;
        }
        let id = ids.next_id()?;
        self.entries.insert(id, value);
        Some(id)
    }

    /// The object with handle `id`.
    /// Puts `value` under a given id (a restored state's), if there is room, the id is not
    /// taken, and the counter has handed it out already (so it never hands it out again).
    pub(crate) fn insert_at(&mut self, ids: &HandleCounter, id: u64, value: T) -> bool {
        if !self.has_room() || id == 0 || id > ids.last || self.entries.contains_key(&id) {
            return false;
        }
        self.entries.insert(id, value);
        true
    }

    /// Every id and its value.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        self.entries.iter().map(|(&k, v)| (k, v))
    }

    pub(crate) fn get(&self, id: u64) -> Option<&T> {
        self.entries.get(&id)
    }

    /// The object with handle `id`, to change it.
    pub(crate) fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        self.entries.get_mut(&id)
    }

    /// Removes and returns the object with handle `id`.
    pub(crate) fn remove(&mut self, id: u64) -> Option<T> {
        self.entries.remove(&id)
    }

    /// Keeps only the objects for which `keep` is true.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.entries.retain(|_, v| keep(v));
    }

    /// The first object (in no particular order) matching `pred`, with its id.
    pub(crate) fn find(&self, mut pred: impl FnMut(&T) -> bool) -> Option<(u64, &T)> {
        self.entries
            .iter()
            .find(|(_, v)| pred(v))
            .map(|(&k, v)| (k, v))
    }

    /// Every object, in no particular order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.entries.values()
    }

    /// Number of objects.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_across_tables_and_never_zero() {
        let mut ids = HandleCounter::default();
        let mut a = HandleTable::new(8);
        let mut b = HandleTable::new(8);
        let x = a.insert(&mut ids, "module").unwrap();
        let y = b.insert(&mut ids, "stream").unwrap();
        assert_ne!(x, 0);
        assert_ne!(x, y);
        // An id of one kind is unknown to another table.
        assert!(b.get(x).is_none());
        assert!(a.get(y).is_none());
        assert_eq!(a.get(x), Some(&"module"));
        assert!(a.get(0).is_none());
    }

    #[test]
    fn restored_ids_keep_their_numbers_and_are_never_handed_out_again() {
        let ids = HandleCounter::after(10);
        let mut t = HandleTable::new(2);
        assert!(t.insert_at(&ids, 7, "stream"));
        assert!(!t.insert_at(&ids, 7, "again"));
        assert!(!t.insert_at(&ids, 0, "zero"));
        assert!(!t.insert_at(&ids, 11, "not handed out"));
        assert!(t.insert_at(&ids, 10, "event"));
        assert!(!t.insert_at(&ids, 9, "full"));
        let mut ids = ids;
        assert_eq!(ids.next_id(), Some(11));
        assert_eq!(t.iter().count(), 2);
    }

    #[test]
    fn removed_ids_are_not_found_and_not_reused() {
        let mut ids = HandleCounter::default();
        let mut t = HandleTable::new(8);
        let x = t.insert(&mut ids, 1).unwrap();
        assert_eq!(t.remove(x), Some(1));
        assert!(t.get(x).is_none());
        assert_eq!(t.remove(x), None);
        let y = t.insert(&mut ids, 2).unwrap();
        assert_ne!(x, y);
    }

    #[test]
    fn limit_and_exhaustion() {
        let mut ids = HandleCounter::default();
        let mut t = HandleTable::new(2);
        t.insert(&mut ids, 1).unwrap();
        t.insert(&mut ids, 2).unwrap();
        assert!(!t.has_room());
        assert!(t.insert(&mut ids, 3).is_none());
        t.retain(|&v| v != 1);
        assert_eq!(t.len(), 1);
        assert_eq!(t.find(|&v| v == 2).map(|(_, v)| *v), Some(2));
        assert!(t.insert(&mut ids, 3).is_some());

        let mut spent = HandleCounter { last: u64::MAX - 1 };
        assert_eq!(spent.next_id(), Some(u64::MAX));
        assert_eq!(spent.next_id(), None);
        assert_eq!(spent.next_id(), None);
    }
}
