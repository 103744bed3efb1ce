//! RainBlock's messages (`proto/rainblock.proto`, package `virga.rainblock.v1`): what storage
//! nodes, miners and prefetching clients send one another, and a storage node's checkpoint.

#![allow(clippy::all, clippy::too_many_lines)]

include!(concat!(env!("OUT_DIR"), "/virga.rainblock.v1.rs"));
