//! The `log_segment` fuzz target's body on random segment bodies and on edits of a clean
//! one, so every test run exercises it (`fuzz/run.sh` runs it coverage-guided).

use proptest::prelude::*;
use virga_log::fuzzing::{log_segment, sample_segment_body};

fn clean_body() -> Vec<u8> {
    sample_segment_body(&[b"first", &[7; 300], b"", b"last record"])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn random_segment_bodies_never_panic(data in prop::collection::vec(any::<u8>(), 0..400)) {
        log_segment(&data);
    }

    #[test]
    fn edited_clean_segments_are_read_or_refused_consistently(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut body = clean_body();
        for (at, byte) in edits {
            let at = at.index(body.len());
            body[at] ^= byte;
        }
        if truncate {
            body.truncate(cut.index(body.len() + 1));
        }
        log_segment(&body);
    }
}

#[test]
fn a_clean_segment_recovers_every_record() {
    let body = clean_body();
    log_segment(&body);
    let storage = virga_core::device::MemStorage::new();
    let mut file = virga_log::encode_segment_header_with(b"VIRGALOG", 1).to_vec();
    file.extend_from_slice(&body);
    let segment = virga_log::Storage::create(&storage, &virga_log::segment_file_name(1)).unwrap();
    segment.write_at(&file, 0).unwrap();
    let records = virga_log::read_all(&storage, virga_log::LogOptions::default()).unwrap();
    assert_eq!(records.len(), 4);
}
