//! The conflict graph of a block and the graph algorithms Fabric++ runs on it: strongly
//! connected components (Tarjan), elementary cycles (Johnson) under a budget, greedy cycle
//! breaking, the re-add acyclicity check and the thesis's step-5 schedule.
//!
//! Nodes are dense ids `0..m` assigned in ascending input index, so "smallest id" is always
//! "smallest transaction index". Every adjacency row is sorted ascending and all loops run
//! in id order: nothing here depends on hashing.

use std::collections::HashMap;
use std::hash::Hash;

/// Marks "no vertex" in position maps and stamp arrays.
const NONE: u32 = u32::MAX;

/// Rows of `u32`s stored back to back (compressed sparse rows).
#[derive(Clone, Debug)]
pub(super) struct Rows {
    start: Vec<u32>,
    items: Vec<u32>,
}

impl Default for Rows {
    fn default() -> Self {
        Rows { start: vec![0], items: Vec::new() }
    }
}

impl Rows {
    /// Empty, with room for `rows` rows and `items` items.
    pub(super) fn with_capacity(rows: usize, items: usize) -> Rows {
        let mut start = Vec::with_capacity(rows + 1);
        start.push(0);
        Rows { start, items: Vec::with_capacity(items) }
    }

    /// Removes every row.
    pub(super) fn clear(&mut self) {
        self.start.truncate(1);
        self.items.clear();
    }

    /// Number of rows.
    pub(super) fn len(&self) -> usize {
        self.start.len() - 1
    }

    /// Whether there is no row.
    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of items in all rows.
    pub(super) fn total(&self) -> usize {
        self.items.len()
    }

    /// Row `r`.
    pub(super) fn row(&self, r: usize) -> &[u32] {
        &self.items[self.start[r] as usize..self.start[r + 1] as usize]
    }

    /// Appends an item to the row being built.
    pub(super) fn push(&mut self, x: u32) {
        self.items.push(x);
    }

    /// Closes the row being built.
    pub(super) fn end_row(&mut self) {
        self.start.push(self.items.len() as u32);
    }

    /// Sorts the row being built.
    fn sort_open_row(&mut self) {
        let from = self.start[self.len()] as usize;
        self.items[from..].sort_unstable();
    }

    /// Row `c` of the result lists the rows that hold `c`, ascending (`columns` rows).
    pub(super) fn transpose(&self, columns: usize) -> Rows {
        let mut start = vec![0u32; columns + 1];
        for &c in &self.items {
            start[c as usize + 1] += 1;
        }
        for c in 0..columns {
            start[c + 1] += start[c];
        }
        let mut fill = start.clone();
        let mut items = vec![0u32; self.items.len()];
        for r in 0..self.len() {
            for &c in self.row(r) {
                items[fill[c as usize] as usize] = r as u32;
                fill[c as usize] += 1;
            }
        }
        Rows { start, items }
    }
}

/// Each transaction's keys, interned to dense ids in order of first appearance.
pub(super) struct Interned {
    /// Key ids read, one row per input transaction, in the order given.
    pub reads: Rows,
    /// Key ids written, one row per input transaction, in the order given.
    pub writes: Rows,
    /// Number of distinct keys.
    pub keys: usize,
}

impl Interned {
    /// Interns every key of `txs` (reads before writes, transactions in index order).
    pub(super) fn new<K: Eq + Hash>(txs: &[super::TxAccess<K>]) -> Interned {
        let n_reads = txs.iter().map(|t| t.reads.len()).sum();
        let n_writes = txs.iter().map(|t| t.writes.len()).sum();
        // The map is only probed, never iterated: ids follow first appearance.
        let mut ids: HashMap<&K, u32> = HashMap::with_capacity(n_reads + n_writes);
        let mut reads = Rows::with_capacity(txs.len(), n_reads);
        let mut writes = Rows::with_capacity(txs.len(), n_writes);
        for tx in txs {
            for (keys, rows) in [(&tx.reads, &mut reads), (&tx.writes, &mut writes)] {
                for k in keys {
                    let next = ids.len() as u32;
                    rows.push(*ids.entry(k).or_insert(next));
                }
                rows.end_row();
            }
        }
        Interned { reads, writes, keys: ids.len() }
    }
}

