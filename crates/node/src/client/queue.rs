//! The transfers a client holds before batching them, kept per sender so that a sender
//! never has two transfers in flight and its transfers leave in nonce order.

use alloy_primitives::Address;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use super::UserTransfer;

/// What the queues hold: anything with a sender.
pub(super) trait FromSender {
    fn sender(&self) -> Address;
}

impl FromSender for UserTransfer {
    fn sender(&self) -> Address {
        self.sender
    }
}

/// Where a waiting transfer stands: retries (kind 0) before new arrivals (kind 1), each
/// kind in the order it was queued.
type Place = (u8, u64);

const RETRY: u8 = 0;
const ARRIVAL: u8 = 1;

/// Waiting transfers by sender, and the senders with a transfer in flight.
#[derive(Debug)]
pub(super) struct SenderQueues<T = UserTransfer> {
    queues: HashMap<Address, VecDeque<(Place, T)>>,
    /// Senders with nothing in flight and a transfer waiting, by their first waiting
    /// transfer's place: the order in which batches take them.
    ready: BTreeSet<(Place, Address)>,
    busy: HashSet<Address>,
    next_retry: u64,
    next_arrival: u64,
    waiting: usize,
}

impl<T> Default for SenderQueues<T> {
    fn default() -> Self {
        SenderQueues {
            queues: HashMap::new(),
            ready: BTreeSet::new(),
            busy: HashSet::new(),
            next_retry: 0,
            next_arrival: 0,
            waiting: 0,
        }
    }
}

impl<T: FromSender> SenderQueues<T> {
    /// A new transfer, behind every transfer of its sender.
    pub(super) fn push(&mut self, transfer: T) {
        let place = (ARRIVAL, self.next_arrival);
        self.next_arrival += 1;
        let sender = transfer.sender();
        let queue = self.queues.entry(sender).or_default();
        if queue.is_empty() && !self.busy.contains(&sender) {
            self.ready.insert((place, sender));
        }
        queue.push_back((place, transfer));
        self.waiting += 1;
    }

    /// Puts an in-flight transfer back at the head of its sender's queue and frees the
    /// sender: the sender's later transfers stay behind it (no nonce gap), and it goes
    /// before every new arrival.
    pub(super) fn requeue(&mut self, transfer: T) {
        let sender = transfer.sender();
        assert!(self.busy.remove(&sender), "a retried transfer's sender {sender} had nothing in flight");
        let place = (RETRY, self.next_retry);
        self.next_retry += 1;
        self.queues.entry(sender).or_default().push_front((place, transfer));
        self.ready.insert((place, sender));
        self.waiting += 1;
    }

    /// The sender's transfer in flight is done with (committed, filtered or confirmed).
    pub(super) fn release(&mut self, sender: Address) {
        assert!(self.busy.remove(&sender), "released sender {sender} had nothing in flight");
        if let Some((front, _)) = self.queues.get(&sender).and_then(VecDeque::front) {
            self.ready.insert((*front, sender));
        }
    }

    /// Up to `limit` transfers, one per sender, of senders with nothing in flight; their
    /// senders are in flight from now on.
    pub(super) fn take(&mut self, limit: usize) -> Vec<T> {
        let mut taken = Vec::new();
        while taken.len() < limit {
            let Some((_, sender)) = self.ready.pop_first() else { break };
            let Some(queue) = self.queues.get_mut(&sender) else { unreachable!("ready sender {sender} has no queue") };
            let Some((_, transfer)) = queue.pop_front() else {
                unreachable!("ready sender {sender} has nothing waiting")
            };
            if queue.is_empty() {
                self.queues.remove(&sender);
            }
            self.busy.insert(sender);
            self.waiting -= 1;
            taken.push(transfer);
        }
        taken
    }

    /// Transfers waiting (not in flight).
    pub(super) fn waiting(&self) -> usize {
        self.waiting
    }

