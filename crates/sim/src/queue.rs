//! The event queue: a min-heap on (virtual time, sequence number) over a slab of payloads.
//!
//! The heap holds only small keys, so sifting moves 24 bytes however large a message is;
//! the payloads stay put in a slab whose slots are reused. The sequence number is handed
//! out at push time, so two events due at the same instant come out in the order they were
//! scheduled, which is what makes a run a function of its seed alone.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

pub(crate) struct EventQueue<T> {
    heap: BinaryHeap<Reverse<(u64, u64, u32)>>,
    slots: Vec<Option<T>>,
    free: Vec<u32>,
    next_seq: u64,
}

impl<T> Default for EventQueue<T> {
    fn default() -> Self {
        EventQueue { heap: BinaryHeap::new(), slots: Vec::new(), free: Vec::new(), next_seq: 0 }
    }
}

impl<T> EventQueue<T> {
    /// Schedules `item` at virtual time `time`, after everything already due then.
    pub(crate) fn push(&mut self, time: u64, item: T) {
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(item);
                slot
            }
            None => {
                let slot = u32::try_from(self.slots.len()).expect("more than 2^32 events pending at once");
                self.slots.push(Some(item));
                slot
            }
        };
        self.heap.push(Reverse((time, self.next_seq, slot)));
        self.next_seq += 1;
    }

    /// The time of the earliest event, if any.
    pub(crate) fn peek_time(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((time, _, _))| *time)
    }

    /// Takes the earliest event.
    pub(crate) fn pop(&mut self) -> Option<(u64, T)> {
        let Reverse((time, _, slot)) = self.heap.pop()?;
        let item = self.slots[slot as usize].take().expect("a queued slot holds its event");
        self.free.push(slot);
        Some((time, item))
    }

    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::EventQueue;

    #[test]
    fn ties_come_out_in_push_order_and_slots_are_reused() {
        let mut queue = EventQueue::default();
        queue.push(5, "b");
        queue.push(3, "a");
        queue.push(5, "c");
        assert_eq!(queue.pop(), Some((3, "a")));
        queue.push(5, "d");
        assert_eq!(queue.pop(), Some((5, "b")));
        assert_eq!(queue.pop(), Some((5, "c")));
        assert_eq!(queue.pop(), Some((5, "d")));
        assert_eq!(queue.pop(), None);
        assert_eq!(queue.slots.len(), 3, "the slot freed by `a` held `d`");
    }
}