/// A directed conflict graph: an edge `w -> r` when transaction `w` writes a key that
/// transaction `r != w` reads (the writer is the parent; the reader must be applied first).
pub(super) struct Graph {
    /// Children (readers of what the node writes), ascending.
    pub out: Rows,
    /// Parents (writers of what the node reads), ascending.
    pub inc: Rows,
}

impl Graph {
    /// Builds the graph over `nodes` (input indices, ascending); node `g` of the graph is
    /// `nodes[g]`. Edges come from per-key reader lists, deduplicated with a stamp array,
    /// so the cost is the number of (writer, reader) pairs sharing a key, not n² × keys.
    pub(super) fn build(interned: &Interned, nodes: &[usize]) -> Graph {
        let m = nodes.len();
        let by_key = |rows: &Rows| {
            let mut local = Rows::with_capacity(m, 0);
            for &i in nodes {
                rows.row(i).iter().for_each(|&k| local.push(k));
                local.end_row();
            }
            local.transpose(interned.keys)
        };
        let readers = by_key(&interned.reads);
        let writers = by_key(&interned.writes);
        // Children from what each node writes, parents from what it reads: both built row
        // by row, so neither needs a scattered transpose of all edges.
        let mut stamp = vec![NONE; m];
        let adjacent = |own: &Rows, others: &Rows, stamp: &mut [u32]| {
            stamp.fill(NONE);
            let mut rows = Rows::with_capacity(m, 0);
            for (v, &i) in nodes.iter().enumerate() {
                for &k in own.row(i) {
                    for &w in others.row(k as usize) {
                        if w as usize != v && stamp[w as usize] != v as u32 {
                            stamp[w as usize] = v as u32;
                            rows.push(w);
                        }
                    }
                }
                rows.sort_open_row();
                rows.end_row();
            }
            rows
        };
        let out = adjacent(&interned.writes, &readers, &mut stamp);
        let inc = adjacent(&interned.reads, &writers, &mut stamp);
        Graph { out, inc }
    }

    /// Number of nodes.
    pub(super) fn len(&self) -> usize {
        self.out.len()
    }

    /// Number of edges.
    pub(super) fn edges(&self) -> usize {
        self.out.total()
    }
}

/// Scratch for Tarjan's algorithm, reusable across runs.
#[derive(Default)]
pub(super) struct Tarjan {
    index: Vec<u32>,
    low: Vec<u32>,
    on_stack: Vec<bool>,
    stack: Vec<u32>,
    calls: Vec<(u32, u32)>,
}

impl Tarjan {
    /// Appends to `comps` the strongly connected components with more than one node among
    /// the `active` nodes (edges to inactive nodes are ignored), each sorted ascending, in
    /// the order found. Iterative, O(N + E).
    pub(super) fn run(&mut self, out: &Rows, active: &[bool], comps: &mut Rows) {
        let m = out.len();
        self.index.clear();
        self.index.resize(m, NONE);
        self.low.clear();
        self.low.resize(m, 0);
        self.on_stack.clear();
        self.on_stack.resize(m, false);
        let mut counter = 0u32;
        for root in 0..m {
            if !active[root] || self.index[root] != NONE {
                continue;
            }
            self.visit(root as u32, &mut counter);
            while let Some(frame) = self.calls.last_mut() {
                let v = frame.0 as usize;
                if let Some(&w) = out.row(v).get(frame.1 as usize) {
                    frame.1 += 1;
                    if !active[w as usize] {
                        continue;
                    }
                    if self.index[w as usize] == NONE {
                        self.visit(w, &mut counter);
                    } else if self.on_stack[w as usize] {
                        self.low[v] = self.low[v].min(self.index[w as usize]);
                    }
                    continue;
                }
                self.calls.pop();
                if let Some(&(parent, _)) = self.calls.last() {
                    self.low[parent as usize] = self.low[parent as usize].min(self.low[v]);
                }
                if self.low[v] == self.index[v] {
                    let from = comps.total();
                    while let Some(x) = self.stack.pop() {
                        self.on_stack[x as usize] = false;
                        comps.push(x);
                        if x as usize == v {
                            break;
                        }
                    }
                    if comps.total() - from > 1 {
                        comps.sort_open_row();
                        comps.end_row();
                    } else {
                        comps.items.truncate(from);
                    }
                }
            }
        }
    }

