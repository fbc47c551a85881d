//! The soak run: mixed load through the gateway for a long time, with the gateway's resident
//! memory sampled from /proc.
//!
//! Kinds of request (each mixed worker draws one per request; conflict workers do only
//! conflicts):
//!
//! | kind | request | expected |
//! |---|---|---|
//! | new | POST /echo, a new key, a 32-byte body | 201 |
//! | large | POST /echo, a new key, `--large-bytes` of incompressible body | 201 |
//! | replay | a recently completed key (new or large) again, same body | 201 replayed |
//! | mismatch | a recently completed key, another body | 422 |
//! | conflict-original | POST /slow?ms=1000, a new key | 200 |
//! | conflict-duplicate | the same request 200 ms later, while the original runs | 409 |
//! | conflict-mismatch | the same key with another body, while the original runs | 422 |
//!
//! A conflict duplicate that arrives after the original completed gets the replay (200
//! replayed); it is counted apart ("late") and allowed. Anything else fails the run, and so
//! does a fixture counter that differs from the number of executed (not replayed) 2xx answers.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::Rng;
use tokio::task::JoinSet;

use crate::args::{Args, Failure, unix_ms};
use crate::client::{Answer, Http};

/// The small body of new keys.
const SMALL: &[u8] = br#"{"amount":1250,"currency":"eur"}"#;
/// How many recently completed keys replays and mismatches draw from: far below any capacity
/// the script sets, so a replayed key was not evicted.
const RECENT: usize = 1000;

