//! The model-based property test: random interleavings of claim, heartbeat, complete, fail,
//! release, settle-unknown, the two resolutions of an unknown record and clock advances from 2
//! to 4 workers over two keys, run against a store and against the pure state machine of
//! `idem_core::machine`, answer by answer.
//!
//! Checked after every step: the store's answer equals the model's (outcome kind, takeover,
//! stored result, failure or unknown outcome, rejection kind, `retry_after` within a second),
//! and no two workers ever hold a live lease on one key at the same time.

use std::collections::HashMap;
use std::future::Future;
use std::mem::discriminant;
use std::time::Duration;

use idem_core::machine::{self, LeasePolicy, Step, Write};
use idem_core::{
    Bytes, ClaimOutcome, ClaimRequest, Failure, Fence, Fingerprint, IdempotencyKey, Lease,
    OwnerToken, Record, RecordKey, Store, StoreError, Timestamp, TransitionRejection,
    UnknownOutcome,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::Harness;

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(600);
const KEYS: usize = 2;

/// One step of a worker, or of the clock.
#[derive(Clone, Debug)]
pub enum Op {
    /// Worker claims key with payload 0 or 1.
    Claim(usize, usize, u8),
    /// Worker extends its lease on key.
    Heartbeat(usize, usize),
    /// Worker completes key.
    Complete(usize, usize),
    /// Worker fails key (retryable or not).
    Fail(usize, usize, bool),
    /// Worker releases key.
    Release(usize, usize),
    /// Worker settles key as unknown, held for this many seconds (`None`: until resolved).
    SettleUnknown(usize, usize, Option<u64>),
    /// An operator resolves key as completed (`true`) or released, at the fence it reads now
    /// (`true`) or at the fence it read at its last resolution of the key.
    Resolve(usize, bool, bool),
    /// The clock moves forward by this many seconds.
    Advance(u64),
}

/// A program: the number of workers and the interleaving of their steps.
fn program() -> impl Strategy<Value = (usize, Vec<Op>)> {
    (2..=4usize).prop_flat_map(|workers| {
        let w = 0..workers;
        let k = 0..KEYS;
        let op = prop_oneof![
            4 => (w.clone(), k.clone(), prop_oneof![9 => Just(0u8), 1 => Just(1u8)])
                .prop_map(|(w, k, p)| Op::Claim(w, k, p)),
            2 => (w.clone(), k.clone()).prop_map(|(w, k)| Op::Heartbeat(w, k)),
            3 => (w.clone(), k.clone()).prop_map(|(w, k)| Op::Complete(w, k)),
            2 => (w.clone(), k.clone(), any::<bool>()).prop_map(|(w, k, r)| Op::Fail(w, k, r)),
            2 => (w.clone(), k.clone()).prop_map(|(w, k)| Op::Release(w, k)),
            2 => (w, k.clone(), prop_oneof![Just(None), Just(Some(30u64)), Just(Some(61))])
                .prop_map(|(w, k, hold)| Op::SettleUnknown(w, k, hold)),
            2 => (k, any::<bool>(), prop_oneof![3 => Just(true), 1 => Just(false)])
                .prop_map(|(k, completed, fresh)| Op::Resolve(k, completed, fresh)),
            2 => prop_oneof![Just(1u64), Just(10), Just(29), Just(30), Just(31), Just(61), Just(601)]
                .prop_map(Op::Advance),
        ];
        (Just(workers), proptest::collection::vec(op, 1..60))
    })
}

/// Runs `cases` random programs, each against a fresh harness from `make`.
///
/// # Panics
/// When the store's answers differ from the model's, with the shrunk program.
pub fn check<F, Fut, H>(make: F, cases: u32)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<H>>,
    H: Harness,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if runtime.block_on(make()).is_none() {
        return; // the probe skipped loudly (IDEM_TEST_SKIP_MISSING=1)
    }
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let outcome = runner.run(&program(), |(_workers, ops)| {
        runtime.block_on(async {
            let harness = make()
                .await
                .ok_or_else(|| TestCaseError::fail("no harness"))?;
            run_program(&harness, &ops).await
        })
    });
    if let Err(err) = outcome {
        panic!("the store disagrees with the state machine: {err}");
    }
}

/// The pure model: records by key, and the model's own clock.
struct Model {
    records: HashMap<usize, Record>,
    now: Timestamp,
    last_fence: Fence,
}