    fn visit(&mut self, v: u32, counter: &mut u32) {
        self.index[v as usize] = *counter;
        self.low[v as usize] = *counter;
        *counter += 1;
        self.stack.push(v);
        self.on_stack[v as usize] = true;
        self.calls.push((v, 0));
    }
}

/// The subgraph induced by one component, renumbered `0..len` in the component's order.
pub(super) struct SubGraph {
    /// Children within the component, ascending.
    pub out: Rows,
}

impl SubGraph {
    /// `members` ascending; `pos` is scratch of the graph's size, all `NONE`, and is left so.
    pub(super) fn induced(graph: &Graph, members: &[u32], pos: &mut [u32]) -> SubGraph {
        for (p, &v) in members.iter().enumerate() {
            pos[v as usize] = p as u32;
        }
        let mut out = Rows::with_capacity(members.len(), 0);
        for &v in members {
            for &w in graph.out.row(v as usize) {
                if pos[w as usize] != NONE {
                    out.push(pos[w as usize]);
                }
            }
            out.end_row();
        }
        for &v in members {
            pos[v as usize] = NONE;
        }
        SubGraph { out }
    }

    /// Number of nodes.
    pub(super) fn len(&self) -> usize {
        self.out.len()
    }

    /// A lower bound on the number of elementary cycles of a strongly connected digraph:
    /// E − N + 1. An ear decomposition starts from one cycle and adds E − N ears; each ear
    /// closes, with a simple path back through the part built so far, a new elementary cycle
    /// holding the ear's edges, which no earlier one holds.
    pub(super) fn cycle_lower_bound(&self) -> usize {
        (self.out.total() + 1).saturating_sub(self.len())
    }
}

/// For each of `members` (ascending), the members it forms a 2-cycle with (edges both
/// ways), as ids into `members`, ascending. O(E) over the members' edges. `pos` as in
/// [`SubGraph::induced`].
pub(super) fn two_cycle_partners(graph: &Graph, members: &[u32], pos: &mut [u32]) -> Rows {
    for (p, &v) in members.iter().enumerate() {
        pos[v as usize] = p as u32;
    }
    let mut parent_of = vec![NONE; members.len()];
    let mut partners = Rows::with_capacity(members.len(), 0);
    for (u, &v) in members.iter().enumerate() {
        for &w in graph.inc.row(v as usize) {
            if pos[w as usize] != NONE {
                parent_of[pos[w as usize] as usize] = u as u32;
            }
        }
        for &w in graph.out.row(v as usize) {
            let p = pos[w as usize];
            if p != NONE && parent_of[p as usize] == u as u32 {
                partners.push(p);
            }
        }
        partners.end_row();
    }
    for &v in members {
        pos[v as usize] = NONE;
    }
    partners
}

/// Elementary cycles, one row each.
pub(super) type Cycles = Rows;

/// Scratch for Johnson's algorithm, reusable across components.
#[derive(Default)]
pub(super) struct Johnson {
    active: Vec<bool>,
    in_comp: Vec<bool>,
    blocked: Vec<bool>,
    b_lists: Vec<Vec<u32>>,
    path: Vec<u32>,
    frames: Vec<(u32, u32, bool)>,
    todo: Vec<u32>,
    tarjan: Tarjan,
    comps: Rows,
}

impl Johnson {
    /// Appends the elementary cycles of `g` to `cycles`, each starting at its smallest node.
    /// Returns `false`, having appended exactly `limit` cycles, as soon as it meets one more.
    ///
    /// As in Johnson's paper: take the strongly connected component with the least node `s`
    /// in the subgraph of nodes >= `s`, list the cycles through `s` in it with the blocking
    /// search, and continue above `s`; stop when no component with a cycle is left.
    pub(super) fn enumerate(&mut self, g: &SubGraph, limit: usize, cycles: &mut Cycles) -> bool {
        let n = g.len();
        self.active.clear();
        self.active.resize(n, true);
        self.in_comp.clear();
        self.in_comp.resize(n, false);
        self.blocked.clear();
        self.blocked.resize(n, false);
        if self.b_lists.len() < n {
            self.b_lists.resize_with(n, Vec::new);
        }
        let mut found = 0usize;
        let mut s = 0usize;
        while s < n {
            self.comps.clear();
            self.tarjan.run(&g.out, &self.active, &mut self.comps);
            let Some(comp) = (0..self.comps.len()).map(|c| self.comps.row(c)).min_by_key(|c| c[0]) else {
                break;
            };
            s = comp[0] as usize;
            for &v in comp {
                self.in_comp[v as usize] = true;
                self.blocked[v as usize] = false;
                self.b_lists[v as usize].clear();
            }
            let complete = self.circuits(g, s as u32, limit, &mut found, cycles);
            for c in 0..self.comps.len() {
                for &v in self.comps.row(c) {
                    self.in_comp[v as usize] = false;
                }
            }
            if !complete {
                return false;
            }
            for a in &mut self.active[..=s] {
                *a = false;
            }
            s += 1;
        }
        true
    }

