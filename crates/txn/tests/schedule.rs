//! The in-block schedulers on the thesis's worked examples, its micro-benchmarks and random
//! blocks.

use proptest::prelude::*;
use virga_txn::schedule::{
    cut_batch, cycles_of_length, interleaved_conflicts, schedule, validate_in_order, AbortCause, Schedule,
    ScheduleConfig, Scheduler, TxAccess, Version, HOT_KEY_CLIQUE,
};

fn tx(reads: &[u32], writes: &[u32]) -> TxAccess<u32> {
    TxAccess::new(reads.to_vec(), writes.to_vec())
}

fn run<K: Eq + std::hash::Hash>(txs: &[TxAccess<K>], scheduler: Scheduler) -> Schedule {
    schedule(txs, &ScheduleConfig::new(scheduler))
}

/// Order plus aborted indices are exactly `0..n`, aborted sorted, and every kept transaction
/// survives validation in the order given.
fn assert_well_formed<K: Eq + std::hash::Hash>(txs: &[TxAccess<K>], s: &Schedule) {
    let mut all: Vec<usize> = s.order.iter().copied().chain(s.aborted.iter().map(|&(i, _)| i)).collect();
    assert!(s.aborted.windows(2).all(|w| w[0].0 < w[1].0), "aborted sorted by index");
    all.sort_unstable();
    assert_eq!(all, (0..txs.len()).collect::<Vec<_>>(), "a permutation of the input");
    assert_eq!(validate_in_order(txs, &s.order), s.order.len(), "every kept transaction validates");
    assert_eq!(s.stats.kept, s.order.len());
    assert_eq!(s.stats.txs, txs.len());
}

/// Tables 3.1 and 3.2 with T1..T4 at indices 0..3 and k1..k4 as 1..4.
fn table_3_1() -> Vec<TxAccess<u32>> {
    vec![tx(&[], &[1]), tx(&[1, 2], &[2]), tx(&[1, 3], &[3]), tx(&[1, 3], &[4])]
}

#[test]
fn table_3_1_arrival_keeps_one() {
    let txs = table_3_1();
    let s = run(&txs, Scheduler::Arrival);
    assert_well_formed(&txs, &s);
    assert_eq!(s.order, vec![0]);
    let expected: Vec<_> = (1..4).map(|i| (i, AbortCause::ReadsEarlierWrite { writer: 0 })).collect();
    assert_eq!(s.aborted, expected);
    assert_eq!(s.stats.reads_earlier_write, 3);
}

#[test]
fn table_3_2_fabric_plus_plus_keeps_all_four() {
    let txs = table_3_1();
    let s = run(&txs, Scheduler::FabricPlusPlus);
    assert_well_formed(&txs, &s);
    // T4, T3, T2, T1: the thesis prints T4, T2, T3, T1, equally valid (T2 and T3 do not
    // conflict); step 5 visits T2 before T3 and so appends it first, then reverses.
    assert_eq!(s.order, vec![3, 2, 1, 0]);
    assert!(s.aborted.is_empty());
    assert_eq!(validate_in_order(&txs, &[3, 1, 2, 0]), 4, "the thesis's own order");
    assert_eq!(s.stats.cycles, 0);
    assert_eq!(s.stats.conflict_edges, 4, "T1 -> T2, T3, T4 and T3 -> T4");
}

/// Table 3.3: T0..T5 over K0..K9.
fn table_3_3() -> Vec<TxAccess<u32>> {
    vec![
        tx(&[0, 1], &[2]),
        tx(&[3, 4, 5], &[0]),
        tx(&[6, 7], &[3, 9]),
        tx(&[2, 8], &[1, 4]),
        tx(&[9], &[5, 6, 8]),
        tx(&[], &[7]),
    ]
}