impl Model {
    fn apply<T>(&mut self, k: usize, step: Step<T>) -> T {
        match step.write {
            Write::Nothing => {}
            Write::Put(record) => {
                self.last_fence = self.last_fence.max(record.fence);
                self.records.insert(k, record);
            }
            Write::Remove => {
                self.records.remove(&k);
            }
        }
        step.answer
    }
}

/// A worker's view of one key: its lease in the store and in the model.
type Held = HashMap<(usize, usize), (Lease, Lease)>;

/// A program's run beside the store: the keys, the model, the leases each worker holds (in
/// the store and in the model), and the last fence the store granted on each key.
struct Run {
    keys: Vec<RecordKey>,
    model: Model,
    held: Held,
    store_fences: HashMap<usize, Fence>,
    /// The fences a resolver last read of each key: in the store, in the model.
    seen: HashMap<usize, (Fence, Fence)>,
}

impl Run {
    fn new() -> Self {
        Run {
            keys: (0..KEYS)
                .map(|k| {
                    RecordKey::unscoped(IdempotencyKey::new(format!("model-{k}")).expect("key"))
                })
                .collect(),
            model: Model {
                records: HashMap::new(),
                now: Timestamp::from_micros(1_700_000_000_000_000),
                last_fence: Fence::new(0),
            },
            held: HashMap::new(),
            store_fences: HashMap::new(),
            seen: HashMap::new(),
        }
    }

    /// An operator resolves key `k` of the store and of the model (see [`Op::Resolve`]); the
    /// two answer alike.
    /// A heartbeat of worker `w`'s lease on key `k`, if it holds one, against the model's.
    async fn heartbeat(
        &mut self,
        store: &dyn Store,
        w: usize,
        k: usize,
        at: &str,
    ) -> Result<(), TestCaseError> {
        let Some((s, m)) = self.held.get(&(w, k)).cloned() else {
            return Ok(());
        };
        let got = store.heartbeat(&s, LEASE).await;
        let want = machine::heartbeat(
            self.model.records.get(&k),
            &m,
            LEASE,
            self.model.now,
            LeasePolicy::Lenient,
        )
        .map(|step| self.model.apply(k, step));
        compare_results(&got, &want, at)?;
        if let (Ok(s), Ok(m)) = (got, want) {
            self.held.insert((w, k), (s, m));
        }
        Ok(())
    }

    /// Worker `w` settles its lease on key `k` as unknown, if it holds one, as the model does.
    async fn settle_unknown(
        &mut self,
        store: &dyn Store,
        w: usize,
        k: usize,
        hold: Option<u64>,
        at: &str,
    ) -> Result<(), TestCaseError> {
        let Some((s, m)) = self.held.get(&(w, k)).cloned() else {
            return Ok(());
        };
        let outcome = UnknownOutcome::new(format!("worker {w} lost the answer"));
        let hold = hold.map(Duration::from_secs);
        let got = store
            .settle_unknown(&s, outcome.clone(), hold, RETENTION)
            .await;
        let want = machine::settle_unknown(
            self.model.records.get(&k),
            &m,
            outcome,
            hold,
            RETENTION,
            self.model.now,
            LeasePolicy::Lenient,
        )
        .map(|step| self.model.apply(k, step));
        compare_results(&got, &want, at)?;
        self.held.remove(&(w, k));
        Ok(())
    }

    async fn resolve(
        &mut self,
        store: &dyn Store,
        k: usize,
        completed: bool,
        fresh: bool,
        at: &str,
    ) -> Result<(), TestCaseError> {
        if fresh {
            let stored = store
                .get(&self.keys[k])
                .await
                .map_err(|e| TestCaseError::fail(format!("{at}: get: {e}")))?;
            let modelled = self
                .model
                .records
                .get(&k)
                .filter(|r| !r.is_expired(self.model.now));
            let fence = |r: Option<&Record>| r.map_or(Fence::MIN, |r| r.fence);
            self.seen
                .insert(k, (fence(stored.as_ref()), fence(modelled)));
        }
        let Some(&(s, m)) = self.seen.get(&k) else {
            return Ok(());
        };
        let existing = self.model.records.get(&k);
        let (got, want) = if completed {
            let result = Bytes::from_static(b"resolved");
            let got = store
                .resolve_completed(&self.keys[k], s, result.clone(), RETENTION)
                .await;
            let want = machine::resolve_completed(existing, m, result, RETENTION, self.model.now);
            (got, want)
        } else {
            let got = store.resolve_released(&self.keys[k], s).await;
            (got, machine::resolve_released(existing, m, self.model.now))
        };
        let want = want.map(|step| self.model.apply(k, step));
        compare_results(&got, &want, at)
    }

