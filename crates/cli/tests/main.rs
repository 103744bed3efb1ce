//! The crate's integration tests, linked into one binary: one link of the whole stack
//! instead of one per file. Each module is a concern of its own.

mod bench_dkv;
mod chainify;
mod chainify_processes;
mod cli;
mod kv;
mod kv_cluster;
mod kv_money;
mod kv_processes;
mod ledger;
mod node;
mod sim;
mod sim_config_service;
mod sim_dkv;
mod support;