#[test]
fn table_3_3_reorders_to_t5_t1_t3_t4() {
    let txs = table_3_3();
    let s = run(&txs, Scheduler::FabricPlusPlus);
    assert_well_formed(&txs, &s);
    assert_eq!(s.order, vec![5, 1, 3, 4]);
    assert_eq!(s.aborted, vec![(0, AbortCause::ConflictCycle), (2, AbortCause::ConflictCycle)]);
    let st = &s.stats;
    assert_eq!((st.cycles, st.longest_cycle, st.nontrivial_sccs, st.largest_scc), (3, 3, 2, 3));
    assert_eq!((st.rounds, st.budget_exhausted_sccs, st.readded, st.arrival_fallback), (1, 0, 0, false));
    assert_eq!(st.conflict_edges, 10);
    assert_eq!(st.conflict_cycles, 2);
}

#[test]
fn table_3_3_in_arrival_order() {
    let txs = table_3_3();
    let s = run(&txs, Scheduler::Arrival);
    assert_well_formed(&txs, &s);
    // T0 kept (writes K2); T1 kept (writes K0); T2 kept; T3 reads K2 (T0); T4 reads K9
    // (T2); T5 kept.
    assert_eq!(s.order, vec![0, 1, 2, 5]);
    assert_eq!(
        s.aborted,
        vec![(3, AbortCause::ReadsEarlierWrite { writer: 0 }), (4, AbortCause::ReadsEarlierWrite { writer: 2 })]
    );
}

#[test]
fn stale_read_is_aborted_early() {
    // Figure 3.8: simulation started at last-block-ID 4; balA read at block 4, balB at 5.
    let txs = vec![
        TxAccess::new(vec!["balA", "balB"], vec!["balA"])
            .with_versions(vec![Some(Version::new(4, 0)), Some(Version::new(5, 1))], Some(4)),
        TxAccess::new(vec!["balA"], vec!["balC"]).with_versions(vec![Some(Version::new(4, 0))], Some(4)),
    ];
    let s = run(&txs, Scheduler::FabricPlusPlus);
    assert_well_formed(&txs, &s);
    assert_eq!(s.order, vec![1]);
    let cause = AbortCause::StaleRead { read: 1, version: Version::new(5, 1), snapshot: 4 };
    assert_eq!(s.aborted, vec![(0, cause)]);
    assert_eq!(cause.name(), "stale_read");
    assert_eq!(s.stats.stale_reads, 1);

    // Without early abort, or in arrival order, the stale read is not detected here.
    let off = ScheduleConfig { early_abort: false, ..ScheduleConfig::default() };
    assert_eq!(schedule(&txs, &off).kept(), 2);
    assert_eq!(run(&txs, Scheduler::Arrival).aborted, vec![(1, AbortCause::ReadsEarlierWrite { writer: 0 })]);
}

#[test]
fn version_mismatch_aborts_the_older_reader() {
    // T6 read v1 of k, T7 (later in the block) read v2: T6 is doomed.
    let v1 = Version::new(3, 2);
    let v2 = Version::new(4, 0);
    let txs = vec![
        TxAccess::new(vec!["k"], vec!["x"]).with_versions(vec![Some(v1)], Some(4)),
        TxAccess::new(vec!["k"], vec!["y"]).with_versions(vec![Some(v2)], Some(4)),
        // Same key, version unknown: not compared.
        TxAccess::new(vec!["k"], vec!["z"]),
        // The older reader may also come later in the block.
        TxAccess::new(vec!["y", "k"], vec![]).with_versions(vec![None, Some(v1)], None),
    ];
    let s = run(&txs, Scheduler::FabricPlusPlus);
    assert_well_formed(&txs, &s);
    let cause = |read| AbortCause::VersionMismatch { read, version: v1, newer: v2 };
    assert_eq!(s.aborted, vec![(0, cause(0)), (3, cause(1))]);
    // No conflict left: step 5 appends in index order and reverses.
    assert_eq!(s.order, vec![2, 1]);
    assert_eq!(s.stats.version_mismatches, 2);
    assert_eq!(cause(0).name(), "version_mismatch");
    assert_eq!(serde_json::to_value(cause(0)).unwrap()["cause"], "version_mismatch");
}

