//! Hash a record key once per operation: the same keyed hash picks the shard and places the
//! record in the shard's map.

use std::hash::{BuildHasherDefault, Hash, Hasher};

use idem_core::RecordKey;

/// A record key with its keyed hash (SipHash with the store's random keys), computed once.
#[derive(Clone, Debug)]
pub(crate) struct HashedKey {
    pub(crate) hash: u64,
    pub(crate) key: RecordKey,
}

impl HashedKey {
    /// The shard of this key among `shards`. Uses the high half of the hash; the shard's map
    /// uses the low bits and the top seven, so keys of one shard still spread over its map.
    pub(crate) fn shard_index(&self, shards: usize) -> usize {
        usize::try_from(self.hash >> 32).unwrap_or_default() % shards
    }
}

impl PartialEq for HashedKey {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.key == other.key
    }
}

impl Eq for HashedKey {}

impl Hash for HashedKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// The hasher of a shard's map: passes the precomputed hash through.
#[derive(Debug, Default)]
pub(crate) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is ever called (by `HashedKey`); fold anything else in anyway.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The build hasher of a shard's map.
pub(crate) type PassThroughState = BuildHasherDefault<PassThrough>;
