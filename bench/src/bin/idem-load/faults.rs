//! The fault-injection run: `unique` loads the gateway with a new key per request and logs
//! every answer; `check` reads that log after the store was killed and restarted, retries every
//! key, and checks what fail-closed promises.
//!
//! The invariants checked (the store keeps what it acknowledged: Redis with its append-only
//! file, PostgreSQL with its WAL):
//! - during the run, only 201 (executed) and 503 (store down: fail closed) answers, never a 500;
//!   a request sent after the store died and answered before it was restarted got a 503;
//! - a request answered 503 did not run: its key's first retry executes (a replay would mean
//!   the upstream ran for it);
//! - a key answered 2xx is replayed on retry, except where the gateway logged that storing its
//!   response failed (the store died between the upstream's answer and the completion write:
//!   the record stays in flight, and a retry after its lease runs the upstream again, which the
//!   gateway's warning says). Those keys are the only ones allowed a second execution;
//! - the fixture's counter of executions equals the distinct keys plus those second
//!   executions, and a second retry of every key is a replay that runs nothing.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::task::JoinSet;

use crate::args::{Args, Failure, unix_ms};
use crate::client::{Answer, Http};

/// The body of every request (the same for a key's retries, so its fingerprint matches).
const BODY: &[u8] = br#"{"amount":1250,"currency":"eur"}"#;

/// The gateway's warning for a response executed but not stored.
const NOT_STORED: &str = "storing the response failed";

/// One request of the load.
struct Sent {
    sent: u64,
    done: u64,
    status: u16,
    key: String,
}

/// `idem-load unique`: a new key per request on every connection until the duration ends; a
/// connection whose answer was not a 2xx pauses `--pause` (20 ms) before its next request, as
/// a client backing off would (and so the outage does not flood the log).
pub(crate) async fn unique(args: &Args) -> Result<(), Failure> {
    let addr = args.need("addr")?;
    let log = args.need("log")?.to_owned();
    let connections = args.get("connections", 32usize)?.max(1);
    let duration = args.duration("duration", Duration::from_secs(30))?;
    let pause = args.duration("pause", Duration::from_millis(20))?;
    let prefix = args.get("prefix", format!("f{}", unix_ms()))?;
    let http = Http::new(addr, connections);
    let end = Instant::now() + duration;
    let mut workers = JoinSet::new();
    for worker in 0..connections {
        let http = http.clone();
        let prefix = prefix.clone();
        workers.spawn(async move {
            let mut log = Vec::new();
            let mut n = 0u64;
            while Instant::now() < end {
                let key = format!("{prefix}-{worker}-{n}");
                n += 1;
                let sent = unix_ms();
                let answer = http.post("/echo", &key, Bytes::from_static(BODY)).await;
                let done = unix_ms();
                if !answer.success() {
                    tokio::time::sleep(pause).await;
                }
                log.push(Sent {
                    sent,
                    done,
                    status: answer.status,
                    key,
                });
            }
            log
        });
    }
    let mut text = String::new();
    let mut requests = 0usize;
    while let Some(joined) = workers.join_next().await {
        let sent = joined.map_err(|e| Failure::Usage(e.to_string()))?;
        requests += sent.len();
        for s in sent {
            let _ = writeln!(text, "{} {} {} {}", s.sent, s.done, s.status, s.key);
        }
    }
    std::fs::write(&log, text).map_err(|e| Failure::Usage(format!("{log}: {e}")))?;
    eprintln!("idem-load unique: {requests} requests logged to {log}");
    Ok(())
}

fn read_log(path: &str) -> Result<Vec<Sent>, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| Failure::Usage(format!("{path}: {e}")))?;
    text.lines()
        .map(|line| {
            let mut fields = line.split(' ');
            let mut number = || fields.next().and_then(|f| f.parse::<u64>().ok());
            let (sent, done, status) = (number(), number(), number());
            match (sent, done, status, fields.next()) {
                (Some(sent), Some(done), Some(status), Some(key)) => Ok(Sent {
                    sent,
                    done,
                    status: u16::try_from(status).unwrap_or(0),
                    key: key.to_owned(),
                }),
                _ => Err(Failure::Usage(format!("{path}: bad line {line:?}"))),
            }
        })
        .collect()
}