#[test]
fn stale_readers_do_not_set_the_newest_version() {
    // Only the transactions left after the stale-read check are compared.
    let txs = vec![
        TxAccess::new(vec![1u8], vec![]).with_versions(vec![Some(Version::new(9, 0))], Some(5)),
        TxAccess::new(vec![1u8], vec![]).with_versions(vec![Some(Version::new(5, 0))], Some(5)),
    ];
    let s = run(&txs, Scheduler::FabricPlusPlus);
    assert_eq!(s.order, vec![1]);
    assert_eq!(s.aborted[0].1.name(), "stale_read");
}

#[test]
fn names_parse_and_print() {
    let names: Vec<String> = Scheduler::ALL.iter().map(Scheduler::to_string).collect();
    assert_eq!(names, ["arrival", "fabricpp"]);
    let names: Vec<_> = [
        AbortCause::StaleRead { read: 0, version: Version::new(1, 0), snapshot: 0 },
        AbortCause::VersionMismatch { read: 0, version: Version::new(1, 0), newer: Version::new(2, 0) },
        AbortCause::ConflictCycle,
        AbortCause::ReadsEarlierWrite { writer: 0 },
    ]
    .iter()
    .map(AbortCause::name)
    .collect();
    assert_eq!(names, AbortCause::NAMES);
}

#[test]
fn interleaved_conflicts_are_all_kept_by_fabric_plus_plus() {
    let n = 64;
    assert_eq!(interleaved_conflicts(6, 1)[0], tx_u64(&[2], &[]), "S2 starts with r(k3)");
    for shift in 0..=n {
        let txs = interleaved_conflicts(n, shift);
        assert_eq!(txs.len(), n);
        let fpp = run(&txs, Scheduler::FabricPlusPlus);
        assert_well_formed(&txs, &fpp);
        assert_eq!(fpp.kept(), n, "shift {shift}");
        let arrival = run(&txs, Scheduler::Arrival);
        assert_well_formed(&txs, &arrival);
        // Reader i is invalid exactly when writer i precedes it: shifts up to n/2 move
        // readers ahead of all writers, larger ones move writers ahead of readers again.
        let conflicts = (shift % n).abs_diff(n / 2);
        assert_eq!(arrival.kept(), n - conflicts, "shift {shift}");
    }
    assert_eq!(run(&interleaved_conflicts(n, 0), Scheduler::Arrival).kept(), n / 2);
    assert_eq!(run(&interleaved_conflicts(7, 0), Scheduler::FabricPlusPlus).kept(), 7);
}

fn tx_u64(reads: &[u64], writes: &[u64]) -> TxAccess<u64> {
    TxAccess::new(reads.to_vec(), writes.to_vec())
}

#[test]
fn cycles_of_length_shape() {
    let g = cycles_of_length(8, 4);
    let expected = [tx_u64(&[0], &[0]), tx_u64(&[0], &[1]), tx_u64(&[1], &[2]), tx_u64(&[2], &[0]), tx_u64(&[3], &[3])];
    assert_eq!(&g[..5], &expected);
    assert_eq!(cycles_of_length(10, 4).len(), 10, "a shorter last group");
    assert_eq!(cycles_of_length(3, 0).len(), 3);
}

#[test]
fn cycles_of_length_arrival_keeps_half_fabric_plus_plus_keeps_more_as_cycles_lengthen() {
    let n = 256;
    let mut last = 0;
    for t in [2, 4, 8, 16, 64] {
        let txs = cycles_of_length(n, t);
        let arrival = run(&txs, Scheduler::Arrival);
        assert_well_formed(&txs, &arrival);
        assert_eq!(arrival.kept(), n / 2, "t = {t}");
        let fpp = run(&txs, Scheduler::FabricPlusPlus);
        assert_well_formed(&txs, &fpp);
        // One abort per group breaks both its cycles (the t-cycle and the (t-1)-cycle).
        assert_eq!(fpp.kept(), n - n / t, "t = {t}");
        assert!(fpp.kept() >= last);
        last = fpp.kept();
        let expected_cycles = if t == 2 { n / 2 } else { 2 * n / t };
        assert_eq!(fpp.stats.cycles, expected_cycles, "t = {t}");
        assert_eq!(fpp.stats.longest_cycle, t);
    }
}

