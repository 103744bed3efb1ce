//! Media faults as harnesses plant them: the kinds drawn, and what a planted fault does to a
//! node's storage.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use rand::rngs::StdRng;
use rand::SeedableRng;
use virga_core::device::MemStorage;
use virga_sim::media::{draw, fired, plant, storage_of, Kinds, MediaFault, Plans, Planted, SECTOR_BYTES};

#[test]
fn detectable_faults_are_never_lost_writes_and_every_kind_is_drawn() {
    let mut rng = StdRng::seed_from_u64(7);
    let (mut all, mut detectable) = (Vec::new(), Vec::new());
    for _ in 0..300 {
        all.push(draw(&mut rng, "n".into(), 500_000_000, Kinds::All).fault);
        detectable.push(draw(&mut rng, "n".into(), 500_000_000, Kinds::Detectable).fault);
    }
    let kind = |fault: &MediaFault| std::mem::discriminant(fault);
    let lost = kind(&MediaFault::LostWrites(1));
    assert!(detectable.iter().all(|fault| kind(fault) != lost));
    assert!(all.iter().any(|fault| kind(fault) == lost));
    assert!(detectable.iter().any(|fault| matches!(fault, MediaFault::LatentSector { .. })));
    assert!(detectable.iter().any(|fault| matches!(fault, MediaFault::Misdirected { .. })));
}

#[test]
fn a_fault_before_the_crash_is_due_before_it_and_a_latent_sector_error_after() {
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..100 {
        let Planted { at, fault, .. } = draw(&mut rng, "n".into(), 500_000_000, Kinds::All);
        match fault {
            MediaFault::LatentSector { .. } => assert_eq!(at, 500_000_001),
            _ => assert!((400_000_000..499_000_001).contains(&at), "{at}"),
        }
    }
}

#[test]
fn a_planted_latent_sector_error_makes_the_nodes_object_unreadable_and_counts_once_hit() {
    let disks = RefCell::new(HashMap::new());
    let plans: Plans = Rc::default();
    let disk = MemStorage::new();
    disks.borrow_mut().insert("n".to_string(), disk.clone());
    let storage = storage_of("n", disk, &plans);
    let object = storage.create("log").expect("created");
    object.write_at(&vec![7u8; 4 * SECTOR_BYTES as usize], 0).expect("written");
    object.sync().expect("synced");
    assert_eq!(fired(&plans), 0);
    let planted = Planted { node: "n".into(), at: 0, fault: MediaFault::LatentSector { pick: 0 } };
    assert!(plant(&planted, &disks, &plans));
    let mut buf = vec![0u8; SECTOR_BYTES as usize];
    assert!(storage.open("log").expect("opens").read_at(&mut buf, 0).is_err(), "the sector is unreadable");
    assert_eq!(fired(&plans), 1);
    let elsewhere = Planted { node: "other".into(), ..planted };
    assert!(!plant(&elsewhere, &disks, &plans), "a node with no plan takes no fault");
}
