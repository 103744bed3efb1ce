//! The `virga.kv.v1` messages (and, with the `grpc` feature, tonic's client and server),
//! generated from `proto/kv.proto`.

#![allow(clippy::all, clippy::too_many_lines)]

include!(concat!(env!("OUT_DIR"), "/virga.kv.v1.rs"));
