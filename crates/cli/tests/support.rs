//! What the command-line tests share: running `virga`, its output as text, the JSON a run
//! wrote, and free loopback ports for servers.

use std::net::TcpListener;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

pub(crate) fn virga(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_virga")).args(args).output().expect("run virga")
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub(crate) fn json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A base port with `count` free ports after it (probed; another process could still take
/// one before the roles bind, which would fail the test loudly, not wrongly).
pub(crate) fn free_ports(count: u16) -> u16 {
    // Tests of this binary run at once: each call starts its probe elsewhere.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    for attempt in 0..200u32 {
        let base = (20_000 + (std::process::id() + call * 1_009 + attempt * 97) % 40_000) as u16;
        let all_free = (0..count).all(|offset| TcpListener::bind(("127.0.0.1", base + offset)).is_ok());
        if all_free {
            return base;
        }
    }
    panic!("no {count} consecutive free ports found");
}

/// Stops a server process with SIGTERM (it stops gracefully), or SIGKILL after 20 s.
pub(crate) fn stop(mut child: Child) {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.wait();
}
