//! Each server refuses what is unsigned, mis-signed, replayed or from the wrong peer, names
//! why, and is unchanged by it: a valid message after the refusals is handled as if they
//! never came.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use virga_ledger::tx::SigningKey;
use virga_ledger::wlc::{Agreement, AgreementPolicy, ChainedTx, OrderedBlock, Proposal, ProposalBatch, SignedVote};
use virga_net::role::{CallId, Command, Event};

use super::chainify_server::ChainifyServer;
use super::commit::CommitServer;
use super::execution::ExecutionServer;
use super::orderer::OrderingServer;
use super::*;

fn org_key(index: u64) -> SigningKey {
    SigningKey::from_seed(100 + index)
}

fn client_key() -> SigningKey {
    SigningKey::from_seed(200)
}

fn orderer_key() -> SigningKey {
    SigningKey::from_seed(300)
}

fn config() -> Arc<PipelineConfig> {
    Arc::new(PipelineConfig {
        organizations: (1..=3).map(|index| (format!("org-{index}"), org_key(index).address())).collect(),
        clients: BTreeMap::from([("client-0".to_string(), client_key().address())]),
        client_orgs: BTreeMap::from([("client-0".to_string(), "org-1".to_string())]),
        orderer: orderer_key().address(),
        orderers: orderer_names(1),
        raft: RaftTiming::default(),
        policy: AgreementPolicy::new(2, 3).unwrap(),
        agreements: 2,
        batch_size: 1,
        batch_wait: Duration::from_millis(1),
        block_size: 1,
        block_wait: Duration::from_millis(1),
        checkpoint_every: 4,
        keep_checkpoints: 3,
        call_deadline: Duration::from_millis(100),
        retry_after: Duration::from_millis(10),
    })
}

fn request(from: &str, call: u64, request: Request) -> PipelineEvent<()> {
    Event::Request { from: from.to_string(), call: CallId(call), request }
}

/// The reply to `call` among `out`, as Ok(response) or Err(refusal reason).
fn reply(out: &[PipelineCommand], call: u64) -> Option<Result<Response, String>> {
    out.iter().find_map(|command| match command {
        Command::Reply { call: CallId(id), response, .. } if *id == call => Some(match response {
            Response::Refused(reason) => Err(reason.clone()),
            other => Ok(other.clone()),
        }),
        _ => None,
    })
}

fn proposal(seq: u64) -> Proposal {
    Proposal::sign(
        &client_key(),
        "client-0",
        seq,
        vec![format!("UPDATE checking SET bal = bal + {seq} WHERE custid = 1")],
    )
}

#[test]
fn a_chainify_server_refuses_forged_replayed_and_foreign_proposals() {
    let mut server = ChainifyServer::new("org-1", org_key(1), config());
    let mut out = Vec::new();
    let mut forged = proposal(1);
    forged.statements[0] = "DELETE FROM checking".to_string();
    let unknown = Proposal::sign(&SigningKey::from_seed(9), "client-9", 1, vec!["SELECT 1".to_string()]);
    server.step(0, request("client-0", 1, Request::Propose(forged)), &mut out);
    server.step(0, request("client-9", 2, Request::Propose(unknown)), &mut out);
    server.step(0, request("client-1", 3, Request::Propose(proposal(1))), &mut out);
    assert!(reply(&out, 1).unwrap().unwrap_err().contains("signed by"), "{out:?}");
    assert!(reply(&out, 2).unwrap().unwrap_err().contains("client-9"));
    assert!(reply(&out, 3).unwrap().unwrap_err().contains("own clients"));
    assert_eq!(server.stats().proposals, 0, "refusals change nothing");
    out.clear();
    server.step(0, request("client-0", 4, Request::Propose(proposal(1))), &mut out);
    assert!(reply(&out, 4).is_none(), "a good proposal waits for its outcome");
    assert!(
        out.iter().any(|command| matches!(command, Command::Call { request: Request::Agree(_), .. })),
        "and its batch goes to the others for agreement"
    );
    server.step(0, request("client-0", 5, Request::Propose(proposal(1))), &mut out);
    assert!(reply(&out, 5).unwrap().unwrap_err().contains("replay"));
    assert_eq!(server.stats().proposals, 1);
}

