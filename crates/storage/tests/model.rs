//! Model-based test of [`VersionedStore`]: random installs (some refused), reads, scans and
//! garbage collections against a `BTreeMap` of every key's versions.

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};

use bytes::Bytes;
use proptest::prelude::*;
use virga_storage::{MvStore, Timestamp, Version, VersionedStore};

/// Keys 0..KEYS as one byte each, so bounds and key order are easy to state.
const KEYS: u8 = 6;

#[derive(Clone, Debug)]
enum Op {
    Install { key: u8, ts: Timestamp, value: Option<u8>, watermark: Option<Timestamp> },
    Read { key: u8, ts: Timestamp },
    Scan { start: Bound<u8>, end: Bound<u8>, ts: Timestamp, limit: usize },
    Gc { watermark: Timestamp },
}

/// Small times and two clients, so ties on `time` broken by `client` happen often.
fn timestamp() -> impl Strategy<Value = Timestamp> {
    (0u64..24, 0u32..2).prop_map(|(time, client)| Timestamp::new(time, client))
}

fn bound() -> impl Strategy<Value = Bound<u8>> {
    prop_oneof![Just(Bound::Unbounded), (0..KEYS).prop_map(Bound::Included), (0..KEYS).prop_map(Bound::Excluded)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..KEYS, timestamp(), proptest::option::weighted(0.8, any::<u8>()), proptest::option::of(timestamp()))
            .prop_map(|(key, ts, value, watermark)| Op::Install { key, ts, value, watermark }),
        3 => (0..KEYS, timestamp()).prop_map(|(key, ts)| Op::Read { key, ts }),
        2 => (bound(), bound(), timestamp(), 0usize..5).prop_map(|(start, end, ts, limit)| Op::Scan { start, end, ts, limit }),
        1 => timestamp().prop_map(|watermark| Op::Gc { watermark }),
    ]
}

/// The oracle: each key's versions, oldest first, under the same collection rule the
/// contract states (keep everything above the watermark and the youngest at or below it).
#[derive(Default)]
struct Model {
    keys: BTreeMap<u8, Vec<Version>>,
    /// The highest watermark collected at so far: reads below it may see dropped history.
    floor: Timestamp,
}

impl Model {
    fn install(&mut self, key: u8, version: Version, watermark: Timestamp) -> bool {
        let chain = self.keys.entry(key).or_default();
        if chain.last().is_some_and(|newest| newest.ts >= version.ts) {
            return false;
        }
        chain.push(version);
        self.collect_key(key, watermark);
        true
    }

    fn collect_key(&mut self, key: u8, watermark: Timestamp) {
        self.floor = self.floor.max(watermark);
        if let Some(chain) = self.keys.get_mut(&key) {
            if let Some(keep_from) = chain.iter().rposition(|v| v.ts <= watermark) {
                chain.drain(..keep_from);
            }
        }
    }

    fn visible(&self, key: u8, ts: Timestamp) -> Option<&Version> {
        self.keys.get(&key)?.iter().rev().find(|v| v.ts <= ts)
    }

    fn newest(&self, key: u8) -> Timestamp {
        self.keys.get(&key).and_then(|c| c.last()).map_or(Timestamp::ZERO, |v| v.ts)
    }
}

fn value(byte: u8) -> Bytes {
    Bytes::from(vec![byte; 1 + byte as usize % 3])
}

fn as_slice(bound: &Bound<[u8; 1]>) -> Bound<&[u8]> {
    bound.as_ref().map(|k| &k[..])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_store_behaves_like_a_map_of_version_lists(ops in proptest::collection::vec(op(), 1..80)) {
        let store = MvStore::new();
        let mut model = Model::default();
        let mut writer = 0u64;
        for op in ops {
            match op {
                Op::Install { key, ts, value: v, watermark } => {
                    writer += 1;
                    let version = Version { ts, writer, value: v.map(value) };
                    let watermark = watermark.unwrap_or(Timestamp::ZERO);
                    let newest = model.newest(key);
                    let accepted = model.install(key, version.clone(), watermark);
                    let entry = store.entry(&[key]);
                    match store.install(&entry, version, watermark) {
                        Ok(()) => prop_assert!(accepted, "install at {} over {} accepted", ts, newest),
                        Err(refused) => {
                            prop_assert!(!accepted, "install at {} refused: {}", ts, refused);
                            prop_assert_eq!(refused.attempted, ts);
                            prop_assert_eq!(refused.newest, newest);
                        }
                    }
                }
                Op::Read { key, ts } => {
                    let ts = ts.max(model.floor);
                    let want = model.visible(key, ts).cloned();
                    prop_assert_eq!(store.get_at(&[key], ts), want.as_ref().and_then(|v| v.value.clone()));
                    if let Some(entry) = store.find(&[key]) {
                        let read = store.read_at(&entry, ts);
                        prop_assert_eq!(read.visible, want);
                        prop_assert_eq!(read.newest, model.newest(key));
                        let newest = store.newest(&entry);
                        prop_assert_eq!(newest.ts, model.newest(key));
                        let live = model.keys.get(&key).and_then(|c| c.last()).is_some_and(|v| v.value.is_some());
                        prop_assert_eq!(newest.live, live);
                    } else {
                        prop_assert!(model.keys.get(&key).is_none_or(|c| c.is_empty()));
                    }
                }
                Op::Scan { start, end, ts, limit } => {
                    let ts = ts.max(model.floor);
                    let want: Vec<(Bytes, Bytes)> = (0..KEYS)
                        .filter(|k| (start, end).contains(k))
                        .filter_map(|k| model.visible(k, ts).and_then(|v| v.value.clone()).map(|v| (Bytes::from(vec![k]), v)))
                        .take(limit)
                        .collect();
                    let (start, end) = (start.map(|k| [k]), end.map(|k| [k]));
                    prop_assert_eq!(store.scan_at(as_slice(&start), as_slice(&end), ts, limit), want);
                }
                Op::Gc { watermark } => {
                    let before: Vec<usize> = model.keys.values().map(Vec::len).collect();
                    let keys: Vec<u8> = model.keys.keys().copied().collect();
                    for key in keys {
                        model.collect_key(key, watermark);
                    }
                    let dropped: usize = before.iter().sum::<usize>() - model.keys.values().map(Vec::len).sum::<usize>();
                    let stats = store.gc(watermark);
                    prop_assert_eq!(stats.versions_dropped, dropped as u64);
                }
            }
            let report = store.report();
            let versions: usize = model.keys.values().map(Vec::len).sum();
            prop_assert_eq!(report.versions, versions as u64);
            prop_assert_eq!(report.keys, model.keys.len() as u64);
            let bytes: u64 = model
                .keys
                .values()
                .map(|chain| 1 + chain.iter().map(|v| v.value.as_ref().map_or(0, |b| b.len() as u64)).sum::<u64>())
                .sum();
            prop_assert_eq!(report.bytes, bytes);
        }
    }
}
