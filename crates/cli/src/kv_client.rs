//! `virga kv get|put|delete|scan|txn`: the distributed store's shell, a client of the
//! `virga.kv.v1` service (`virga kv cluster up`).
//!
//! Exit status: 0 success; 1 a missing key (`get`); 3 the transaction aborted (the reason
//! on stderr); 4 a commit whose outcome is unknown; 2 bad input or any other error.

use std::io::BufRead;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::Subcommand;
use virga_dkv::api::grpc::RemoteKv;
use virga_dkv::api::{Kv, KvError, Transaction};

#[derive(Subcommand)]
pub(crate) enum KvClientCommand {
    /// Prints the value of KEY (nothing, and exit 1, when it is missing).
    Get { key: String },
    /// Sets KEY to VALUE.
    Put { key: String, value: String },
    /// Removes KEY.
    Delete { key: String },
    /// Prints the keys in [FROM, TO) with their values, one `key value` line each.
    Scan {
        from: String,
        to: String,
        /// At most this many rows.
        #[arg(long, default_value_t = 4096, value_parser = crate::limits::count_u64_between(1, 4096))]
        limit: u64,
    },
    /// Runs one transaction from standard input, an operation a line (`get K`, `put K V`,
    /// `delete K`, `scan A B`, then optionally `commit` or `abort`; commit is the default),
    /// printing a line per operation.
    Txn,
}

const MISSING: u8 = 1;
const OTHER: u8 = 2;
const ABORTED: u8 = 3;
const UNKNOWN: u8 = 4;

/// The exit status an error earns, after saying it on stderr.
fn failed(error: &KvError) -> ExitCode {
    eprintln!("error: {error}");
    ExitCode::from(match error {
        KvError::Aborted { .. } => ABORTED,
        KvError::OutcomeUnknown { .. } => UNKNOWN,
        _ => OTHER,
    })
}

/// `host:port` or a URL.
fn url(address: &str) -> String {
    if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    }
}

fn show(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub(crate) fn run(address: &str, wait: f64, tls: &crate::kv_cluster::TlsArgs, command: &KvClientCommand) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: starting the runtime: {error}");
            return ExitCode::from(OTHER);
        }
    };
    runtime.block_on(async {
        let wait = Duration::from_secs_f64(wait);
        let connected = match tls.load() {
            Ok(Some(tls)) => RemoteKv::connect_tls(&url(address), wait, &tls),
            Ok(None) => RemoteKv::connect(&url(address), wait),
            Err(error) => Err(KvError::Invalid(format!("{error:#}"))),
        };
        let kv = match connected {
            Ok(backend) => Kv::new(backend),
            Err(error) => return failed(&error),
        };
        let result = match command {
            KvClientCommand::Get { key } => match kv.get(key.clone()).await {
                Ok(Some(value)) => {
                    println!("{}", show(&value));
                    Ok(ExitCode::SUCCESS)
                }
                Ok(None) => Ok(ExitCode::from(MISSING)),
                Err(error) => Err(error),
            },
            KvClientCommand::Put { key, value } => kv.put(key.clone(), value.clone()).await.map(|_| ExitCode::SUCCESS),
            KvClientCommand::Delete { key } => kv.delete(key.clone()).await.map(|_| ExitCode::SUCCESS),
            KvClientCommand::Scan { from, to, limit } => {
                kv.scan(from.clone(), Some(Bytes::from(to.clone())), *limit as u32).await.map(|rows| {
                    for (key, value) in rows {
                        println!("{} {}", show(&key), show(&value));
                    }
                    ExitCode::SUCCESS
                })
            }
            KvClientCommand::Txn => return txn(&kv).await,
        };
        result.unwrap_or_else(|error| failed(&error))
    })
}

/// One line of `virga kv txn`'s input.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    Get(String),
    Put(String, String),
    Delete(String),
    Scan(String, String),
    Commit,
    Abort,
}