#[test]
fn a_hot_key_clique_falls_back_and_stays_fast() {
    // Every transaction reads and writes one hot key, plus a private key: a clique of
    // 2-cycles with astronomically many elementary cycles. Below the hot-key threshold the
    // cycle budget's fallback breaks it.
    let n = 40u64;
    assert!((n as usize) < HOT_KEY_CLIQUE);
    let txs: Vec<_> = (0..n).map(|i| tx_u64(&[0, 1 + i], &[0, 1 + i])).collect();
    let s = run(&txs, Scheduler::FabricPlusPlus);
    assert_well_formed(&txs, &s);
    assert_eq!(s.order, vec![39], "the cover takes the smallest indices first");
    assert_eq!(s.stats.budget_exhausted_sccs, 1);
    assert_eq!(s.stats.budget_exhausted_rounds, 1);
    assert_eq!(s.stats.cycles, 0, "skipped by the E - N + 1 bound");
    assert_eq!(s.stats.hot_clique_removed, 0);
    assert_eq!(run(&txs, Scheduler::Arrival).kept(), 1);

    // At the threshold and above, the clique is thinned before any graph is built.
    let n = 400u64;
    let txs: Vec<_> = (0..n).map(|i| tx_u64(&[0, 1 + i], &[0, 1 + i])).collect();
    let s = run(&txs, Scheduler::FabricPlusPlus);
    assert_well_formed(&txs, &s);
    assert_eq!(s.order, vec![399], "equal widths: the latest is kept");
    assert_eq!(s.stats.hot_clique_removed, 399);
    assert_eq!(s.stats.conflict_edges, 0);
}

#[test]
fn a_budget_too_small_for_the_thesis_example_still_schedules() {
    let txs = table_3_3();
    let config = ScheduleConfig { cycle_budget: 1, ..ScheduleConfig::default() };
    let s = schedule(&txs, &config);
    assert_well_formed(&txs, &s);
    assert!(s.stats.budget_exhausted_sccs >= 1);
    assert_eq!(s.kept(), 4);
}

#[test]
fn without_two_cycles_the_fallback_removes_one_per_round_and_re_add_repairs_it() {
    // Groups of 4 have a 4-cycle and a 3-cycle and no 2-cycle; with a budget of 1 each
    // group exceeds it (5 edges, 4 nodes: at least 2 cycles). The fallback removes T0, in
    // the one cycle enumerated; the next round breaks the 3-cycle by removing T1; T0 then
    // closes no cycle and is put back: the thesis's own result, T1 aborted.
    let txs = cycles_of_length(16, 4);
    let config = ScheduleConfig { cycle_budget: 1, ..ScheduleConfig::default() };
    let s = schedule(&txs, &config);
    assert_well_formed(&txs, &s);
    let st = &s.stats;
    assert_eq!((st.rounds, st.budget_exhausted_sccs, st.budget_exhausted_rounds), (2, 4, 1));
    assert_eq!((st.cycles, st.readded, st.conflict_cycles), (8, 4, 4));
    let expected: Vec<_> = (0..4).map(|g| (4 * g + 1, AbortCause::ConflictCycle)).collect();
    assert_eq!(s.aborted, expected);
    assert_eq!(s.order, schedule(&txs, &ScheduleConfig::default()).order);
}

