use super::*;

fn keys() -> (Vec<SigningKey>, BTreeMap<String, Address>) {
    let keys: Vec<SigningKey> = (1..=3).map(SigningKey::from_seed).collect();
    let members = keys.iter().enumerate().map(|(at, key)| (format!("org-{}", at + 1), key.address())).collect();
    (keys, members)
}

fn client() -> (SigningKey, BTreeMap<String, Address>) {
    let key = SigningKey::from_seed(100);
    let clients = BTreeMap::from([("client-1".to_string(), key.address())]);
    (key, clients)
}

fn chained() -> ChainedTx {
    let (keys, _) = keys();
    let (client_key, _) = client();
    let proposals = (1..=3)
        .map(|seq| Proposal::sign(&client_key, "client-1", seq, vec![format!("UPDATE t SET v = {seq} WHERE k = 1")]))
        .collect();
    let batch = ProposalBatch { origin: "org-1".to_string(), number: 4, proposals };
    let hash = batch.hash();
    let agreements = vec![Agreement::sign(&keys[0], "org-1", hash), Agreement::sign(&keys[1], "org-2", hash)];
    ChainedTx { batch, agreements }
}

#[test]
fn every_message_round_trips_and_checks() {
    let (keys, members) = keys();
    let (_, clients) = client();
    let chained = chained();
    for proposal in &chained.batch.proposals {
        assert_eq!(Proposal::decode(&proposal.encode()).as_ref(), Ok(proposal));
        assert_eq!(proposal.check(&clients), Ok(()));
    }
    assert_eq!(ProposalBatch::decode(&chained.batch.encode()).as_ref(), Ok(&chained.batch));
    assert_eq!(Agreement::decode(&chained.agreements[0].encode()).as_ref(), Ok(&chained.agreements[0]));
    assert_eq!(ChainedTx::decode(&chained.encode()).as_ref(), Ok(&chained));
    assert_eq!(chained.check(&members, 2), Ok(()));
    let orderer = SigningKey::from_seed(50);
    let block = OrderedBlock::sign(&orderer, 0, [0; 32], vec![chained.clone()]);
    assert_eq!(OrderedBlock::decode(&block.encode()).as_ref(), Ok(&block));
    assert_eq!(block.check(orderer.address()), Ok(()));
    assert_eq!(block.proposals().count(), 3);
    let next = OrderedBlock::sign(&orderer, 1, block.hash(), vec![]);
    assert_ne!(next.hash(), block.hash());
    assert!(matches!(block.check(keys[0].address()), Err(Refused::WrongSigner { .. })));
    let cut = BlockCut { batches: vec![chained.clone(), chained.clone()] };
    let bytes = cut.encode();
    assert_eq!(BlockCut::decode(&bytes).as_ref(), Ok(&cut));
    for end in 0..bytes.len() {
        assert!(BlockCut::decode(&bytes[..end]).is_err(), "a cut cut at {end}");
    }
}

#[test]
fn forged_replayed_and_short_agreed_messages_are_refused_by_name() {
    let (keys, members) = keys();
    let (client_key, clients) = client();
    let mut altered = Proposal::sign(&client_key, "client-1", 1, vec!["SELECT 1".to_string()]);
    altered.statements[0] = "DELETE FROM t".to_string();
    assert!(matches!(altered.check(&clients), Err(Refused::WrongSigner { name, .. }) if name == "client-1"));
    let stranger = Proposal::sign(&SigningKey::from_seed(7), "client-9", 1, vec!["SELECT 1".to_string()]);
    assert!(matches!(stranger.check(&clients), Err(Refused::Unknown { role: "client", .. })));
    let empty = Proposal::sign(&client_key, "client-1", 2, vec![]);
    assert_eq!(empty.check(&clients), Err(Refused::Empty));
    let huge = Proposal::sign(&client_key, "client-1", 3, vec!["x".repeat(MAX_STATEMENT + 1)]);
    assert!(matches!(huge.check(&clients), Err(Refused::TooLarge { field: "longest statement", .. })));

    let mut chained = chained();
    // An agreement replayed from another batch.
    let other = Agreement::sign(&keys[2], "org-3", [9; 32]);
    chained.agreements.push(other);
    assert_eq!(chained.check(&members, 2), Err(Refused::OtherBatch { organization: "org-3".to_string() }));
    chained.agreements.pop();
    // One organization agreeing twice counts once.
    let twice = chained.agreements[0].clone();
    chained.agreements[1] = twice;
    assert_eq!(chained.check(&members, 2), Err(Refused::NotAgreed { have: 1, need: 2 }));
    // An agreement signed by one organization in another's name.
    chained.agreements[1] = Agreement::sign(&keys[2], "org-2", chained.batch.hash());
    assert!(matches!(chained.check(&members, 2), Err(Refused::WrongSigner { name, .. }) if name == "org-2"));
    // A proposal changed after the agreements were signed.
    let mut changed = self::chained();
    changed.batch.proposals.pop();
    assert!(matches!(changed.check(&members, 2), Err(Refused::OtherBatch { .. })));
}

#[test]
fn damaged_bytes_are_named() {
    let orderer = SigningKey::from_seed(50);
    let bytes = OrderedBlock::sign(&orderer, 3, [1; 32], vec![chained()]).encode();
    for cut in 0..bytes.len() {
        assert!(matches!(OrderedBlock::decode(&bytes[..cut]), Err(MessageError::Truncated { .. })), "cut at {cut}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(OrderedBlock::decode(&longer), Err(MessageError::Trailing { message: "ordered block", trailing: 1 }));
    let mut format = bytes.clone();
    format[0] = 2;
    assert_eq!(OrderedBlock::decode(&format), Err(MessageError::Format { message: "ordered block", format: 2 }));
    let mut parity = bytes.clone();
    *parity.last_mut().unwrap() = 5;
    assert_eq!(OrderedBlock::decode(&parity), Err(MessageError::Parity { message: "ordered block", parity: 5 }));
    let mut batches = bytes.clone();
    batches[41..45].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(OrderedBlock::decode(&batches), Err(MessageError::TooLong { field: "batch count", .. })));
    let proposal = chained().batch.proposals[0].encode();
    let mut name = proposal.clone();
    name[2] = 0xff;
    assert!(matches!(Proposal::decode(&name), Err(MessageError::NotUtf8 { field: "client name", .. })));
}