#[test]
fn a_chainify_server_agrees_only_to_a_peer_batch_of_its_clients_once() {
    let mut server = ChainifyServer::new("org-2", org_key(2), config());
    let batch = ProposalBatch { origin: "org-1".to_string(), number: 0, proposals: vec![proposal(1), proposal(2)] };
    let mut out = Vec::new();
    // Not from org-1's ChainifyServer, or claiming another origin.
    server.step(0, request("org-3/chainify", 1, Request::Agree(batch.clone())), &mut out);
    server.step(0, request("org-1/exec", 2, Request::Agree(batch.clone())), &mut out);
    let doubled = ProposalBatch { proposals: vec![proposal(3), proposal(3)], ..batch.clone() };
    server.step(0, request("org-1/chainify", 3, Request::Agree(doubled)), &mut out);
    for call in 1..=3 {
        assert!(reply(&out, call).unwrap().is_err(), "call {call}: {out:?}");
    }
    server.step(0, request("org-1/chainify", 4, Request::Agree(batch.clone())), &mut out);
    let Ok(Response::Agreed(agreement)) = reply(&out, 4).unwrap() else { panic!("{out:?}") };
    assert_eq!(agreement.check(&config().organizations, &batch.hash()), Ok(()));
    // The same batch again (a retry) gets the same agreement; a new batch replaying a
    // proposal does not.
    server.step(0, request("org-1/chainify", 5, Request::Agree(batch.clone())), &mut out);
    assert!(matches!(reply(&out, 5), Some(Ok(Response::Agreed(_)))));
    let replaying = ProposalBatch { number: 1, proposals: vec![proposal(2)], ..batch };
    server.step(0, request("org-1/chainify", 6, Request::Agree(replaying)), &mut out);
    assert!(reply(&out, 6).unwrap().unwrap_err().contains("replays"));
    assert_eq!(server.stats().agreed_for_peers, 1);
}

fn chained(agreeing: &[u64]) -> ChainedTx {
    let batch = ProposalBatch { origin: "org-1".to_string(), number: 0, proposals: vec![proposal(1)] };
    let hash = batch.hash();
    let agreements =
        agreeing.iter().map(|index| Agreement::sign(&org_key(*index), &format!("org-{index}"), hash)).collect();
    ChainedTx { batch, agreements }
}

/// Completes every Raft log append among `out` (clearing it), and says what was replied.
fn complete_appends(orderer: &mut OrderingServer, out: &mut Vec<PipelineCommand>) -> Vec<PipelineCommand> {
    let mut seen = Vec::new();
    while !out.is_empty() {
        for command in std::mem::take(out) {
            if let Command::Io { io, op: PipelineIo::AppendRaft(_) } = &command {
                let done = PipelineIoDone::RaftAppended(Ok(()));
                orderer.step(0, Event::IoDone { io: *io, result: done }, out);
            }
            seen.push(command);
        }
    }
    seen
}

/// A one-replica ordering group, opened on an empty log and ticked until it leads.
fn leading_orderer() -> OrderingServer {
    let mut orderer = OrderingServer::new("orderer-1", orderer_key(), config(), 7);
    let mut out = Vec::new();
    orderer.step(0, Event::Start, &mut out);
    orderer.step(
        0,
        Event::IoDone { io: virga_net::role::IoId(0), result: PipelineIoDone::LoadedRaft(Vec::new()) },
        &mut out,
    );
    for _ in 0..100 {
        let seen = complete_appends(&mut orderer, &mut out);
        if orderer.is_leader() {
            return orderer;
        }
        let tick = seen.iter().rev().find_map(|command| match command {
            Command::SetTimer { timer, .. } => Some(*timer),
            _ => None,
        });
        orderer.step(0, Event::Timer(tick.expect("the replica keeps its tick armed")), &mut out);
    }
    panic!("a one-replica group elected no leader in 100 ticks");
}

