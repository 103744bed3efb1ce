//! Unit tests of the graph algorithms against brute force.

use proptest::prelude::*;

use super::graph::{self, Cycles, Graph, Johnson, Rows, SubGraph, Tarjan};

fn graph_from_edges(n: usize, edges: &[(u32, u32)]) -> Graph {
    let mut lists = vec![Vec::new(); n];
    for &(u, v) in edges {
        if u != v && !lists[u as usize].contains(&v) {
            lists[u as usize].push(v);
        }
    }
    let mut out = Rows::default();
    for mut children in lists {
        children.sort_unstable();
        children.into_iter().for_each(|v| out.push(v));
        out.end_row();
    }
    let inc = out.transpose(n);
    Graph { out, inc }
}

fn adjacency(g: &Graph) -> Vec<Vec<u32>> {
    (0..g.len()).map(|v| g.out.row(v).to_vec()).collect()
}

fn sccs(g: &Graph) -> Vec<Vec<u32>> {
    let mut comps = Rows::default();
    Tarjan::default().run(&g.out, &vec![true; g.len()], &mut comps);
    let mut comps: Vec<Vec<u32>> = (0..comps.len()).map(|c| comps.row(c).to_vec()).collect();
    comps.sort_unstable();
    comps
}

fn enumerate(sub: &SubGraph, limit: usize) -> (bool, Cycles) {
    let mut cycles = Cycles::default();
    let complete = Johnson::default().enumerate(sub, limit, &mut cycles);
    (complete, cycles)
}

fn longest(cycles: &Cycles) -> usize {
    (0..cycles.len()).map(|c| cycles.row(c).len()).max().unwrap_or(0)
}

fn whole(graph: &Graph) -> SubGraph {
    let members: Vec<u32> = (0..graph.len() as u32).collect();
    SubGraph::induced(graph, &members, &mut vec![u32::MAX; graph.len()])
}

/// Simple cycles counted by plain DFS from each start over larger nodes only.
fn brute_force_cycles(out: &[Vec<u32>]) -> usize {
    fn walk(out: &[Vec<u32>], s: u32, v: u32, on_path: &mut Vec<bool>) -> usize {
        let mut found = 0;
        for &w in &out[v as usize] {
            if w == s {
                found += 1;
            } else if w > s && !on_path[w as usize] {
                on_path[w as usize] = true;
                found += walk(out, s, w, on_path);
                on_path[w as usize] = false;
            }
        }
        found
    }
    (0..out.len() as u32).map(|s| walk(out, s, s, &mut vec![false; out.len()])).sum()
}

fn complete(n: u32) -> Graph {
    let edges: Vec<(u32, u32)> = (0..n).flat_map(|u| (0..n).map(move |v| (u, v))).collect();
    graph_from_edges(n as usize, &edges)
}

#[test]
fn complete_digraphs_have_the_known_cycle_counts() {
    // Sum over k >= 2 of C(n, k) (k - 1)!.
    for (n, expected) in [(2, 1), (3, 5), (4, 20), (5, 84), (6, 409)] {
        let sub = whole(&complete(n));
        let (complete, cycles) = enumerate(&sub, usize::MAX);
        assert!(complete);
        assert_eq!(cycles.len(), expected, "K{n}");
        assert_eq!(longest(&cycles), n as usize);
        assert!(sub.cycle_lower_bound() <= expected);
    }
}

#[test]
fn the_budget_stops_the_enumeration_at_exactly_the_limit() {
    let sub = whole(&complete(5));
    let (complete, cycles) = enumerate(&sub, 10);
    assert!(!complete);
    assert_eq!(cycles.len(), 10);
    let (complete, cycles) = enumerate(&sub, 84);
    assert!(complete, "exactly the budget is complete");
    assert_eq!(cycles.len(), 84);
}

#[test]
fn the_thesis_graph_has_three_cycles_in_two_components() {
    // Figure 3.3, edges writer -> reader.
    let edges = [(0, 3), (1, 0), (2, 1), (2, 4), (3, 0), (3, 1), (4, 1), (4, 2), (4, 3), (5, 2)];
    let g = graph_from_edges(6, &edges);
    let comps = sccs(&g);
    assert_eq!(comps, vec![vec![0, 1, 3], vec![2, 4]]);
    let mut pos = vec![u32::MAX; 6];
    let sub = SubGraph::induced(&g, &comps[0], &mut pos);
    let (complete, cycles) = enumerate(&sub, 100);
    assert!(complete);
    assert_eq!(cycles.len(), 2);
    let counts = graph::cycle_counts(&cycles, 3);
    assert_eq!(counts, vec![2, 1, 2], "Table 3.4 for T0, T1, T3");
    assert_eq!(graph::greedy_hitting_set(&cycles, 3), vec![0], "T0 goes first and clears both");
}