/// The keys the gateway logged as executed but not stored.
fn not_stored(path: &str) -> Result<HashSet<String>, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| Failure::Usage(format!("{path}: {e}")))?;
    Ok(text
        .lines()
        .filter(|line| line.contains(NOT_STORED))
        .filter_map(|line| {
            let (_, rest) = line.split_once("idempotency_key=")?;
            let field = rest.split_whitespace().next()?.trim_matches('"');
            // The record key is namespace:scope:key; the client's key has no colon.
            Some(field.rsplit(':').next()?.to_owned())
        })
        .collect())
}

/// Sends every key again until it gets a 2xx (a 409 waits its Retry-After, a 503 or no answer
/// 250 ms) or `deadline` passes; the last answer of each key, in the order of `keys`.
async fn settle_all(
    http: &Http,
    keys: Arc<Vec<String>>,
    connections: usize,
    deadline: Instant,
) -> Vec<Answer> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = JoinSet::new();
    for _ in 0..connections {
        let (http, keys, next) = (http.clone(), keys.clone(), next.clone());
        workers.spawn(async move {
            let mut settled = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(key) = keys.get(index) else {
                    return settled;
                };
                loop {
                    let answer = http.post("/echo", key, Bytes::from_static(BODY)).await;
                    let wait = match answer.status {
                        409 => Duration::from_secs(answer.retry_after.unwrap_or(1).clamp(1, 5)),
                        503 | 0 => Duration::from_millis(250),
                        _ => Duration::ZERO,
                    };
                    if wait.is_zero() || Instant::now() + wait > deadline {
                        settled.push((index, answer));
                        break;
                    }
                    tokio::time::sleep(wait).await;
                }
            }
        });
    }
    let mut answers = vec![
        Answer {
            status: 0,
            replayed: false,
            retry_after: None,
        };
        keys.len()
    ];
    while let Some(joined) = workers.join_next().await {
        for (index, answer) in joined.unwrap_or_default() {
            answers[index] = answer;
        }
    }
    answers
}

fn secs(ms: u64) -> String {
    format!("{:.1}", ms as f64 / 1000.0)
}

/// `idem-load check`: the report and the invariants of one fault-injection run.
pub(crate) async fn check(args: &Args) -> Result<(), Failure> {
    let addr = args.need("addr")?;
    let fixture = Http::new(args.need("fixture")?, 1);
    let store = args.need("store")?;
    let down: u64 = args.get("down-ms", 0)?;
    let up: u64 = args.get("up-ms", 0)?;
    let ready: u64 = args.get("ready-ms", up)?;
    let connections = args.get("connections", 32usize)?.max(1);
    let patience = args.duration("deadline", Duration::from_secs(120))?;
    let sent = read_log(args.need("log")?)?;
    let lost = not_stored(args.need("gateway-log")?)?;
    let http = Http::new(addr, connections);
    let Some(start) = sent.iter().map(|s| s.sent).min() else {
        return Err(Failure::Check("no request was logged".into()));
    };
    let mut problems = Vec::new();

    // Answers per second of the run.
    let statuses = print_timeline(store, &sent, start, [down, up, ready], &mut problems);

    // The outage: a request sent after the kill and answered before the restart got a 503.
    let (inside, inside_bad) = outage(&sent, down, up, &mut problems);
    let first_ok = sent
        .iter()
        .filter(|s| s.done > up && (200..300).contains(&s.status))
        .map(|s| s.done)
        .min();
    let Some(first_ok) = first_ok else {
        problems.push("no 2xx after the restart: the gateway did not recover".into());
        return report(store, &problems);
    };

    // Retry every key until it has a 2xx.
    let keys: Arc<Vec<String>> = Arc::new(sent.iter().map(|s| s.key.clone()).collect());
    let distinct: HashSet<&String> = keys.iter().collect();
    if distinct.len() != keys.len() {
        problems.push("a key was sent twice during the run".into());
    }
    let settled = settle_all(&http, keys.clone(), connections, Instant::now() + patience).await;
    let retried = Retried::of(&sent, &settled, &lost);
    let executed_again = retried.executed_again;
    let executions = fixture.counter().await.map_err(Failure::Usage)?;
    let expected = keys.len() as u64 + executed_again;
    retried.check(patience, &mut problems);
    if executions != expected {
        problems.push(format!(
            "the upstream ran {executions} times for {} keys and {executed_again} second executions (expected {expected})",
            keys.len()
        ));
    }

    // Once more: every key is now a replay, and nothing runs.
    let deadline = Instant::now() + patience;
    check_replays(
        &http,
        keys.clone(),
        connections,
        deadline,
        &fixture,
        executions,
        &mut problems,
    )
    .await?;

    let n = |status: u16| statuses.get(&status).copied().unwrap_or(0);
    let other: u64 = statuses
        .iter()
        .filter(|(s, _)| ![201, 503, 500].contains(*s))
        .map(|(_, n)| n)
        .sum();
    println!(
        "{store}: {} requests, {} inside the outage (all 503: {}); {} keys answered 503, each executed once on retry; \
         {} completions not stored (gateway warnings), {executed_again} of them ran again on retry; \
         upstream executions {executions} = {} distinct keys + {executed_again}",
        sent.len(),
        inside,
        inside_bad == 0,
        n(503),
        lost.len(),
        keys.len(),
    );
    let last_503_after = last_503_after(&sent, up);
    println!(
        "| {store} | {} | {} | {} | {} | {} | {} | {} | {} | {last_503_after} | {executions} | {} | {} / {executed_again} | {} |",
        sent.len(),
        n(201),
        n(503),
        n(500),
        other,
        secs(up.saturating_sub(down)),
        secs(ready.saturating_sub(up)),
        secs(first_ok - up),
        keys.len(),
        lost.len(),
        if problems.is_empty() { "pass" } else { "FAIL" },
    );
    report(store, &problems)
}