    /// Worker `w` claims key `k` of the store and of the model: the two answer alike, a
    /// granted fence is above the key's last, and no other worker holds a live lease on it.
    async fn claim(
        &mut self,
        store: &dyn Store,
        w: usize,
        k: usize,
        payload: u8,
        at: &str,
    ) -> Result<(), TestCaseError> {
        let request =
            ClaimRequest::new(self.keys[k].clone(), Fingerprint::of(&[&[payload]]), LEASE);
        let got = store.claim(&request).await;
        let step = machine::claim(
            self.model.records.get(&k),
            &request,
            self.model.now,
            self.model.last_fence.successor(),
            OwnerToken::random(),
        )
        .map_err(|e| TestCaseError::fail(format!("model error {e}")))?;
        let want = self.model.apply(k, step);
        compare_claims(&got, &want, at)?;
        if let (
            Ok(ClaimOutcome::Acquired { lease: s, .. }),
            ClaimOutcome::Acquired { lease: m, .. },
        ) = (&got, &want)
        {
            if let Some(last) = self.store_fences.insert(k, s.fence) {
                prop_assert!(s.fence > last, "{at}: fence {} after {last}", s.fence);
            }
            for (&(other, key), (_, lease)) in &self.held {
                prop_assert!(
                    key != k || other == w || lease.until <= self.model.now,
                    "{at}: worker {w} was granted key {k} while worker {other} holds a live lease"
                );
            }
            self.held.insert((w, k), (s.clone(), m.clone()));
        }
        Ok(())
    }

    /// The stored state of every key agrees with the model's.
    async fn check_stored(&self, store: &dyn Store, at: &str) -> Result<(), TestCaseError> {
        for (k, key) in self.keys.iter().enumerate() {
            let stored = store
                .get(key)
                .await
                .map_err(|e| TestCaseError::fail(format!("{at}: get: {e}")))?;
            let modelled = self
                .model
                .records
                .get(&k)
                .filter(|r| !r.is_expired(self.model.now));
            prop_assert_eq!(
                stored.as_ref().map(|r| (
                    r.state,
                    r.fingerprint,
                    r.attempt,
                    r.result.clone(),
                    r.failure.clone(),
                    r.unknown.clone(),
                    r.hold_until.is_some()
                )),
                modelled.map(|r| (
                    r.state,
                    r.fingerprint,
                    r.attempt,
                    r.result.clone(),
                    r.failure.clone(),
                    r.unknown.clone(),
                    r.hold_until.is_some()
                )),
                "{}: stored record of key {} differs from the model",
                at,
                k
            );
        }
        Ok(())
    }
}

async fn run_program(h: &impl Harness, ops: &[Op]) -> Result<(), TestCaseError> {
    let store = h.store();
    let mut run = Run::new();
    for (index, op) in ops.iter().enumerate() {
        let at = format!("step {index} ({op:?})");
        match *op {
            Op::Advance(secs) => {
                h.advance(Duration::from_secs(secs)).await;
                run.model.now = run.model.now.saturating_add(Duration::from_secs(secs));
            }
            Op::Claim(w, k, payload) => run.claim(store.as_ref(), w, k, payload, &at).await?,
            Op::Heartbeat(w, k) => run.heartbeat(store.as_ref(), w, k, &at).await?,
            Op::Complete(w, k) => {
                let Some((s, m)) = run.held.get(&(w, k)).cloned() else {
                    continue;
                };
                let result = Bytes::from(format!("worker {w}"));
                let got = store.complete(&s, result.clone(), RETENTION).await;
                let want = machine::complete(
                    run.model.records.get(&k),
                    &m,
                    result,
                    RETENTION,
                    run.model.now,
                    LeasePolicy::Lenient,
                )
                .map(|step| run.model.apply(k, step));
                compare_results(&got, &want, &at)?;
                run.held.remove(&(w, k));
            }
            Op::Fail(w, k, retryable) => {
                let Some((s, m)) = run.held.get(&(w, k)).cloned() else {
                    continue;
                };
                let failure = if retryable {
                    Failure::retryable("transient")
                } else {
                    Failure::permanent("permanent")
                };
                let got = store.fail(&s, failure.clone(), RETENTION).await;
                let want = machine::fail(
                    run.model.records.get(&k),
                    &m,
                    failure,
                    RETENTION,
                    run.model.now,
                    LeasePolicy::Lenient,
                )
                .map(|step| run.model.apply(k, step));
                compare_results(&got, &want, &at)?;
                run.held.remove(&(w, k));
            }
            Op::Release(w, k) => {
                let Some((s, m)) = run.held.get(&(w, k)).cloned() else {
                    continue;
                };
                let got = store.release(&s).await;
                let want = machine::release(run.model.records.get(&k), &m, run.model.now)
                    .map(|step| run.model.apply(k, step));
                compare_results(&got, &want, &at)?;
                run.held.remove(&(w, k));
            }
            Op::SettleUnknown(w, k, hold) => {
                run.settle_unknown(store.as_ref(), w, k, hold, &at).await?
            }
            Op::Resolve(k, completed, fresh) => {
                run.resolve(store.as_ref(), k, completed, fresh, &at)
                    .await?;
            }
        }
        // The stored state agrees with the model's after every step.
        run.check_stored(store.as_ref(), &at).await?;
    }
    Ok(())
}

