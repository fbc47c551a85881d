//! `idem-load rate`: requests per second and tail latency of a keep-alive client of our own,
//! the second client beside wrk in `bench/http.sh` and `bench/gateway.sh`. It is hyper's pooled
//! client with `TCP_NODELAY`, one task per connection, each sending its next request when the
//! last answer's body has been read, as wrk does; where the two clients' figures part, the
//! server's behaviour under one of them (a write held by Nagle, say) is the first suspect.

use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::task::JoinSet;

use crate::args::{Args, Failure, unix_ms};
use crate::client::Http;

/// The body of every request (bench/http/*.lua send the same).
const BODY: &[u8] = br#"{"amount":1250,"currency":"eur"}"#;

/// `idem-load rate --addr HOST:PORT [--mode unique|replay] [--connections 64]
/// [--duration 10s] [--warmup 2s] [--path /echo]`: prints `<requests/s> <p99 ms> <non-2xx>`.
pub(crate) async fn rate(args: &Args) -> Result<(), Failure> {
    let addr = args.need("addr")?;
    let replay = match args.get("mode", "unique".to_owned())?.as_str() {
        "unique" => false,
        "replay" => true,
        other => {
            return Err(Failure::Usage(format!(
                "--mode: unique or replay, not {other:?}"
            )));
        }
    };
    let connections = args.get("connections", 64usize)?.max(1);
    let duration = args.duration("duration", Duration::from_secs(10))?;
    let warmup = args.duration("warmup", Duration::from_secs(2))?;
    let path = args.get("path", "/echo".to_owned())?;
    let http = Http::new(addr, connections);
    let prefix = format!("r{}", unix_ms());
    let load = Load {
        http,
        path,
        prefix,
        replay,
        connections,
    };
    load.run("warm", warmup).await?;
    let started = Instant::now();
    let mut latencies = load.run("run", duration).await?;
    let elapsed = started.elapsed().as_secs_f64();
    let failed = latencies.iter().filter(|(_, ok)| !ok).count();
    let requests = latencies.len();
    latencies.sort_unstable_by_key(|(latency, _)| *latency);
    let p99 = latencies
        .get((requests * 99 / 100).min(requests.saturating_sub(1)))
        .map_or(0.0, |(latency, _)| latency.as_secs_f64() * 1000.0);
    #[allow(clippy::cast_precision_loss)]
    let per_second = requests as f64 / elapsed;
    println!("{per_second:.2} {p99:.2} {failed}");
    Ok(())
}

/// One load: its client, and what each connection sends.
struct Load {
    http: Http,
    path: String,
    prefix: String,
    replay: bool,
    connections: usize,
}

impl Load {
    /// Sends from every connection for `duration`; each request's latency and whether it was
    /// answered with a 2xx.
    async fn run(&self, phase: &str, duration: Duration) -> Result<Vec<(Duration, bool)>, Failure> {
        let end = Instant::now() + duration;
        let mut workers = JoinSet::new();
        for worker in 0..self.connections {
            let http = self.http.clone();
            let path = self.path.clone();
            let prefix = format!("{}-{phase}-{worker}", self.prefix);
            let replay_key = format!("{}-replay", self.prefix);
            let replay = self.replay;
            workers.spawn(async move {
                let mut latencies = Vec::new();
                let mut n = 0u64;
                while Instant::now() < end {
                    let key = if replay {
                        replay_key.clone()
                    } else {
                        n += 1;
                        format!("{prefix}-{n}")
                    };
                    let sent = Instant::now();
                    let answer = http.post(&path, &key, Bytes::from_static(BODY)).await;
                    latencies.push((sent.elapsed(), answer.success()));
                }
                latencies
            });
        }
        let mut all = Vec::new();
        while let Some(joined) = workers.join_next().await {
            all.extend(joined.map_err(|e| Failure::Usage(e.to_string()))?);
        }
        Ok(all)
    }
}