/// The requests sent after the kill and answered before the restart, and how many of them
/// were not answered 503 (a problem, as is an outage no request fell in).
fn outage(sent: &[Sent], down: u64, up: u64, problems: &mut Vec<String>) -> (usize, usize) {
    let inside: Vec<&Sent> = sent
        .iter()
        .filter(|s| s.sent >= down && s.done <= up)
        .collect();
    let inside_bad = inside.iter().filter(|s| s.status != 503).count();
    if inside.is_empty() {
        problems.push("no request fell inside the outage".into());
    }
    if inside_bad > 0 {
        problems.push(format!(
            "{inside_bad} requests inside the outage were not answered 503"
        ));
    }
    (inside.len(), inside_bad)
}

/// How long after the restart (`up`) the last 503 was answered: `-` if none was, `before` if
/// none was after it.
fn last_503_after(sent: &[Sent], up: u64) -> String {
    let last_503 = sent
        .iter()
        .filter(|s| s.status == 503)
        .map(|s| s.done)
        .max();
    last_503.map_or("-".into(), |t| {
        if t > up {
            secs(t - up)
        } else {
            "before".into()
        }
    })
}

/// Prints the answers of each second of the run by status (`[down, up, ready]`: when the
/// store was killed, restarted, and answering again); a status other than 201 and 503 is a
/// problem. The answers by status.
fn print_timeline(
    store: &str,
    sent: &[Sent],
    start: u64,
    [down, up, ready]: [u64; 3],
    problems: &mut Vec<String>,
) -> BTreeMap<u16, u64> {
    let mut timeline: BTreeMap<u64, BTreeMap<u16, u64>> = BTreeMap::new();
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    for s in sent {
        *timeline
            .entry(s.done.saturating_sub(start) / 1000)
            .or_default()
            .entry(s.status)
            .or_default() += 1;
        *statuses.entry(s.status).or_default() += 1;
    }
    println!(
        "{store}: answers per second (killed at +{} s, restarted at +{} s, answering again at +{} s)",
        secs(down.saturating_sub(start)),
        secs(up.saturating_sub(start)),
        secs(ready.saturating_sub(start))
    );
    for (second, counts) in &timeline {
        let counts: Vec<String> = counts.iter().map(|(s, n)| format!("{s}: {n}")).collect();
        println!("  +{second:>3} s  {}", counts.join(", "));
    }
    for (&status, &n) in &statuses {
        if status != 201 && status != 503 {
            problems.push(format!(
                "{n} answers {status} during the run (only 201 and 503 expected)"
            ));
        }
    }
    statuses
}