    #[cfg(test)]
    pub(super) fn is_busy(&self, sender: &Address) -> bool {
        self.busy.contains(sender)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A transfer of the model: its sender and its number.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Item(Address, u32);

    impl FromSender for Item {
        fn sender(&self) -> Address {
            self.0
        }
    }

    /// The simple oracle: retries, then arrivals, scanned in order; a sender in flight, or
    /// with an earlier transfer left behind in this scan, is skipped.
    #[derive(Default)]
    struct Model {
        retries: VecDeque<Item>,
        arrivals: VecDeque<Item>,
        busy: HashSet<Address>,
    }

    impl Model {
        fn take(&mut self, limit: usize) -> Vec<Item> {
            let mut taken = Vec::new();
            let mut blocked = HashSet::new();
            for queue in [&mut self.retries, &mut self.arrivals] {
                let mut kept = VecDeque::new();
                for item in queue.drain(..) {
                    if taken.len() < limit && !self.busy.contains(&item.0) && !blocked.contains(&item.0) {
                        self.busy.insert(item.0);
                        taken.push(item);
                    } else {
                        blocked.insert(item.0);
                        kept.push_back(item);
                    }
                }
                *queue = kept;
            }
            taken
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Push(u8),
        Take(usize),
        /// The in-flight transfer at this index (modulo) goes back as a retry.
        Requeue(usize),
        /// The in-flight transfer at this index (modulo) is done.
        Release(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u8..6).prop_map(Op::Push),
            2 => (1usize..4).prop_map(Op::Take),
            1 => any::<usize>().prop_map(Op::Requeue),
            1 => any::<usize>().prop_map(Op::Release),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn batches_are_taken_as_the_simple_scan_takes_them(ops in prop::collection::vec(op(), 1..80)) {
            let mut queues = SenderQueues::<Item>::default();
            let mut model = Model::default();
            let mut in_flight: Vec<Item> = Vec::new();
            let mut numbered = 0;
            for op in ops {
                match op {
                    Op::Push(sender) => {
                        let item = Item(Address::with_last_byte(sender), numbered);
                        numbered += 1;
                        queues.push(item);
                        model.arrivals.push_back(item);
                    }
                    Op::Take(limit) => {
                        let taken = queues.take(limit);
                        prop_assert_eq!(&taken, &model.take(limit));
                        for item in &taken {
                            prop_assert!(!in_flight.iter().any(|other| other.0 == item.0), "two in flight");
                            prop_assert!(queues.is_busy(&item.0));
                        }
                        in_flight.extend(taken);
                    }
                    Op::Requeue(index) if !in_flight.is_empty() => {
                        let item = in_flight.remove(index % in_flight.len());
                        queues.requeue(item);
                        model.busy.remove(&item.0);
                        model.retries.push_back(item);
                    }
                    Op::Release(index) if !in_flight.is_empty() => {
                        let item = in_flight.remove(index % in_flight.len());
                        queues.release(item.0);
                        model.busy.remove(&item.0);
                    }
                    Op::Requeue(_) | Op::Release(_) => {}
                }
                prop_assert_eq!(queues.waiting(), model.retries.len() + model.arrivals.len());
            }
        }
    }

    #[test]
    fn a_sender_s_transfers_leave_in_order_one_at_a_time() {
        let mut queues = SenderQueues::<Item>::default();
        let (a, b) = (Address::with_last_byte(1), Address::with_last_byte(2));
        for (sender, number) in [(a, 0), (a, 1), (b, 2), (a, 3)] {
            queues.push(Item(sender, number));
        }
        assert_eq!(queues.take(10), vec![Item(a, 0), Item(b, 2)]);
        assert!(queues.take(10).is_empty(), "both senders are in flight");
        queues.requeue(Item(a, 0));
        queues.release(b);
        assert_eq!(queues.take(10), vec![Item(a, 0)], "the retry first; b has nothing waiting");
        queues.release(a);
        assert_eq!(queues.take(10), vec![Item(a, 1)]);
        queues.release(a);
        assert_eq!(queues.take(10), vec![Item(a, 3)]);
    }
}
