//! [`Primitives`]: the atomic operations a remote store offers, and nothing that decides.
//!
//! A remote store (Redis, PostgreSQL) implements these few operations, each ONE round trip,
//! and [`crate::Driven`] implements every [`crate::Store`] transition on top of them by calling
//! [`crate::machine`]: the rules of expiry, fences and TTLs live in Rust once. A store's script
//! or SQL may compare a version and write what it is given; it never chooses a state.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::StoreError;
use crate::key::RecordKey;
use crate::machine::LeasePolicy;
use crate::record::Record;
use crate::store::{ScanPage, ScanQuery};
use crate::time::Timestamp;
use crate::token::Fence;

/// The version of what a key holds, opaque to idem-core: what the store compares in a
/// compare-and-set (Redis: the whole stored value; a SQL store: a version number). Two reads of
/// the same version read the same slot.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Version(Bytes);

impl Version {
    /// A version from the store's bytes.
    #[must_use]
    pub fn new(bytes: impl Into<Bytes>) -> Self {
        Version(bytes.into())
    }

    /// The store's bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &Bytes {
        &self.0
    }
}

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Version({} bytes)", self.0.len())
    }
}

/// What a key holds, as the primitives read it.
#[derive(Clone, Debug, PartialEq, Eq)]
// A slot lives for one step; boxing the record would cost an allocation per read.
#[allow(clippy::large_enum_variant)]
pub enum Slot {
    /// A record, maybe expired (the machine judges that on the store's clock).
    Record(Record),
    /// No record, but the last fence the key granted, kept for the fence memory so that the
    /// next grant's fence is higher even when the clock has not moved or stepped back.
    Tombstone(Fence),
}

impl Slot {
    /// The record, if the slot holds one.
    #[must_use]
    pub fn record(&self) -> Option<&Record> {
        match self {
            Slot::Record(record) => Some(record),
            Slot::Tombstone(_) => None,
        }
    }

    /// The lowest fence a new grant of this key may have: past a tombstone's fence
    /// ([`Fence::MIN`] for a record, whose fence the machine reads itself).
    #[must_use]
    pub fn min_fence(&self) -> Fence {
        match self {
            Slot::Record(_) => Fence::MIN,
            Slot::Tombstone(fence) => fence.successor(),
        }
    }
}

/// A slot and its version, as one read returns them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    /// What the key holds.
    pub slot: Slot,
    /// Its version, for a compare-and-set.
    pub version: Version,
}

/// The answer of [`Primitives::create`].
#[derive(Clone, Debug, PartialEq, Eq)]
// Answers live for one step; boxing the record would cost an allocation per answer.
#[allow(clippy::large_enum_variant)]
pub enum Created {
    /// The key was absent: the record is stored, at this version.
    Created(Version),
    /// The key holds this (nothing was written).
    Present(Versioned),
}

/// The answer of [`Primitives::swap`].
#[derive(Clone, Debug, PartialEq, Eq)]
// Answers live for one step; boxing the record would cost an allocation per answer.
#[allow(clippy::large_enum_variant)]
pub enum Swapped {
    /// The key still held the expected version: the slot is written, at this version.
    Swapped(Version),
    /// The key held something else (nothing was written): what won, or `None` if the key is
    /// absent.
    Lost(Option<Versioned>),
}

/// The atomic operations of a remote store: each is ONE round trip and decides nothing.
///
/// Object safe. A store implements it and wraps itself in [`crate::Driven`] to be a
/// [`crate::Store`].
#[async_trait]
pub trait Primitives: Send + Sync + fmt::Debug {
    /// What `key` holds, with its version; `None` if absent.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] if it cannot be decoded; the store's failures.
    async fn read(&self, key: &RecordKey) -> Result<Option<Versioned>, StoreError>;

    /// Stores `record` under its key if the key is absent (with the physical TTL `ttl`), or
    /// else hands back what the key holds: in the same round trip.
    ///
    /// # Errors
    /// As [`Primitives::read`].
    async fn create(&self, record: &Record, ttl: Duration) -> Result<Created, StoreError>;

    /// Replaces what `key` holds with `slot` (with the physical TTL `ttl`) if it is still at
    /// `expected`; else hands back what it holds. Safe to send twice.
    ///
    /// # Errors
    /// As [`Primitives::read`].
    async fn swap(
        &self,
        key: &RecordKey,
        expected: &Version,
        slot: &Slot,
        ttl: Duration,
    ) -> Result<Swapped, StoreError>;

    /// Removes whatever `key` holds, unconditionally (for a record that cannot be read);
    /// `true` if there was something.
    async fn remove(&self, key: &RecordKey) -> Result<bool, StoreError>;

    /// A page of records (see [`crate::Store::scan`]), judged at `now`.
    async fn scan(&self, query: &ScanQuery, now: Timestamp) -> Result<ScanPage, StoreError>;

    /// Checks that the store answers.
    async fn ping(&self) -> Result<(), StoreError>;

    /// The store's clock, or an estimate of it that is off by at most
    /// [`Primitives::clock_bound`]. Every holder of a key decides on this one clock.
    fn now(&self) -> Timestamp;

    /// How far [`Primitives::now`] may be from the store's clock. A lease counts as lapsed for
    /// a takeover only when it has lapsed by more than this.
    fn clock_bound(&self) -> Duration {
        Duration::ZERO
    }

    /// Whether a lapsed holder not taken over may still settle.
    fn lease_policy(&self) -> LeasePolicy {
        LeasePolicy::Lenient
    }

    /// How long a key remembers its last fence after its record is gone or has expired.
    fn fence_memory(&self) -> Duration;
}

/// What the store last wrote for a lease: the record and its version, so that the holder's next
/// transition is one compare-and-set without a read first. A cache: it never counts in the
/// lease's equality or hash, and a lease without it (built by hand, or from a store that does
/// not fill it) reads the record first.
///
/// Every copy of one lease shares the cache: when a heartbeat sent with one copy (a lease
/// keeper's) writes, the completion sent with another copy (the one the claim answered) starts
/// from that write, not from the claim's, and still takes one compare-and-set.
#[derive(Clone, Default)]
pub struct Held(Option<Arc<Mutex<Written>>>);

/// The record last written for a lease, with its version.
type Written = Arc<(Record, Version)>;

impl Held {
    /// The record written for the lease, at `version`.
    #[must_use]
    pub fn new(record: Record, version: Version) -> Self {
        Held(Some(Arc::new(Mutex::new(Arc::new((record, version))))))
    }

    /// Nothing known: the next transition reads first.
    #[must_use]
    pub fn unknown() -> Self {
        Held(None)
    }

    /// The record and its version, if known.
    #[must_use]
    pub fn get(&self) -> Option<Written> {
        self.0
            .as_ref()
            .map(|cell| Arc::clone(&cell.lock().unwrap_or_else(PoisonError::into_inner)))
    }

    /// A later write for the lease: every copy that shares this cache now starts from it. A
    /// lease without a cache gets a cache of its own in the answer (see [`Held::new`]) instead.
    /// Returns the cache to answer with.
    #[must_use]
    pub fn written(&self, record: Record, version: Version) -> Held {
        match &self.0 {
            Some(cell) => {
                *cell.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new((record, version));
                self.clone()
            }
            None => Held::new(record, version),
        }
    }
}

impl PartialEq for Held {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Held {}

impl Hash for Held {
    fn hash<H: Hasher>(&self, _: &mut H) {}
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.get() {
            Some(held) => write!(f, "Held({:?})", held.1),
            None => f.write_str("Held(unknown)"),
        }
    }
}
