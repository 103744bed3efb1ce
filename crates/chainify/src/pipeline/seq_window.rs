//! The sequence numbers a server has accepted from each client, to refuse a replayed
//! proposal. Batches may arrive out of order after retries, so a window of recent numbers
//! is kept per client above a floor: anything at or below the floor, or in the window, is
//! a replay.

use std::collections::{BTreeMap, BTreeSet};

/// How many recent numbers are kept per client before the floor rises.
const WINDOW: usize = 4096;

#[derive(Debug, Default, Clone)]
pub(super) struct SeqWindow {
    clients: BTreeMap<String, (u64, BTreeSet<u64>)>,
}

impl SeqWindow {
    /// Whether `seq` of `client` would be new.
    pub(super) fn is_new(&self, client: &str, seq: u64) -> bool {
        match self.clients.get(client) {
            Some((floor, seen)) => seq > *floor && !seen.contains(&seq),
            None => seq > 0,
        }
    }

    /// Records `seq` of `client` as seen.
    pub(super) fn insert(&mut self, client: &str, seq: u64) {
        let (floor, seen) = self.clients.entry(client.to_string()).or_default();
        seen.insert(seq);
        while seen.len() > WINDOW {
            if let Some(lowest) = seen.pop_first() {
                *floor = lowest;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_are_told_apart_from_late_arrivals() {
        let mut window = SeqWindow::default();
        assert!(!window.is_new("c", 0), "numbers count from 1");
        window.insert("c", 2);
        assert!(window.is_new("c", 1), "a number arriving late is new");
        assert!(!window.is_new("c", 2));
        for seq in 3..(WINDOW as u64 + 10) {
            window.insert("c", seq);
        }
        assert!(!window.is_new("c", 1), "below the floor once the window moved past it");
        assert!(window.is_new("d", 1));
    }
}