    /// The blocking search for the cycles through `s` within `in_comp`.
    fn circuits(&mut self, g: &SubGraph, s: u32, limit: usize, found: &mut usize, cycles: &mut Cycles) -> bool {
        self.blocked[s as usize] = true;
        self.path.clear();
        self.path.push(s);
        self.frames.clear();
        self.frames.push((s, 0, false));
        while let Some(frame) = self.frames.last_mut() {
            let v = frame.0 as usize;
            if let Some(&w) = g.out.row(v).get(frame.1 as usize) {
                frame.1 += 1;
                if !self.in_comp[w as usize] {
                    continue;
                }
                if w == s {
                    frame.2 = true;
                    if *found == limit {
                        return false;
                    }
                    *found += 1;
                    for &x in &self.path {
                        cycles.push(x);
                    }
                    cycles.end_row();
                } else if !self.blocked[w as usize] {
                    self.blocked[w as usize] = true;
                    self.path.push(w);
                    self.frames.push((w, 0, false));
                }
                continue;
            }
            let Some((v, _, closed)) = self.frames.pop() else { break };
            self.path.pop();
            if closed {
                self.unblock(v);
                if let Some(parent) = self.frames.last_mut() {
                    parent.2 = true;
                }
            } else {
                for &w in g.out.row(v as usize) {
                    if self.in_comp[w as usize] && !self.b_lists[w as usize].contains(&v) {
                        self.b_lists[w as usize].push(v);
                    }
                }
            }
        }
        true
    }

    fn unblock(&mut self, u: u32) {
        self.todo.clear();
        self.todo.push(u);
        while let Some(x) = self.todo.pop() {
            if !self.blocked[x as usize] {
                continue;
            }
            self.blocked[x as usize] = false;
            let list = std::mem::take(&mut self.b_lists[x as usize]);
            self.todo.extend(list.iter().copied().filter(|&w| self.blocked[w as usize]));
            // Keep the allocation for the next time this node blocks.
            self.b_lists[x as usize] = list;
            self.b_lists[x as usize].clear();
        }
    }
}

/// How many of `cycles` each of `n` nodes is in.
pub(super) fn cycle_counts(cycles: &Cycles, n: usize) -> Vec<usize> {
    let mut counts = vec![0usize; n];
    for &v in &cycles.items {
        counts[v as usize] += 1;
    }
    counts
}

/// The thesis's step 4 on one component: repeatedly take the node in the most remaining
/// cycles (ties: smallest id), drop every cycle through it and decrement the counts of
/// those cycles' members. Returns the taken nodes in the order taken.
pub(super) fn greedy_hitting_set(cycles: &Cycles, n: usize) -> Vec<u32> {
    let mut counts = cycle_counts(cycles, n);
    let of = cycles.transpose(n);
    let mut dropped = vec![false; cycles.len()];
    let mut remaining = cycles.len();
    let mut taken = Vec::new();
    while remaining > 0 {
        let Some(v) = argmax(&counts) else { break };
        taken.push(v as u32);
        for &c in of.row(v) {
            if !dropped[c as usize] {
                dropped[c as usize] = true;
                remaining -= 1;
                for &u in cycles.row(c as usize) {
                    counts[u as usize] -= 1;
                }
            }
        }
    }
    taken
}