fn compare_claims(
    got: &Result<ClaimOutcome, StoreError>,
    want: &ClaimOutcome,
    at: &str,
) -> Result<(), TestCaseError> {
    let got = got
        .as_ref()
        .map_err(|e| TestCaseError::fail(format!("{at}: store error {e}")))?;
    match (got, want) {
        (
            ClaimOutcome::Acquired {
                lease: s,
                taken_over: st,
            },
            ClaimOutcome::Acquired {
                lease: m,
                taken_over: mt,
            },
        ) => {
            prop_assert_eq!(st, mt, "{}: takeover", at);
            prop_assert_eq!(s.attempt, m.attempt, "{}: attempt", at);
        }
        (ClaimOutcome::InFlight { retry_after: s }, ClaimOutcome::InFlight { retry_after: m }) => {
            let diff = s.abs_diff(*m);
            prop_assert!(
                diff <= Duration::from_secs(1),
                "{at}: retry_after {s:?} vs {m:?}"
            );
        }
        (ClaimOutcome::Completed(s), ClaimOutcome::Completed(m)) => {
            prop_assert_eq!(&s.result, &m.result, "{}: replayed result", at);
        }
        (ClaimOutcome::Failed(s), ClaimOutcome::Failed(m)) => {
            prop_assert_eq!(&s.failure, &m.failure, "{}: failure", at);
        }
        (ClaimOutcome::Unknown(s), ClaimOutcome::Unknown(m)) => {
            prop_assert_eq!(&s.unknown, &m.unknown, "{}: unknown outcome", at);
            prop_assert_eq!(s.attempt, m.attempt, "{}: attempt", at);
        }
        (ClaimOutcome::Mismatch, ClaimOutcome::Mismatch) => {}
        (s, m) => prop_assert!(false, "{at}: store answered {s:?}, the model {m:?}"),
    }
    Ok(())
}

fn compare_results<T: std::fmt::Debug, U: std::fmt::Debug>(
    got: &Result<T, StoreError>,
    want: &Result<U, StoreError>,
    at: &str,
) -> Result<(), TestCaseError> {
    match (got, want) {
        (Ok(_), Ok(_)) => Ok(()),
        (Err(StoreError::Rejected(s)), Err(StoreError::Rejected(m))) => {
            prop_assert!(
                same_rejection(*s, *m),
                "{at}: store refused with {s:?}, the model {m:?}"
            );
            Ok(())
        }
        (s, m) => Err(TestCaseError::fail(format!(
            "{at}: store answered {s:?}, the model {m:?}"
        ))),
    }
}

fn same_rejection(a: TransitionRejection, b: TransitionRejection) -> bool {
    match (a, b) {
        (
            TransitionRejection::AlreadySettled { state: x },
            TransitionRejection::AlreadySettled { state: y },
        )
        | (
            TransitionRejection::NotUnknown { state: x },
            TransitionRejection::NotUnknown { state: y },
        ) => x == y,
        _ => discriminant(&a) == discriminant(&b),
    }
}
