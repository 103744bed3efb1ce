use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use virga_dkv::client::{Program, TxnOp};

use super::proto::{compare, request_op, response_op, KeyValue, RangeResponse, ResponseOp, TxnResponse};
use super::*;
use crate::dkv::{program, DkvBenchConfig};
use crate::kv::ycsb_t::{YcsbT, YcsbTConfig, YcsbTTxn};

fn workload(records: u64) -> YcsbT {
    YcsbT::new(YcsbTConfig { records, value_size: 24, ..YcsbTConfig::default() }).unwrap()
}

fn read_write(ids: Vec<u64>) -> YcsbTTxn {
    YcsbTTxn { ids, writes: true, seed: 99 }
}

/// The bytes etcd expects: field numbers and wire types of etcd's rpc.proto, worked out by
/// hand (tag = field << 3 | wire type).
#[test]
fn messages_use_etcds_field_numbers() {
    let compare = unchanged_since(b"k".to_vec(), 7);
    // result EQUAL (0) is the default and not sent; target MOD = 2 (field 2, varint);
    // key (field 3, bytes); mod_revision (field 6, varint) in the target_union.
    assert_eq!(compare.encode_to_vec(), [0x10, 0x02, 0x1a, 0x01, b'k', 0x30, 0x07]);
    let range = proto::RangeRequest { key: b"a".to_vec(), serializable: true, ..Default::default() };
    assert_eq!(range.encode_to_vec(), [0x0a, 0x01, b'a', 0x38, 0x01]);
    // A put inside a RequestOp: request_put is field 2 of RequestOp, value field 2 of PutRequest.
    let op = put_op(b"k".to_vec(), b"v".to_vec());
    assert_eq!(op.encode_to_vec(), [0x12, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'v']);
    // TxnResponse: succeeded is field 2; a range answer is field 1 of ResponseOp; a KeyValue's
    // mod_revision is its field 3.
    let answer = [0x10, 0x01, 0x1a, 0x06, 0x0a, 0x04, 0x12, 0x02, 0x18, 0x05];
    let decoded = TxnResponse::decode(&answer[..]).unwrap();
    assert!(decoded.succeeded);
    assert_eq!(read_revisions(&decoded, 1), Ok(vec![5]));
}

/// tonic calls the method path etcd serves: the package and service names matter on the wire.
#[test]
fn the_client_calls_etcds_method_paths() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
    for method in ["Range", "Put", "DeleteRange", "Txn"] {
        assert!(generated.contains(&format!("\"/etcdserverpb.KV/{method}\"")), "no path for {method}");
    }
}

#[test]
fn a_transaction_reads_linearizably_then_writes_what_the_store_writes() {
    let workload = workload(1000);
    let mut rng = SmallRng::seed_from_u64(7);
    let mut writers = 0;
    for _ in 0..300 {
        let txn = workload.draw(&mut rng);
        let reads = read_request(&txn);
        assert!(reads.compare.is_empty() && reads.failure.is_empty());
        let read_keys: Vec<Vec<u8>> = reads
            .success
            .iter()
            .map(|op| match &op.request {
                Some(request_op::Request::RequestRange(range)) => {
                    assert!(!range.serializable && range.range_end.is_empty() && range.revision == 0);
                    range.key.clone()
                }
                other => panic!("a read Txn carries {other:?}"),
            })
            .collect();
        let Program::Ops(ops) = program(&txn, &workload) else { panic!("ycsb-t programs are operations") };
        let gets: Vec<Vec<u8>> =
            ops.iter().filter_map(|op| if let TxnOp::Get(key) = op { Some(key.to_vec()) } else { None }).collect();
        assert_eq!(read_keys, gets);
        if !txn.writes {
            continue;
        }
        writers += 1;
        let revisions: Vec<i64> = (0..txn.ids.len() as i64).map(|i| 100 + i).collect();
        let request = write_request(&txn, &revisions, 24);
        assert_eq!(proto::TxnRequest::decode(&request.encode_to_vec()[..]).unwrap(), request);
        let compared: Vec<(Vec<u8>, i64)> = request
            .compare
            .iter()
            .map(|c| {
                assert_eq!(
                    (c.result, c.target),
                    (compare::CompareResult::Equal as i32, compare::CompareTarget::Mod as i32)
                );
                match c.target_union {
                    Some(compare::TargetUnion::ModRevision(revision)) => (c.key.clone(), revision),
                    ref other => panic!("compares {other:?}"),
                }
            })
            .collect();
        assert_eq!(compared, gets.iter().cloned().zip(revisions.iter().copied()).collect::<Vec<_>>());
        let puts: Vec<(Bytes, Bytes)> = request
            .success
            .iter()
            .map(|op| match &op.request {
                Some(request_op::Request::RequestPut(put)) => {
                    (Bytes::from(put.key.clone()), Bytes::from(put.value.clone()))
                }
                other => panic!("a write Txn carries {other:?}"),
            })
            .collect();
        let store_puts: Vec<(Bytes, Bytes)> = ops
            .into_iter()
            .filter_map(|op| if let TxnOp::Put(key, value) = op { Some((key, value)) } else { None })
            .collect();
        assert_eq!(puts, store_puts);
    }
    assert!(writers > 10, "only {writers} read-write transactions drawn");
}