fn parse_line(line: &str) -> Result<Line, String> {
    let line = line.trim();
    let (word, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    let rest = rest.trim_start();
    let one = |what: &str| -> Result<String, String> {
        match rest.split_whitespace().collect::<Vec<_>>()[..] {
            [key] => Ok(key.to_string()),
            _ => Err(format!("`{word}` takes one {what}")),
        }
    };
    match word {
        "get" => Ok(Line::Get(one("key")?)),
        "delete" => Ok(Line::Delete(one("key")?)),
        "put" => match rest.split_once(char::is_whitespace) {
            Some((key, value)) => Ok(Line::Put(key.to_string(), value.trim_start().to_string())),
            None => Err("`put` takes a key and a value".to_string()),
        },
        "scan" => match rest.split_whitespace().collect::<Vec<_>>()[..] {
            [from, to] => Ok(Line::Scan(from.to_string(), to.to_string())),
            _ => Err("`scan` takes a start and an end key".to_string()),
        },
        "commit" if rest.is_empty() => Ok(Line::Commit),
        "abort" if rest.is_empty() => Ok(Line::Abort),
        _ => Err(format!("unknown operation {word:?} (get, put, delete, scan, commit or abort)")),
    }
}

/// Standard input's lines as they come (a thread reads them, so the runtime keeps serving
/// the connection while the user types).
fn stdin_lines() -> tokio::sync::mpsc::UnboundedReceiver<std::io::Result<String>> {
    let (send, lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// Runs the operations as they arrive; a malformed line aborts the transaction.
async fn txn(kv: &Kv<RemoteKv>) -> ExitCode {
    let mut input = stdin_lines();
    let txn = match kv.begin().await {
        Ok(txn) => txn,
        Err(error) => return failed(&error),
    };
    let mut number = 0;
    let mut end = Line::Commit;
    while let Some(line) = input.recv().await {
        number += 1;
        let line = match line {
            Ok(line) => line,
            Err(error) => {
                eprintln!("error: reading standard input: {error}");
                return ExitCode::from(OTHER);
            }
        };
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let line = match parse_line(&line) {
            Ok(line) => line,
            Err(problem) => {
                // The transaction is aborted when dropped.
                eprintln!("error: line {number}: {problem}; the transaction is aborted");
                return ExitCode::from(OTHER);
            }
        };
        if matches!(line, Line::Commit | Line::Abort) {
            end = line;
            break;
        }
        match run_line(&txn, &line).await {
            Ok(printed) => println!("{printed}"),
            Err(error) => return failed(&error),
        }
    }
    if end == Line::Abort {
        return match txn.abort().await {
            Ok(()) => {
                println!("aborted");
                ExitCode::SUCCESS
            }
            Err(error) => failed(&error),
        };
    }
    match txn.commit().await {
        Ok(committed) => {
            println!("committed at {}.{}", committed.commit_ts.time, committed.commit_ts.client);
            ExitCode::SUCCESS
        }
        Err(error) => failed(&error),
    }
}

/// Runs one operation; what to print for it.
async fn run_line(txn: &Transaction<RemoteKv>, line: &Line) -> Result<String, KvError> {
    Ok(match line {
        Line::Get(key) => match txn.get(key.clone()).await? {
            Some(value) => show(&value),
            None => "(missing)".to_string(),
        },
        Line::Put(key, value) => {
            txn.put(key.clone(), value.clone()).await?;
            "ok".to_string()
        }
        Line::Delete(key) => {
            txn.delete(key.clone()).await?;
            "ok".to_string()
        }
        Line::Scan(from, to) => {
            let rows = txn.scan(from.clone(), Some(Bytes::from(to.clone())), 4096).await?;
            let rows: Vec<String> = rows.iter().map(|(key, value)| format!("{}={}", show(key), show(value))).collect();
            rows.join(" ")
        }
        Line::Commit | Line::Abort => String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_and_bad_ones_name_their_problem() {
        assert_eq!(parse_line("get a"), Ok(Line::Get("a".into())));
        assert_eq!(parse_line("  put b hello world "), Ok(Line::Put("b".into(), "hello world".into())));
        assert_eq!(parse_line("delete c"), Ok(Line::Delete("c".into())));
        assert_eq!(parse_line("scan a z"), Ok(Line::Scan("a".into(), "z".into())));
        assert_eq!((parse_line("commit"), parse_line("abort")), (Ok(Line::Commit), Ok(Line::Abort)));
        assert_eq!(parse_line("get"), Err("`get` takes one key".to_string()));
        assert_eq!(parse_line("get a b"), Err("`get` takes one key".to_string()));
        assert_eq!(parse_line("put k"), Err("`put` takes a key and a value".to_string()));
        assert_eq!(parse_line("scan a"), Err("`scan` takes a start and an end key".to_string()));
        assert!(parse_line("frob x").unwrap_err().contains("unknown operation \"frob\""));
        assert!(parse_line("commit now").is_err());
        assert_eq!(url("127.0.0.1:1"), "http://127.0.0.1:1");
        assert_eq!(url("http://h:2"), "http://h:2");
    }
}
