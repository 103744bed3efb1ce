//! The client API against a whole cluster in this process (`deploy::LocalCluster`, what
//! `virga kv cluster up` runs): interactive transactions through the Rust library, the same
//! through the gRPC service, the errors each misuse gets, and a restart from the directory.

use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpListener;
use virga_dkv::api::grpc::{serve, RemoteKv};
use virga_dkv::api::{Kv, KvBackend, KvError};
use virga_dkv::deploy::{ClusterOptions, ClusterShape, LocalCluster};

fn shape() -> ClusterShape {
    ClusterShape { shards: 3, replicas: 3, data_nodes: 4, validators: 0 }
}

async fn open(dir: &std::path::Path) -> LocalCluster {
    LocalCluster::open(dir, Some(shape()), &ClusterOptions::default()).await.unwrap()
}

fn bytes(text: &str) -> Bytes {
    Bytes::from(text.to_string())
}

/// What every backend must do: interactive transactions with their own writes visible to
/// them and no one else, scans across shards, conflicts aborting one side, and a named
/// error for each misuse.
async fn exercise<B: KvBackend>(kv: &Kv<B>, prefix: &str) {
    let key = |name: &str| bytes(&format!("{prefix}/{name}"));
    kv.put(key("a"), "1").await.unwrap();
    kv.put(key("b"), "2").await.unwrap();

    let txn = kv.begin().await.unwrap();
    assert_eq!(txn.get(key("a")).await.unwrap(), Some(bytes("1")));
    txn.put(key("a"), "10").await.unwrap();
    txn.delete(key("b")).await.unwrap();
    txn.put(key("c"), "3").await.unwrap();
    assert_eq!(txn.get(key("a")).await.unwrap(), Some(bytes("10")), "a transaction reads its own writes");
    assert_eq!(txn.get(key("b")).await.unwrap(), None);
    let end = Some(bytes(&format!("{prefix}0")));
    let rows = txn.scan(key(""), end.clone(), 100).await.unwrap();
    assert_eq!(rows, vec![(key("a"), bytes("10")), (key("c"), bytes("3"))], "a scan overlays its own writes");
    assert_eq!(kv.get(key("a")).await.unwrap(), Some(bytes("1")), "others do not see uncommitted writes");
    let committed = txn.commit().await.unwrap();
    assert!(!committed.read_only);
    assert_eq!(kv.get(key("a")).await.unwrap(), Some(bytes("10")));
    assert_eq!(kv.scan(key(""), end, 100).await.unwrap().len(), 2);

    // Two transactions read the same key and both write it: the later commit aborts.
    let first = kv.begin().await.unwrap();
    let second = kv.begin().await.unwrap();
    assert_eq!(first.get(key("a")).await.unwrap(), Some(bytes("10")));
    assert_eq!(second.get(key("a")).await.unwrap(), Some(bytes("10")));
    first.put(key("a"), "11").await.unwrap();
    second.put(key("a"), "12").await.unwrap();
    first.commit().await.unwrap();
    let refused = second.commit().await.unwrap_err();
    assert!(matches!(refused, KvError::Aborted { .. }), "{refused}");
    assert_eq!(kv.get(key("a")).await.unwrap(), Some(bytes("11")));

    // A snapshot in the past reads what was, and cannot write.
    let past = kv.begin().await.unwrap();
    let then = past.ts_begin();
    past.abort().await.unwrap();
    kv.put(key("a"), "99").await.unwrap();
    let snapshot = kv.begin_at(then).await.unwrap();
    assert_eq!(snapshot.get(key("a")).await.unwrap(), Some(bytes("11")));
    assert!(matches!(snapshot.put(key("a"), "0").await, Err(KvError::ReadOnly { .. })));
    assert!(snapshot.commit().await.unwrap().read_only);

    // Misuse: each gets its named error, and the transaction stays usable after the
    // harmless ones.
    let txn = kv.begin().await.unwrap();
    assert!(matches!(txn.get(Bytes::new()).await, Err(KvError::Invalid(message)) if message.contains("empty key")));
    let huge = vec![0u8; (1 << 20) + 1];
    assert!(matches!(txn.put(key("h"), huge).await, Err(KvError::Invalid(message)) if message.contains("value")));
    assert!(matches!(txn.scan(key("z"), Some(key("a")), 10).await, Err(KvError::Invalid(_))));
    assert!(matches!(txn.scan(key("a"), None, 5000).await, Err(KvError::Invalid(_))));
    assert_eq!(txn.get(key("c")).await.unwrap(), Some(bytes("3")));
    let id = txn.id();
    txn.abort().await.unwrap();
    let gone = kv.backend().call(virga_dkv::client::SessionOp::Get { txn: id, key: key("a") }).await;
    assert_eq!(gone, Err(KvError::UnknownTransaction { txn: id }));
    let future = virga_storage::Timestamp::new(u64::MAX / 2, 0);
    assert!(matches!(kv.begin_at(future).await, Err(KvError::Invalid(message)) if message.contains("future")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_and_the_grpc_service_run_interactive_transactions_and_a_restart_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = open(dir.path()).await;
    assert_eq!(cluster.incarnation(), 1);
    exercise(&cluster.kv(), "local").await;

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (stop_serving, stopped) = tokio::sync::oneshot::channel::<()>();
    let (address, server) = serve(listener, cluster.kv(), None, async move {
        let _ = stopped.await;
    })
    .unwrap();
    let server = tokio::spawn(server);
    let remote = Kv::new(RemoteKv::connect(&format!("http://{address}"), Duration::from_secs(30)).unwrap());
    exercise(&remote, "remote").await;
    let _ = stop_serving.send(());
    server.await.unwrap().unwrap();
    cluster.stop().await;

    // The same directory opens the same cluster, with what it committed.
    let cluster = LocalCluster::open(dir.path(), None, &ClusterOptions::default()).await.unwrap();
    assert_eq!((cluster.incarnation(), cluster.shape()), (2, shape()));
    let kv = cluster.kv();
    assert_eq!(kv.get("local/a").await.unwrap(), Some(bytes("99")));
    assert_eq!(kv.get("remote/c").await.unwrap(), Some(bytes("3")));
    assert_eq!(kv.get("remote/b").await.unwrap(), None);
    kv.put("after", "restart").await.unwrap();
    assert_eq!(kv.get("after").await.unwrap(), Some(bytes("restart")));
    cluster.stop().await;
}

#[tokio::test]
async fn an_unreachable_server_is_a_transport_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let kv = Kv::new(RemoteKv::connect(&format!("http://{address}"), Duration::from_secs(5)).unwrap());
    let error = kv.get("k").await.unwrap_err();
    assert!(matches!(error, KvError::Transport(_)), "{error}");
    assert!(matches!(RemoteKv::connect("not a url", Duration::from_secs(1)), Err(KvError::Invalid(_))));
}

fn tls(cert: &str) -> virga_net::Tls {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tls");
    let (cert_file, key_file) = (dir.join(format!("{cert}.pem")), dir.join(format!("{cert}-key.pem")));
    virga_net::Tls::load(&cert_file, &key_file, &dir.join("ca.pem")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_client_without_a_certificate_of_the_clusters_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = open(dir.path()).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (stop_serving, stopped) = tokio::sync::oneshot::channel::<()>();
    let (address, server) = serve(listener, cluster.kv(), Some(&tls("node")), async move {
        let _ = stopped.await;
    })
    .unwrap();
    let server = tokio::spawn(server);
    let address = format!("http://{address}");
    let member = Kv::new(RemoteKv::connect_tls(&address, Duration::from_secs(30), &tls("node")).unwrap());
    member.put("secret", "1").await.unwrap();
    assert_eq!(member.get("secret").await.unwrap(), Some(bytes("1")));
    // A certificate of another CA, and no TLS at all: neither reads nor writes anything.
    let stranger = Kv::new(RemoteKv::connect_tls(&address, Duration::from_secs(5), &tls("stranger")).unwrap());
    let refused = stranger.put("secret", "2").await.unwrap_err();
    assert!(matches!(refused, KvError::Transport(_)), "{refused}");
    let plain = Kv::new(RemoteKv::connect(&address, Duration::from_secs(5)).unwrap());
    let refused = plain.get("secret").await.unwrap_err();
    assert!(matches!(refused, KvError::Transport(_)), "{refused}");
    assert_eq!(member.get("secret").await.unwrap(), Some(bytes("1")));
    let _ = stop_serving.send(());
    server.await.unwrap().unwrap();
    cluster.stop().await;
}