#[test]
fn the_two_cycle_cover_of_a_clique_leaves_one_node() {
    let g = complete(7);
    let members: Vec<u32> = (0..7).collect();
    let partners = graph::two_cycle_partners(&g, &members, &mut [u32::MAX; 7]);
    assert_eq!(partners.total(), 42);
    assert_eq!(partners.row(3), &[0, 1, 2, 4, 5, 6]);
    assert_eq!(graph::greedy_two_cycle_cover(&partners), vec![0, 1, 2, 3, 4, 5]);
    // A path with one 2-cycle in the middle: 0 -> 1 <-> 2 -> 3.
    let g = graph_from_edges(4, &[(0, 1), (1, 2), (2, 1), (2, 3)]);
    let partners = graph::two_cycle_partners(&g, &[0, 1, 2, 3], &mut [u32::MAX; 4]);
    assert_eq!((0..4).map(|v| partners.row(v).to_vec()).collect::<Vec<_>>(), vec![vec![], vec![2], vec![1], vec![]]);
    assert_eq!(graph::greedy_two_cycle_cover(&partners), vec![1]);
}

#[test]
fn step_five_reproduces_the_thesis_walk() {
    // C(S') of Figure 3.5 on T1, T3, T4, T5 (graph ids 0..4): T3 -> T1, T4 -> T1, T4 -> T3.
    let g = graph_from_edges(4, &[(1, 0), (2, 0), (2, 1)]);
    assert_eq!(graph::thesis_order(&g, &[true; 4]), vec![3, 0, 1, 2]);
}

fn arb_graph() -> impl Strategy<Value = (usize, Vec<(u32, u32)>)> {
    (2usize..8).prop_flat_map(|n| (Just(n), prop::collection::vec((0..n as u32, 0..n as u32), 0..n * 3)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn johnson_matches_brute_force_and_the_lower_bound_holds((n, edges) in arb_graph()) {
        let g = graph_from_edges(n, &edges);
        let sub = whole(&g);
        let (complete, cycles) = enumerate(&sub, usize::MAX);
        prop_assert!(complete);
        prop_assert_eq!(cycles.len(), brute_force_cycles(&adjacency(&g)));
        // Every reported cycle is elementary and closed.
        for c in 0..cycles.len() {
            let cyc = cycles.row(c);
            let mut seen = cyc.to_vec();
            seen.sort_unstable();
            seen.dedup();
            prop_assert_eq!(seen.len(), cyc.len());
            for (i, &v) in cyc.iter().enumerate() {
                let next = cyc[(i + 1) % cyc.len()];
                prop_assert!(g.out.row(v as usize).contains(&next));
            }
        }
        // Per strongly connected component: E - N + 1 <= cycles.
        let mut pos = vec![u32::MAX; n];
        let mut in_some = 0;
        for comp in sccs(&g) {
            let sub = SubGraph::induced(&g, &comp, &mut pos);
            let (complete, comp_cycles) = enumerate(&sub, usize::MAX);
            prop_assert!(complete);
            prop_assert!(sub.cycle_lower_bound() <= comp_cycles.len());
            in_some += comp_cycles.len();
        }
        prop_assert_eq!(in_some, cycles.len(), "every cycle lies in one component");
        // A budget below the count stops at exactly the budget.
        if !cycles.is_empty() {
            let (complete, partial) = enumerate(&sub, cycles.len() - 1);
            prop_assert!(!complete);
            prop_assert_eq!(partial.len(), cycles.len() - 1);
        }
    }

    #[test]
    fn step_five_orders_every_reader_before_its_writers((n, edges) in arb_graph()) {
        // Keep only forward edges u < v: a DAG.
        let dag: Vec<(u32, u32)> = edges.into_iter().filter(|&(u, v)| u < v).collect();
        let g = graph_from_edges(n, &dag);
        let order = graph::thesis_order(&g, &vec![true; n]);
        let mut at = vec![usize::MAX; n];
        for (p, &v) in order.iter().enumerate() {
            at[v as usize] = p;
        }
        prop_assert!(at.iter().all(|&p| p != usize::MAX));
        for &(w, r) in &dag {
            prop_assert!(at[r as usize] < at[w as usize]);
        }
    }
}