/// What retrying every key found, against each key's first answer.
struct Retried {
    /// Keys answered 2xx that ran again (their completion was not stored).
    executed_again: u64,
    /// Of those, keys the gateway did not log as not stored.
    executed_again_unlogged: Vec<String>,
    /// Keys answered 503 whose retry was a replay: they had run.
    ran_despite_503: Vec<String>,
    /// Keys with no 2xx on retry, with their last status.
    unsettled: Vec<String>,
}

impl Retried {
    fn of(sent: &[Sent], settled: &[Answer], lost: &HashSet<String>) -> Self {
        let mut retried = Retried {
            executed_again: 0,
            executed_again_unlogged: Vec::new(),
            ran_despite_503: Vec::new(),
            unsettled: Vec::new(),
        };
        for (s, answer) in sent.iter().zip(settled) {
            let first_ok = (200..300).contains(&s.status);
            if !answer.success() {
                retried
                    .unsettled
                    .push(format!("{} ({})", s.key, answer.status));
            } else if first_ok && !answer.replayed {
                retried.executed_again += 1;
                if !lost.contains(&s.key) {
                    retried.executed_again_unlogged.push(s.key.clone());
                }
            } else if s.status == 503 && answer.replayed {
                retried.ran_despite_503.push(s.key.clone());
            }
        }
        retried
    }

    /// The problems among them: keys unsettled (after `patience`), run again unlogged, or run
    /// despite their 503.
    fn check(&self, patience: Duration, problems: &mut Vec<String>) {
        if !self.unsettled.is_empty() {
            problems.push(format!(
                "{} keys had no 2xx after retrying for {} s, e.g. {:?}",
                self.unsettled.len(),
                patience.as_secs(),
                &self.unsettled[..self.unsettled.len().min(5)]
            ));
        }
        if !self.executed_again_unlogged.is_empty() {
            problems.push(format!(
                "{} keys answered 2xx ran again on retry without a failed completion, e.g. {:?}",
                self.executed_again_unlogged.len(),
                &self.executed_again_unlogged[..self.executed_again_unlogged.len().min(5)]
            ));
        }
        if !self.ran_despite_503.is_empty() {
            problems.push(format!(
                "{} keys answered 503 had run (their retry was a replay), e.g. {:?}",
                self.ran_despite_503.len(),
                &self.ran_despite_503[..self.ran_despite_503.len().min(5)]
            ));
        }
    }
}

/// Retries every key once more: each is a replay, and the upstream (`fixture`, at
/// `executions`) runs no more.
async fn check_replays(
    http: &Http,
    keys: Arc<Vec<String>>,
    connections: usize,
    deadline: Instant,
    fixture: &Http,
    executions: u64,
    problems: &mut Vec<String>,
) -> Result<(), Failure> {
    let again = settle_all(http, keys, connections, deadline).await;
    let not_replayed = again
        .iter()
        .filter(|a| !(a.success() && a.replayed))
        .count();
    let executions_after = fixture.counter().await.map_err(Failure::Usage)?;
    if not_replayed > 0 {
        problems.push(format!(
            "{not_replayed} keys were not replayed on the second retry"
        ));
    }
    if executions_after != executions {
        problems.push(format!(
            "the second retry ran the upstream {} more times",
            executions_after.saturating_sub(executions)
        ));
    }
    Ok(())
}

fn report(store: &str, problems: &[String]) -> Result<(), Failure> {
    if problems.is_empty() {
        return Ok(());
    }
    for problem in problems {
        println!("{store}: FAILED: {problem}");
    }
    Err(Failure::Check(format!(
        "{store}: {} checks failed",
        problems.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_from_gateway_warnings() {
        let dir = std::env::temp_dir().join(format!("idem-load-{}", std::process::id()));
        let line = format!(
            "2026-01-01T00:00:00Z  WARN idem_http::service: {NOT_STORED}: a retry after the lease may run the handler again idempotency_key=idem::f1-0-7 fence=3 error=down\nother line\n"
        );
        std::fs::write(&dir, line).unwrap();
        let keys = not_stored(dir.to_str().unwrap()).ok().unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(
            keys.into_iter().collect::<Vec<_>>(),
            vec!["f1-0-7".to_owned()]
        );
    }
}
