//! What the command-line tests of the simulators share: running `virga`, its output as text,
//! and the JSON a run wrote.

use std::process::{Command, Output};

pub fn virga(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_virga")).args(args).output().expect("run virga")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}