/// Counts of (kind, outcome).
type Counts = BTreeMap<(&'static str, String), u64>;

/// What the workers share.
struct Shared {
    http: Http,
    prefix: String,
    recent: Mutex<VecDeque<(String, Bytes)>>,
    counts: Mutex<Counts>,
}

impl Shared {
    fn count(&self, kind: &'static str, answer: Answer) {
        let outcome = outcome(answer);
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        *counts.entry((kind, outcome)).or_default() += 1;
    }

    fn remember(&self, key: String, body: Bytes) {
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if recent.len() == RECENT {
            recent.pop_front();
        }
        recent.push_back((key, body));
    }

    fn pick_recent(&self, index: usize) -> Option<(String, Bytes)> {
        let recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if recent.is_empty() {
            return None;
        }
        recent.get(index % recent.len()).cloned()
    }
}

fn outcome(answer: Answer) -> String {
    match (answer.status, answer.replayed) {
        (0, _) => "no answer".into(),
        (status, true) => format!("{status} replayed"),
        (status, false) => status.to_string(),
    }
}

/// Whether `outcome` is what `kind` expects; `Some(true)` for an allowed late replay.
fn expected(kind: &str, outcome: &str) -> Option<bool> {
    match (kind, outcome) {
        ("new" | "large", "201")
        | ("replay", "201 replayed")
        | ("mismatch" | "conflict-mismatch", "422")
        | ("conflict-original", "200")
        | ("conflict-duplicate", "409") => Some(false),
        ("conflict-duplicate", "200 replayed") => Some(true),
        _ => None,
    }
}

/// Bytes that lz4 cannot shrink, so a large record costs its size in the store.
fn noise(len: usize) -> Bytes {
    let mut rng = rand::rng();
    let mut body = vec![0u8; len];
    rng.fill(&mut body[..]);
    Bytes::from(body)
}

async fn mixed_worker(shared: Arc<Shared>, worker: usize, end: Instant, large: usize) {
    let mut n = 0u64;
    while Instant::now() < end {
        n += 1;
        let key = format!("{}-m{worker}-{n}", shared.prefix);
        let draw = rand::rng().random_range(0..100u32);
        let pick = rand::rng().random_range(0..RECENT);
        match draw {
            0..50 => {
                let body = Bytes::from_static(SMALL);
                let answer = shared.http.post("/echo", &key, body.clone()).await;
                shared.count("new", answer);
                if answer.status == 201 {
                    shared.remember(key, body);
                }
            }
            50..60 => {
                let body = noise(large);
                let answer = shared.http.post("/echo", &key, body.clone()).await;
                shared.count("large", answer);
                if answer.status == 201 {
                    shared.remember(key, body);
                }
            }
            60..85 => {
                if let Some((key, body)) = shared.pick_recent(pick) {
                    let answer = shared.http.post("/echo", &key, body).await;
                    shared.count("replay", answer);
                }
            }
            _ => {
                if let Some((key, _)) = shared.pick_recent(pick) {
                    let body = Bytes::from(format!(r#"{{"amount":{n},"currency":"usd"}}"#));
                    let answer = shared.http.post("/echo", &key, body).await;
                    shared.count("mismatch", answer);
                }
            }
        }
    }
}

async fn conflict_worker(shared: Arc<Shared>, worker: usize, end: Instant) {
    let mut n = 0u64;
    while Instant::now() < end {
        n += 1;
        let key = format!("{}-c{worker}-{n}", shared.prefix);
        let original = {
            let (shared, key) = (shared.clone(), key.clone());
            tokio::spawn(async move {
                let answer = shared
                    .http
                    .post("/slow?ms=1000", &key, Bytes::from_static(SMALL))
                    .await;
                shared.count("conflict-original", answer);
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let duplicate = shared
            .http
            .post("/slow?ms=1000", &key, Bytes::from_static(SMALL));
        let other = Bytes::from_static(br#"{"amount":1,"currency":"usd"}"#);
        let mismatch = shared.http.post("/slow?ms=1000", &key, other);
        let (duplicate, mismatch) = tokio::join!(duplicate, mismatch);
        shared.count("conflict-duplicate", duplicate);
        shared.count("conflict-mismatch", mismatch);
        let _ = original.await;
    }
}

/// The resident memory of `pid` in KiB (VmRSS).
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// `idem-load soak`.
pub(crate) async fn soak(args: &Args) -> Result<(), Failure> {
    let addr = args.need("addr")?;
    let fixture = Http::new(args.need("fixture")?, 1);
    let pid: u32 = args.get("pid", 0)?;
    let duration = args.duration("duration", Duration::from_secs(600))?;
    let connections = args.get("connections", 32usize)?.max(1);
    let conflict_workers = args.get("conflict-workers", 4usize)?;
    let sample = args.duration("sample", Duration::from_secs(5))?;
    let warmup_pct: u32 = args.get("warmup", 20)?;
    let large: usize = args.get("large-bytes", 65536)?;
    let max_growth: f64 = args.get("max-growth", 10.0)?;
    if rss_kib(pid).is_none() {
        return Err(Failure::Usage(format!(
            "--pid {pid}: no VmRSS in /proc/{pid}/status"
        )));
    }
    let executions_before = fixture.counter().await.map_err(Failure::Usage)?;
    let shared = Arc::new(Shared {
        http: Http::new(addr, connections + 2 * conflict_workers),
        prefix: format!("s{}", unix_ms()),
        recent: Mutex::new(VecDeque::with_capacity(RECENT)),
        counts: Mutex::new(BTreeMap::new()),
    });
    let started = Instant::now();
    let end = started + duration;
    let mut workers = JoinSet::new();
    for worker in 0..connections {
        workers.spawn(mixed_worker(shared.clone(), worker, end, large));
    }
    for worker in 0..conflict_workers {
        workers.spawn(conflict_worker(shared.clone(), worker, end));
    }

    // Resident memory every `sample`, until the workers are done.
    let samples = sample_rss(&mut workers, &shared, started, pid, sample).await?;
    let elapsed = started.elapsed();
    let executions = fixture.counter().await.map_err(Failure::Usage)? - executions_before;
    let counts = shared
        .counts
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let mut problems = Vec::new();

    // Statuses per kind.
    let total: u64 = counts.values().sum();
    println!(
        "{total} requests in {} s ({:.0}/s, {connections} mixed connections, {conflict_workers} conflict workers)",
        elapsed.as_secs(),
        total as f64 / elapsed.as_secs_f64()
    );
    println!();
    let (fresh, late) = print_kinds(&counts, &mut problems);
    let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
    for ((_, outcome), n) in &counts {
        let status = outcome.split(' ').next().unwrap_or_default().to_owned();
        *by_status.entry(status).or_default() += n;
    }
    let statuses: Vec<String> = by_status.iter().map(|(s, n)| format!("{s}: {n}")).collect();
    println!();
    println!("statuses: {}", statuses.join(", "));
    println!("late conflict duplicates (the original had completed: replayed): {late}");
    println!("upstream executions {executions}, executed (not replayed) 2xx answers {fresh}");
    if executions != fresh {
        problems.push(format!(
            "the upstream ran {executions} times for {fresh} executed answers"
        ));
    }

    // Resident memory after the warm-up.
    let warmup = duration.mul_f64(f64::from(warmup_pct) / 100.0);
    check_memory(&samples, warmup, sample, max_growth, &mut problems);
    if problems.is_empty() {
        println!("soak: pass");
        return Ok(());
    }
    for problem in &problems {
        println!("soak: FAILED: {problem}");
    }
    Err(Failure::Check(format!("{} checks failed", problems.len())))
}

/// Resident memory of the gateway (`pid`) every `sample` since `started` until the workers
/// are done, and once more at the end; an error if the gateway is gone.
async fn sample_rss(
    workers: &mut JoinSet<()>,
    shared: &Shared,
    started: Instant,
    pid: u32,
    sample: Duration,
) -> Result<Vec<(Duration, u64)>, Failure> {
    let mut samples: Vec<(Duration, u64)> = Vec::new();
    let mut ticker = tokio::time::interval(sample);
    loop {
        tokio::select! {
            joined = workers.join_next() => {
                if joined.is_none() {
                    break;
                }
            }
            _ = ticker.tick() => {
                let elapsed = started.elapsed();
                let Some(rss) = rss_kib(pid) else {
                    return Err(Failure::Check(format!("the gateway (pid {pid}) is gone")));
                };
                let total: u64 = shared.counts.lock().unwrap_or_else(PoisonError::into_inner).values().sum();
                eprintln!("  +{:>4} s  rss {} MiB  {total} requests", elapsed.as_secs(), mib(rss));
                samples.push((elapsed, rss));
            }
        }
    }
    if let Some(rss) = rss_kib(pid) {
        samples.push((started.elapsed(), rss));
    }
    Ok(samples)
}

/// Prints the answers of each kind of request, and counts the unexpected ones as problems:
/// the executed (not replayed) 2xx answers, and the late conflict duplicates (replayed).
fn print_kinds(counts: &Counts, problems: &mut Vec<String>) -> (u64, u64) {
    println!("| kind | requests | answers | unexpected |");
    println!("|---|---|---|---|");
    let kinds = [
        "new",
        "large",
        "replay",
        "mismatch",
        "conflict-original",
        "conflict-duplicate",
        "conflict-mismatch",
    ];
    let mut fresh = 0u64;
    let mut late = 0u64;
    for kind in kinds {
        let of_kind: Vec<(&String, u64)> = counts
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|((_, outcome), n)| (outcome, *n))
            .collect();
        let requests: u64 = of_kind.iter().map(|(_, n)| n).sum();
        let mut unexpected = 0u64;
        for (outcome, n) in &of_kind {
            match expected(kind, outcome) {
                None => unexpected += n,
                Some(true) => late += n,
                Some(false) => {}
            }
            if outcome.starts_with('2') && !outcome.ends_with("replayed") {
                fresh += n;
            }
        }
        let answers: Vec<String> = of_kind.iter().map(|(o, n)| format!("{o}: {n}")).collect();
        println!(
            "| {kind} | {requests} | {} | {unexpected} |",
            answers.join(", ")
        );
        if unexpected > 0 {
            problems.push(format!(
                "{unexpected} unexpected answers to {kind} requests"
            ));
        }
    }
    (fresh, late)
}

/// Prints the resident memory after the warm-up (`samples` taken every `sample`); a growth to
/// `max_growth` percent or more is a problem.
fn check_memory(
    samples: &[(Duration, u64)],
    warmup: Duration,
    sample: Duration,
    max_growth: f64,
    problems: &mut Vec<String>,
) {
    let after: Vec<u64> = samples
        .iter()
        .filter(|(t, _)| *t >= warmup)
        .map(|(_, rss)| *rss)
        .collect();
    match (after.first(), after.iter().max(), after.last()) {
        (Some(&first), Some(&max), Some(&last)) if first > 0 => {
            let growth = |to: u64| (to as f64 - first as f64) * 100.0 / first as f64;
            println!(
                "resident memory after the {} s warm-up ({} samples, every {} s): first {} MiB, max {} MiB, last {} MiB; \
                 growth to max {:.1}%, to last {:.1}% (limit {max_growth}%)",
                warmup.as_secs(),
                after.len(),
                sample.as_secs(),
                mib(first),
                mib(max),
                mib(last),
                growth(max),
                growth(last)
            );
            if growth(max) >= max_growth {
                problems.push(format!(
                    "resident memory grew {:.1}% after the warm-up",
                    growth(max)
                ));
            }
        }
        _ => problems.push("no memory sample after the warm-up".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_per_kind() {
        assert_eq!(expected("new", "201"), Some(false));
        assert_eq!(expected("new", "201 replayed"), None);
        assert_eq!(expected("replay", "201 replayed"), Some(false));
        assert_eq!(expected("replay", "201"), None);
        assert_eq!(expected("conflict-duplicate", "200 replayed"), Some(true));
        assert_eq!(expected("mismatch", "503"), None);
        assert_eq!(expected("large", "no answer"), None);
    }

    #[test]
    fn own_resident_memory() {
        assert!(rss_kib(std::process::id()).is_some_and(|kib| kib > 0));
    }
}
