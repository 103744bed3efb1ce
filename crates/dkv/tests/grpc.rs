//! The configuration service as gRPC peers on loopback: each replica a tonic server hosting
//! the Dkv protocol (the envelope's `dkv` arm), the client calling over the same transport.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;
use tokio::sync::watch;
use virga_net::{Grpc, MessageKind};

use crate::deploy::{
    agreed_leader, assert_all_applied, converged, layout_changes, peers, start_replica, wait_for, Client,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_and_a_client_over_grpc_on_loopback_apply_every_command() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    // Ports picked by the kernel: each listener is bound before any peer needs its address.
    let mut listeners = HashMap::new();
    let mut addresses = HashMap::new();
    for (_, name) in peers() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        addresses.insert(name.clone(), format!("http://{}", listener.local_addr().unwrap()));
        listeners.insert(name, listener);
    }
    let grpc = Grpc::new(addresses);
    let (stop_servers, servers_stopped) = watch::channel(false);
    let mut servers = Vec::new();
    let replicas: Vec<_> = peers()
        .into_iter()
        .map(|(id, _)| {
            start_replica(dir.path(), id, Arc::clone(&grpc) as _, |name, host| {
                let listener = listeners.remove(name).unwrap();
                let mut stopped = servers_stopped.clone();
                let shutdown = async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                };
                let (_, server) = virga_net::serve(listener, host, shutdown).unwrap();
                servers.push(tokio::spawn(server));
            })
        })
        .collect();
    let all: Vec<_> = replicas.iter().collect();
    wait_for("a leader over gRPC", || agreed_leader(&all)).await;

    let client = Client::start("admin-0", Arc::clone(&grpc) as _);
    let (commands, expected) = layout_changes();
    client.propose(commands.clone());
    let outcomes = client.outcomes(commands.len()).await;
    assert_all_applied(&outcomes, &commands);
    let last = outcomes.last().unwrap().index;
    let (state, _) = wait_for("every replica applies the same entries", || converged(&all, last)).await;
    assert_eq!(state.map(), expected.map());
    // It all went over the wire: Raft batches between replicas, proposals from the client.
    let kinds = grpc.stats().kinds();
    let calls = |request| kinds.get(&MessageKind { protocol: "dkv", request }).map_or(0, |kind| kind.calls);
    assert!(calls("raft") > 0 && calls("propose") >= commands.len() as u64, "{kinds:?}");

    client.stop().await;
    for replica in replicas {
        replica.stop().await;
    }
    let _ = stop_servers.send(true);
    for server in servers {
        server.await.unwrap().unwrap();
    }
    eprintln!("over gRPC: {:?}", started.elapsed());
}
