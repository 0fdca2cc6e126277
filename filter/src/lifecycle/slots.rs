//! How Redis claims and writes are grouped into batches: at most so many per call, so many bytes,
//! and on Redis Cluster (a batch refused `CROSSSLOT`) one hash slot's keys per call.

use crate::store::redis;

/// `items` in batches, in order: each of at most `max_items` items and `max_bytes` bytes (by
/// `size`) and, with `per_slot`, of one hash slot's keys. An item `key` gives no key for (a write
/// that cannot be a step of a batch) goes alone.
pub(super) fn batches<T>(
    items: Vec<T>,
    per_slot: bool,
    max_items: usize,
    max_bytes: usize,
    key: impl for<'a> Fn(&'a T) -> Option<&'a str>,
    size: impl Fn(&T) -> usize,
) -> Vec<Vec<T>> {
    // (slot, members, bytes, whether members may be joined)
    let mut groups: Vec<(Option<u16>, Vec<T>, usize, bool)> = Vec::new();
    for item in items {
        let Some(k) = key(&item) else {
            groups.push((None, vec![item], 0, false));
            continue;
        };
        let slot = per_slot.then(|| redis::hash_slot(k));
        let bytes = size(&item);
        let open = groups
            .iter_mut()
            .rev()
            .find(|(s, g, b, joinable)| *joinable && *s == slot && g.len() < max_items && b + bytes <= max_bytes);
        match open {
            Some((_, g, b, _)) => {
                g.push(item);
                *b += bytes;
            }
            None => groups.push((slot, vec![item], bytes, true)),
        }
    }
    groups.into_iter().map(|(_, g, _, _)| g).collect()
}

/// Whether keys span more than one Redis Cluster hash slot (a batch of them can be refused
/// `CROSSSLOT`; one of a single slot never is).
pub(super) fn several_slots<'a>(mut keys: impl Iterator<Item = &'a str>) -> bool {
    let Some(first) = keys.next().map(redis::hash_slot) else {
        return false;
    };
    keys.any(|k| redis::hash_slot(k) != first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(groups: &[Vec<(&'static str, usize)>]) -> Vec<Vec<&'static str>> {
        groups.iter().map(|g| g.iter().map(|(k, _)| *k).collect()).collect()
    }

    /// The item's key; an empty one stands for a write that cannot be a step.
    fn key<'a>(item: &'a (&'static str, usize)) -> Option<&'a str> {
        Some(item.0).filter(|k| !k.is_empty())
    }

    #[test]
    fn batches_hold_so_many_items_and_bytes_and_one_slot_on_a_cluster() {
        let items = vec![("{a}1", 10), ("{a}2", 10), ("{b}1", 10), ("", 5), ("{a}3", 10), ("{b}2", 10)];
        let any = batches(items.clone(), false, 3, 100, key, |i| i.1);
        assert_eq!(keys(&any), [vec!["{a}1", "{a}2", "{b}1"], vec![""], vec!["{a}3", "{b}2"]]);
        let by_bytes = batches(items.clone(), false, 10, 20, key, |i| i.1);
        assert_eq!(keys(&by_bytes), [vec!["{a}1", "{a}2"], vec!["{b}1", "{a}3"], vec![""], vec!["{b}2"]]);
        let per_slot = batches(items, true, 10, 100, key, |i| i.1);
        assert_eq!(keys(&per_slot), [vec!["{a}1", "{a}2", "{a}3"], vec!["{b}1", "{b}2"], vec![""]]);
    }
}