#[test]
fn the_orderer_refuses_batches_without_the_agreements_it_needs() {
    let mut orderer = OrderingServer::new("orderer-1", orderer_key(), config(), 7);
    let mut out = Vec::new();
    orderer.step(0, request("org-1/chainify", 1, Request::Order(chained(&[1, 2]))), &mut out);
    assert!(reply(&out, 1).unwrap().unwrap_err().contains("reading its log"));
    let mut orderer = leading_orderer();
    orderer.step(0, request("org-1/chainify", 2, Request::Order(chained(&[1]))), &mut out);
    assert!(reply(&out, 2).unwrap().unwrap_err().contains("agreements from 1"));
    orderer.step(0, request("org-2/chainify", 3, Request::Order(chained(&[1, 2]))), &mut out);
    assert!(reply(&out, 3).unwrap().is_err(), "only the batch's origin orders it");
    let mut forged = chained(&[1, 2]);
    forged.agreements[1] = Agreement::sign(&org_key(3), "org-2", forged.batch.hash());
    orderer.step(0, request("org-1/chainify", 4, Request::Order(forged)), &mut out);
    assert!(reply(&out, 4).unwrap().unwrap_err().contains("signed by"));
    out.clear();
    assert!(orderer.blocks().is_empty(), "nothing refused was ordered");
    orderer.step(0, request("org-1/chainify", 5, Request::Order(chained(&[1, 2]))), &mut out);
    let seen = complete_appends(&mut orderer, &mut out);
    assert_eq!(reply(&seen, 5), Some(Ok(Response::Ordered)), "{seen:?}");
    assert_eq!(orderer.blocks().len(), 1);
    assert_eq!(orderer.blocks()[0].batches, vec![chained(&[1, 2])]);
    assert_eq!(orderer.blocks()[0].check(orderer_key().address()), Ok(()));
    assert_eq!(orderer.stats().refused.len(), 3);
    // Sent again after a lost acknowledgement: answered from the log, not ordered twice.
    orderer.step(0, request("org-1/chainify", 6, Request::Order(chained(&[1, 2]))), &mut out);
    assert_eq!(reply(&out, 6), Some(Ok(Response::Ordered)));
    assert_eq!((orderer.blocks().len(), orderer.stats().duplicates), (1, 1));
}

#[test]
fn an_orderer_refuses_raft_traffic_from_strangers_and_bytes_that_do_not_decode() {
    let mut orderer = leading_orderer();
    let mut out = Vec::new();
    orderer.step(0, request("org-1/chainify", 1, Request::Raft(vec![0x0a, 0x00])), &mut out);
    assert!(reply(&out, 1).unwrap().unwrap_err().contains("not an orderer replica"));
    orderer.step(0, request("orderer-1", 2, Request::Raft(vec![0xff; 7])), &mut out);
    assert!(reply(&out, 2).unwrap().unwrap_err().contains("does not decode"));
    assert!(orderer.is_leader());
    let term = orderer.led_terms().to_vec();
    orderer.step(0, request("org-1/chainify", 3, Request::Order(chained(&[1, 2]))), &mut out);
    complete_appends(&mut orderer, &mut out);
    assert_eq!((orderer.blocks().len(), orderer.led_terms()), (1, term.as_slice()));
}

#[test]
fn an_orderer_that_does_not_lead_names_the_leader_it_knows() {
    let mut orderer = OrderingServer::new("orderer-1", orderer_key(), config(), 7);
    let mut out = Vec::new();
    orderer.step(
        0,
        Event::IoDone { io: virga_net::role::IoId(0), result: PipelineIoDone::LoadedRaft(Vec::new()) },
        &mut out,
    );
    orderer.step(0, request("org-1/chainify", 1, Request::Order(chained(&[1, 2]))), &mut out);
    assert_eq!(reply(&out, 1), Some(Ok(Response::NotLeader(String::new()))));
    assert!(orderer.blocks().is_empty());
}