#[test]
fn fabric_plus_plus_falls_back_to_arrival_when_greedy_over_removes() {
    // Conflicts (writer -> reader): A <-> E, C <-> E, B <-> D, A -> B, D -> A, D -> E,
    // E -> A, C -> A. A and E are in five cycles each, so the greedy removes A first; the
    // 2-cycles B-D and C-E then cost two more. Removing B and E alone breaks every cycle,
    // and arrival order happens to do just that.
    let txs = vec![
        tx(&[2, 0], &[0]), // A
        tx(&[0], &[1]),    // B
        tx(&[2], &[2]),    // C
        tx(&[1], &[0]),    // D
        tx(&[2, 0], &[2]), // E
    ];
    let arrival = run(&txs, Scheduler::Arrival);
    assert_eq!(arrival.order, vec![0, 2, 3]);
    let fpp = run(&txs, Scheduler::FabricPlusPlus);
    assert_well_formed(&txs, &fpp);
    assert!(fpp.stats.arrival_fallback);
    assert_eq!(fpp.stats.cycles, 7);
    assert_eq!(fpp.order, arrival.order);
    assert_eq!(fpp.aborted, arrival.aborted);
    assert_eq!(fpp.stats.reads_earlier_write, 2);
    assert_eq!(fpp.stats.conflict_cycles, 0);
}

#[test]
fn cut_batch_counts_unique_keys() {
    let txs = vec![tx(&[1, 2], &[2]), tx(&[2], &[3]), tx(&[4, 5], &[]), tx(&[1], &[])];
    assert_eq!(cut_batch(&txs, 10, 3), 2, "keys 1, 2, 3 fit; 4 and 5 do not");
    assert_eq!(cut_batch(&txs, 10, 5), 4);
    assert_eq!(cut_batch(&txs, 3, 100), 3);
    assert_eq!(cut_batch(&txs, 0, 100), 1);
    assert_eq!(cut_batch(&txs, 10, 1), 1, "an oversized transaction forms a block alone");
    assert_eq!(cut_batch(&txs[2..], 10, 2), 1, "keys 4, 5 and then 1 would make three");
    assert_eq!(cut_batch::<u32>(&[], 10, 10), 0);
}

#[test]
fn validate_in_order_ignores_self_conflicts_and_bad_indices() {
    let txs = vec![tx(&[1], &[1]), tx(&[1], &[])];
    assert_eq!(validate_in_order(&txs, &[0, 1]), 1);
    assert_eq!(validate_in_order(&txs, &[1, 0]), 2);
    assert_eq!(validate_in_order(&txs, &[1, 7, 0]), 2);
}

fn arb_version() -> impl Strategy<Value = Option<Version>> {
    prop::option::of((0u64..4, 0u32..3).prop_map(|(b, t)| Version::new(b, t)))
}

fn arb_tx(keys: u8) -> impl Strategy<Value = TxAccess<u8>> {
    (
        prop::collection::vec((0..keys, arb_version()), 0..4),
        prop::collection::vec(0..keys, 0..4),
        prop::option::of(0u64..4),
    )
        .prop_map(|(reads, writes, snapshot)| {
            let (reads, versions): (Vec<u8>, Vec<Option<Version>>) = reads.into_iter().unzip();
            TxAccess::new(reads, writes).with_versions(versions, snapshot)
        })
}