/// A greedy vertex cover of the 2-cycles, given each node's 2-cycle partners: the node in
/// the most uncovered 2-cycles first (ties: smallest id), counts updated after each pick.
pub(super) fn greedy_two_cycle_cover(partners: &Rows) -> Vec<u32> {
    let n = partners.len();
    let mut counts: Vec<usize> = (0..n).map(|v| partners.row(v).len()).collect();
    let mut gone = vec![false; n];
    let mut taken = Vec::new();
    while let Some(v) = argmax(&counts) {
        taken.push(v as u32);
        gone[v] = true;
        counts[v] = 0;
        for &p in partners.row(v) {
            if !gone[p as usize] {
                counts[p as usize] -= 1;
            }
        }
    }
    taken
}

/// The node with the largest positive count, the smallest on ties; `None` when all are 0.
pub(super) fn argmax(counts: &[usize]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (v, &c) in counts.iter().enumerate() {
        if c > 0 && best.is_none_or(|b| c > counts[b]) {
            best = Some(v);
        }
    }
    best
}

/// Whether making `v` alive again would close a cycle among the alive nodes: some alive
/// child of `v` reaches an alive parent of `v`. `mark` is scratch of the graph's size whose
/// entries are below `stamp`; it uses `stamp` and `stamp + 1`.
pub(super) fn closes_cycle(graph: &Graph, alive: &[bool], v: usize, mark: &mut [u32], stamp: u32) -> bool {
    let (target, seen) = (stamp, stamp + 1);
    for &p in graph.inc.row(v) {
        mark[p as usize] = target;
    }
    let mut todo: Vec<u32> = Vec::new();
    for &c in graph.out.row(v) {
        if alive[c as usize] {
            if mark[c as usize] == target {
                return true;
            }
            mark[c as usize] = seen;
            todo.push(c);
        }
    }
    while let Some(x) = todo.pop() {
        for &w in graph.out.row(x as usize) {
            if !alive[w as usize] || mark[w as usize] == seen {
                continue;
            }
            if mark[w as usize] == target {
                return true;
            }
            mark[w as usize] = seen;
            todo.push(w);
        }
    }
    false
}

/// The thesis's step 5 on the alive nodes (which must be acyclic): from the smallest
/// unscheduled node, climb to an unscheduled parent while there is one; append a node whose
/// parents are all scheduled and move to its first unscheduled child; when there is none,
/// restart from the smallest unscheduled node. The appended list, reversed, applies every
/// reader before the writers of what it read.
pub(super) fn thesis_order(graph: &Graph, alive: &[bool]) -> Vec<u32> {
    let m = graph.len();
    let mut scheduled: Vec<bool> = alive.iter().map(|a| !a).collect();
    let target = alive.iter().filter(|&&a| a).count();
    // Scheduling is monotone, so each node's scan of its parents or children resumes
    // where it last stopped instead of restarting: same choices, linear total work.
    let mut parent_cursor = vec![0usize; m];
    let mut child_cursor = vec![0usize; m];
    let mut next = 0usize;
    let mut order: Vec<u32> = Vec::with_capacity(target);
    let mut current: Option<usize> = None;
    // Climbs since the last node was scheduled. In an acyclic graph a climb never revisits
    // a node; the bound only turns a broken invariant into a wrong order, not a hang.
    let mut climbs = 0usize;
    while order.len() < target {
        let v = match current {
            Some(v) if !scheduled[v] => v,
            _ => {
                while next < m && scheduled[next] {
                    next += 1;
                }
                if next == m {
                    break;
                }
                next
            }
        };
        let parents = graph.inc.row(v);
        while parent_cursor[v] < parents.len() && scheduled[parents[parent_cursor[v]] as usize] {
            parent_cursor[v] += 1;
        }
        if let Some(&p) = parents.get(parent_cursor[v]) {
            if climbs < m {
                climbs += 1;
                current = Some(p as usize);
                continue;
            }
            debug_assert!(false, "step 5 ran on a cyclic graph");
        }
        climbs = 0;
        scheduled[v] = true;
        order.push(v as u32);
        let children = graph.out.row(v);
        while child_cursor[v] < children.len() && scheduled[children[child_cursor[v]] as usize] {
            child_cursor[v] += 1;
        }
        current = children.get(child_cursor[v]).map(|&c| c as usize);
    }
    order.reverse();
    order
}