#[test]
fn a_commit_server_counts_no_forged_or_misaddressed_vote() {
    let mut commit = CommitServer::new("org-1", org_key(1), config(), None);
    let mut out = Vec::new();
    commit.step(
        0,
        Event::IoDone { io: virga_net::role::IoId(0), result: PipelineIoDone::LoadedVotes(Vec::new()) },
        &mut out,
    );
    let hash = [7; 32];
    commit.step(0, request("org-1/exec", 1, Request::Decide { block: 0, hash: Some(hash) }), &mut out);
    commit.step(0, Event::IoDone { io: virga_net::role::IoId(1), result: PipelineIoDone::VoteLogged(0) }, &mut out);
    // org-2's name signed with org-3's key; org-2's vote sent by org-3; a vote for another
    // block; an organization outside the consortium.
    let forged = SignedVote::sign(&org_key(3), "org-2", 0, hash);
    let relayed = SignedVote::sign(&org_key(2), "org-2", 0, hash);
    let other_block = SignedVote::sign(&org_key(2), "org-2", 1, hash);
    out.clear();
    commit.step(0, request("org-2/commit", 10, Request::Vote { block: 0, vote: Some(forged) }), &mut out);
    commit.step(0, request("org-3/commit", 11, Request::Vote { block: 0, vote: Some(relayed.clone()) }), &mut out);
    commit.step(0, request("org-2/commit", 12, Request::Vote { block: 0, vote: Some(other_block) }), &mut out);
    commit.step(0, request("org-9/commit", 13, Request::Vote { block: 0, vote: Some(relayed.clone()) }), &mut out);
    for call in 10..=13 {
        assert!(reply(&out, call).unwrap().is_err(), "call {call}: {out:?}");
    }
    assert!(reply(&out, 1).is_none(), "no refused vote decided the block");
    commit.step(0, request("org-2/commit", 14, Request::Vote { block: 0, vote: Some(relayed) }), &mut out);
    let Some(Ok(Response::VoteAck(Some(own)))) = reply(&out, 14) else { panic!("{out:?}") };
    assert_eq!(own.ledger_block_hash, hash, "the answer carries the server's own vote");
    assert!(matches!(reply(&out, 1), Some(Ok(Response::Decided(Decision::Commit)))));
}

#[test]
fn an_execution_server_refuses_a_block_the_orderer_did_not_sign() {
    let mut exec = ExecutionServer::new("org-1", config(), None);
    let mut out = Vec::new();
    exec.step(0, Event::Start, &mut out);
    exec.step(
        0,
        Event::IoDone { io: virga_net::role::IoId(0), result: PipelineIoDone::Loaded(Ok((0, [0; 32]))) },
        &mut out,
    );
    let fetch = out
        .iter()
        .find_map(|command| match command {
            Command::Call { call, request: Request::Fetch { from: 0 }, .. } => Some(*call),
            _ => None,
        })
        .expect("a fetch of block 0");
    let forged = OrderedBlock::sign(&org_key(1), 0, [0; 32], vec![chained(&[1, 2])]);
    out.clear();
    exec.step(0, Event::Response { call: fetch, result: Ok(Response::Blocks(vec![forged])) }, &mut out);
    assert_eq!(exec.stats().refused_blocks, 1);
    assert!(!out.iter().any(|command| matches!(command, Command::Io { op: PipelineIo::Execute { .. }, .. })));
    let fetch = out
        .iter()
        .find_map(|command| match command {
            Command::Call { call, request: Request::Fetch { from: 0 }, .. } => Some(*call),
            _ => None,
        })
        .expect("block 0 is asked for again");
    let signed = OrderedBlock::sign(&orderer_key(), 0, [0; 32], vec![chained(&[1]), chained(&[1, 2])]);
    out.clear();
    exec.step(0, Event::Response { call: fetch, result: Ok(Response::Blocks(vec![signed])) }, &mut out);
    let executed = out.iter().find_map(|command| match command {
        Command::Io { op: PipelineIo::Execute { transactions, .. }, .. } => Some(transactions.len()),
        _ => None,
    });
    assert_eq!(executed, Some(1), "the batch with one agreement is dropped, the agreed one executed");
    assert_eq!(exec.stats().dropped_batches, 1);
}
