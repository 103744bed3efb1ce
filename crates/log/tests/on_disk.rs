//! Black-box checks of the on-disk format as documented in the README, and of recovery never
//! allocating from an untrusted record length.
//!
//! The allocation check swaps in a global allocator that remembers the largest single request
//! of a thread that asked it to watch, so the other tests of this binary, allocating on their
//! own threads at the same time, do not count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use virga_log::{
    segment_file_name, LogError, LogOptions, RecordLog, SyncPolicy, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN,
};

/// Forwards to the system allocator, recording the largest allocation requested by a
/// watching thread.
struct LargestAllocation;

thread_local! {
    /// The largest allocation of this thread since it started watching; `None`: not watching.
    /// Const-initialized with no destructor, so reading it never allocates.
    static WATCH: Cell<Option<usize>> = const { Cell::new(None) };
}

fn record(size: usize) {
    let _ = WATCH.try_with(|watch| {
        if let Some(largest) = watch.get() {
            watch.set(Some(largest.max(size)));
        }
    });
}

/// Runs `work` and returns its result with the largest single allocation this thread made
/// meanwhile.
fn largest_allocation<T>(work: impl FnOnce() -> T) -> (T, usize) {
    WATCH.with(|watch| watch.set(Some(0)));
    let result = work();
    let largest = WATCH.with(|watch| watch.replace(None)).unwrap_or(0);
    (result, largest)
}

unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: same contract as this function's, forwarded unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: same contract as this function's, forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        // SAFETY: same contract as this function's, forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as this function's, forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

fn options(segment_bytes: u64, max_record_bytes: u32) -> LogOptions {
    LogOptions { segment_bytes, max_record_bytes, sync: SyncPolicy::None, ..LogOptions::default() }
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// A record header built by hand from the README's table, with a valid checksum over the
/// header and whatever `payload` is given (which may be shorter than `len` says).
fn handmade_record(len: u32, lsn: u64, payload: &[u8]) -> Vec<u8> {
    let mut record = vec![0xB5, 1, 0, 0];
    record.extend_from_slice(&len.to_le_bytes());
    record.extend_from_slice(&lsn.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&record);
    crc.update(payload);
    record.extend_from_slice(&crc.finalize().to_le_bytes());
    record.extend_from_slice(payload);
    record
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

#[test]
fn layout_matches_the_readme() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = RecordLog::open(dir.path(), options(1 << 20, 1 << 20)).unwrap();
    log.append(b"hello").unwrap();
    log.append(b"").unwrap();
    log.sync().unwrap();
    drop(log);

    let path = dir.path().join("00000000000000000001.seg");
    assert_eq!(segment_file_name(1), "00000000000000000001.seg");
    let bytes = fs::read(&path).unwrap();
    assert_eq!(SEGMENT_HEADER_LEN, 24);
    assert_eq!(RECORD_HEADER_LEN, 20);
    assert_eq!(bytes.len(), 24 + 20 + 5 + 20);

    // Segment header.
    assert_eq!(&bytes[0..8], b"VIRGALOG");
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 1);
    assert_eq!(&bytes[10..12], &[0, 0]);
    assert_eq!(le_u64(&bytes, 12), 1);
    assert_eq!(le_u32(&bytes, 20), crc32fast::hash(&bytes[0..20]));

    // Records.
    assert_eq!(&bytes[24..49], handmade_record(5, 1, b"hello").as_slice());
    assert_eq!(&bytes[49..69], handmade_record(0, 2, b"").as_slice());
}

#[test]
fn bogus_lengths_are_rejected_without_allocating_them() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = RecordLog::open(dir.path(), options(200, u32::MAX)).unwrap();
    for i in 0..20u8 {
        log.append(&[i; 40]).unwrap();
    }
    log.sync().unwrap();
    drop(log);
    let files = segments(dir.path());
    assert!(files.len() > 2);
    let last = files.last().unwrap();
    let next_lsn = 21;

    // A checksummed header in the last segment announcing 1 GiB (allowed by the maximum)
    // followed by only 100 bytes, then one announcing 4 GiB - 1 with the default maximum.
    let forged = handmade_record(1 << 30, next_lsn, &[7; 100]);
    OpenOptions::new().append(true).open(last).unwrap().write_all(&forged).unwrap();
    for max in [u32::MAX, LogOptions::default().max_record_bytes] {
        let copy = tempfile::tempdir().unwrap();
        for file in &files {
            fs::copy(file, copy.path().join(file.file_name().unwrap())).unwrap();
        }
        let ((torn, recovered), largest) = largest_allocation(|| {
            let torn = RecordLog::open(copy.path(), options(200, max));
            (torn, RecordLog::recover(copy.path(), options(200, max)))
        });
        assert!(matches!(torn, Err(LogError::TornTail { .. })), "{torn:?}");
        let (_, recovered) = recovered.unwrap();
        assert!(largest < 1 << 20, "recovery allocated {largest} bytes at once");
        assert_eq!(recovered.record_count, 20);
        assert_eq!(recovered.truncated_bytes, forged.len() as u64);
    }

    // The same in the first segment is corruption, also reported without allocating.
    let first = &files[0];
    let mut bytes = fs::read(first).unwrap();
    bytes[24 + 4..24 + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    fs::write(first, bytes).unwrap();
    let (opened, largest) = largest_allocation(|| RecordLog::open(dir.path(), options(200, u32::MAX)));
    match opened {
        Err(LogError::Corrupt { segment, offset, .. }) => {
            assert_eq!(&segment, first);
            assert_eq!(offset, 24);
        }
        other => panic!("expected corruption, got {other:?}"),
    }
    assert!(largest < 1 << 20, "recovery allocated {largest} bytes at once");
}