#[test]
fn read_answers_that_do_not_match_the_request_are_errors() {
    let range = |kvs: Vec<KeyValue>| ResponseOp {
        response: Some(response_op::Response::ResponseRange(RangeResponse { kvs, ..Default::default() })),
    };
    let found = KeyValue { key: b"a".to_vec(), mod_revision: 12, ..Default::default() };
    let answer = TxnResponse { succeeded: true, responses: vec![range(vec![found]), range(Vec::new())], header: None };
    // A missing key reads as revision 0, which etcd's compare matches only while it is missing.
    assert_eq!(read_revisions(&answer, 2), Ok(vec![12, 0]));
    assert!(read_revisions(&answer, 3).is_err());
    let failed = TxnResponse { succeeded: false, ..answer.clone() };
    assert!(read_revisions(&failed, 2).is_err());
    let put = ResponseOp { response: Some(response_op::Response::ResponsePut(Default::default())) };
    let wrong_kind = TxnResponse { succeeded: true, responses: vec![range(Vec::new()), put], header: None };
    assert!(read_revisions(&wrong_kind, 2).is_err());
}

#[test]
fn the_missing_binary_names_the_package_to_install() {
    // The message itself; the command line's test runs `virga` with an empty PATH.
    assert!(EtcdMissing.to_string().contains(INSTALL_COMMAND), "{EtcdMissing}");
    assert!(!is_executable(Path::new("/nonexistent/etcd")));
}

fn tiny_config() -> DkvBenchConfig {
    DkvBenchConfig {
        shards: 1,
        window: 2,
        warmup: Duration::from_millis(200),
        ..DkvBenchConfig::new(2, Duration::from_millis(800), 5)
    }
}

/// Needs etcd installed (`apt-get install etcd-server`): `cargo test -p virga-bench -- --ignored etcd`.
#[test]
#[ignore]
fn etcd_refuses_a_write_whose_read_revision_is_stale() {
    let binary = etcd_available().unwrap();
    let mut cluster = EtcdCluster::start(&binary).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let channels = cluster.ready().await.unwrap();
        assert_eq!(channels.len(), MEMBERS * CHANNELS_PER_MEMBER);
        let workload = workload(300);
        load(&channels, &workload).await.unwrap();
        let mut client = KvClient::new(channels[1].clone());
        let txn = read_write(vec![3, 140, 299]);
        let reads = client.txn(read_request(&txn)).await.unwrap().into_inner();
        let revisions = read_revisions(&reads, 3).unwrap();
        assert!(revisions.iter().all(|revision| *revision > 0), "{revisions:?}");
        let Some(response_op::Response::ResponseRange(first)) = &reads.responses[0].response else { panic!() };
        assert_eq!(first.kvs[0].value, value(3, 24));
        let write = client.txn(write_request(&txn, &revisions, 24)).await.unwrap().into_inner();
        assert!(write.succeeded);
        // The same revisions are stale now: the compare fails and nothing is written.
        let again = YcsbTTxn { seed: 1234, ..txn.clone() };
        let refused = client.txn(write_request(&again, &revisions, 24)).await.unwrap().into_inner();
        assert!(!refused.succeeded);
        let after = client.txn(read_request(&txn)).await.unwrap().into_inner();
        let Some(response_op::Response::ResponseRange(first)) = &after.responses[0].response else { panic!() };
        assert_eq!(first.kvs[0].value, value(txn.seed, 24));
        assert!(read_revisions(&after, 3).unwrap().iter().zip(&revisions).all(|(now, then)| now > then));
    });
    cluster.check_running().unwrap();
}

/// Needs etcd installed: a short run commits read-only and read-write transactions.
#[test]
#[ignore]
fn etcd_runs_the_mix() {
    let report = run_etcd(&tiny_config(), &workload(2000)).unwrap();
    assert!(report.version.contains("Version"), "{}", report.version);
    assert!(report.committed_read_only > 0 && report.committed > report.committed_read_only, "{report:?}");
    assert_eq!(report.errors, 0, "{report:?}");
}
