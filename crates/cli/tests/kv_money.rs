//! What the store's process tests share: accounts holding money, transfers that also mark
//! themselves done, and the audits (through the API, and offline on the stopped cluster).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use virga_dkv::api::grpc::RemoteKv;
use virga_dkv::api::{Kv, KvError};

use crate::support::text;

pub(crate) const ACCOUNTS: usize = 8;
pub(crate) const INITIAL: u64 = 100;

pub(crate) fn account(index: usize) -> Bytes {
    Bytes::from(format!("acct-{index}"))
}

pub(crate) fn balance(value: Option<&Bytes>) -> u64 {
    value.and_then(|value| std::str::from_utf8(value).ok()).and_then(|text| text.parse().ok()).unwrap_or(0)
}

/// Gives every account its initial balance.
pub(crate) async fn open_accounts(kv: &Kv<RemoteKv>) {
    for index in 0..ACCOUNTS {
        kv.put(account(index), INITIAL.to_string()).await.unwrap();
    }
}

/// Moves 1 from `from` to `to` and marks the transfer `mark` done, in one transaction.
pub(crate) async fn transfer(kv: &Kv<RemoteKv>, from: usize, to: usize, mark: String) -> Result<(), KvError> {
    let txn = kv.begin().await?;
    let (a, b) = (txn.get(account(from)).await?, txn.get(account(to)).await?);
    let (a, b) = (balance(a.as_ref()), balance(b.as_ref()));
    if a > 0 {
        txn.put(account(from), (a - 1).to_string()).await?;
        txn.put(account(to), (b + 1).to_string()).await?;
    }
    txn.put(mark, "done").await?;
    txn.commit().await.map(|_| ())
}

/// The total over the accounts and the acknowledged marks that are missing, read in one
/// transaction, again while it fails (a killed client's prepared transactions are being
/// terminated, a restarted role is coming back).
pub(crate) async fn audit(kv: &Kv<RemoteKv>, marks: &[String]) -> (u64, Vec<String>) {
    let mut last = None;
    for _ in 0..100 {
        match audit_once(kv, marks).await {
            Ok(found) => return found,
            Err(error) => last = Some(error),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the audit never committed: {last:?}");
}

async fn audit_once(kv: &Kv<RemoteKv>, marks: &[String]) -> Result<(u64, Vec<String>), KvError> {
    let txn = kv.begin().await?;
    let mut total = 0;
    for index in 0..ACCOUNTS {
        total += balance(txn.get(account(index)).await?.as_ref());
    }
    let mut missing = Vec::new();
    for mark in marks {
        if txn.get(mark.clone()).await?.is_none() {
            missing.push(mark.clone());
        }
    }
    txn.commit().await?;
    Ok((total, missing))
}

/// `virga kv audit` on the stopped cluster in `dir`: it must pass (every group's replicas
/// agree, the accounts hold the exact total); its report.
pub(crate) fn offline_audit(dir: &Path) -> serde_json::Value {
    let total = (INITIAL * ACCOUNTS as u64).to_string();
    let audit = Command::new(env!("CARGO_BIN_EXE_virga"))
        .args(["kv", "audit", "--dir", &dir.display().to_string(), "--prefix", "acct-", "--expect-total", &total])
        .output()
        .unwrap();
    let report = text(&audit.stdout);
    assert!(audit.status.success(), "{report}{}", text(&audit.stderr));
    serde_json::from_str(&report).unwrap()
}