fn arb_block() -> impl Strategy<Value = Vec<TxAccess<u8>>> {
    (2u8..12).prop_flat_map(|keys| prop::collection::vec(arb_tx(keys), 0..24))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    #[test]
    fn random_blocks_schedule_validly(txs in arb_block(), budget in 1usize..6) {
        let arrival = run(&txs, Scheduler::Arrival);
        assert_well_formed(&txs, &arrival);
        prop_assert_eq!(arrival.kept(), validate_in_order(&txs, &(0..txs.len()).collect::<Vec<_>>()));

        for early_abort in [false, true] {
            for cycle_budget in [20_000, budget] {
                let config = ScheduleConfig { scheduler: Scheduler::FabricPlusPlus, early_abort, cycle_budget };
                let fpp = schedule(&txs, &config);
                assert_well_formed(&txs, &fpp);
                prop_assert_eq!(&fpp, &schedule(&txs, &config), "deterministic");
                // Never fewer than arrival order of the transactions early abort left.
                let survivors: Vec<usize> = (0..txs.len())
                    .filter(|i| !fpp.aborted.iter().any(|(j, c)| j == i && c.is_early()))
                    .collect();
                prop_assert!(fpp.kept() >= validate_in_order(&txs, &survivors));
                if !early_abort {
                    prop_assert!(fpp.kept() >= arrival.kept());
                    prop_assert_eq!(fpp.stats.stale_reads + fpp.stats.version_mismatches, 0);
                }
                if fpp.stats.budget_exhausted_sccs == 0 {
                    prop_assert!(fpp.stats.rounds <= 1, "within budget: one round, as in the thesis");
                }
                // Early aborts are what the rules say.
                for &(i, cause) in &fpp.aborted {
                    match cause {
                        AbortCause::StaleRead { read, version, snapshot } => {
                            prop_assert_eq!(txs[i].snapshot, Some(snapshot));
                            prop_assert_eq!(txs[i].read_versions[read], Some(version));
                            prop_assert!(version.block > snapshot);
                        }
                        AbortCause::VersionMismatch { read, version, newer } => {
                            prop_assert!(newer > version);
                            prop_assert_eq!(txs[i].read_versions[read], Some(version));
                        }
                        AbortCause::ConflictCycle => prop_assert!(!fpp.stats.arrival_fallback),
                        AbortCause::ReadsEarlierWrite { .. } => prop_assert!(fpp.stats.arrival_fallback),
                    }
                }
                // No kept transaction read an older version of a key than another kept one.
                if early_abort {
                    for &a in &fpp.order {
                        for &b in &fpp.order {
                            for (ra, ka) in txs[a].reads.iter().enumerate() {
                                for (rb, kb) in txs[b].reads.iter().enumerate() {
                                    if let (true, Some(va), Some(vb)) = (ka == kb, txs[a].read_versions[ra], txs[b].read_versions[rb]) {
                                        prop_assert_eq!(va, vb);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn cut_batch_respects_both_limits(txs in arb_block(), max_txs in 0usize..30, max_keys in 0usize..12) {
        let cut = cut_batch(&txs, max_txs, max_keys);
        prop_assert!(cut <= txs.len());
        prop_assert!(cut <= max_txs.max(1));
        prop_assert_eq!(cut == 0, txs.is_empty());
        let keys = |n: usize| {
            let mut all: Vec<u8> = txs[..n].iter().flat_map(|t| t.reads.iter().chain(&t.writes).copied()).collect();
            all.sort_unstable();
            all.dedup();
            all.len()
        };
        prop_assert!(cut <= 1 || keys(cut) <= max_keys);
        if cut < txs.len() && cut < max_txs.max(1) {
            prop_assert!(keys(cut + 1) > max_keys, "cut only when the next would overflow");
        }
    }
}

/// A hot key read and written by many transactions, among readers of it and transactions
/// on other keys: the clique is thinned to one before the graph is built, and the result
/// still validates, keeps every reader and every transaction elsewhere, and never keeps
/// fewer than arrival order.
#[test]
fn hot_key_cliques_are_thinned_to_one_and_the_schedule_stays_valid() {
    let mut txs: Vec<TxAccess<u64>> = Vec::new();
    for i in 0..300u64 {
        match i % 3 {
            // read-modify-write of the hot key 0 (the narrowest when it touches only key 0)
            0 => txs.push(TxAccess::new(vec![0], vec![0])),
            1 => txs.push(TxAccess::new(vec![0, 1000 + i], vec![0, 1000 + i])),
            // a reader of the hot key
            _ => txs.push(TxAccess::new(vec![0], vec![2000 + i])),
        }
    }
    let result = schedule(&txs, &ScheduleConfig::default());
    assert!(result.stats.hot_clique_removed >= HOT_KEY_CLIQUE - 1, "{:?}", result.stats);
    assert_eq!(validate_in_order(&txs, &result.order), result.order.len());
    let kept_writers: Vec<usize> = result.order.iter().copied().filter(|&i| i % 3 != 2).collect();
    assert_eq!(kept_writers, vec![297], "one writer survives: the narrowest, latest");
    assert_eq!(result.order.len(), 1 + 100, "every reader is kept, before the writer");
    assert_eq!(result.order.last(), Some(&297));
    let arrival = schedule(&txs, &ScheduleConfig::new(Scheduler::Arrival));
    assert!(result.order.len() >= arrival.order.len());
}
