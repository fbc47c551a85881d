//! Decoding a row into a [`Record`], defensively: anything unexpected is `Corrupt`.

use std::time::{SystemTime, UNIX_EPOCH};

use deadpool_postgres::tokio_postgres::Row;
use deadpool_postgres::tokio_postgres::types::FromSql;
use idem_core::{
    Bytes, Failure, Fence, Fingerprint, OwnerToken, Record, RecordKey, State, StoreError,
    Timestamp, UnknownOutcome,
};

/// The column of the store's clock, after the sixteen record columns.
pub(crate) const NOW: usize = 16;

fn get<'a, T: FromSql<'a>>(key: &RecordKey, row: &'a Row, index: usize) -> Result<T, StoreError> {
    row.try_get(index)
        .map_err(|e| StoreError::corrupt(key, format!("column {index}: {e}")))
}

/// A timestamp from a `timestamptz` value.
pub(crate) fn timestamp(key: &RecordKey, time: SystemTime) -> Result<Timestamp, StoreError> {
    time.duration_since(UNIX_EPOCH)
        .map(|d| Timestamp::EPOCH.saturating_add(d))
        .map_err(|_| StoreError::corrupt(key, "a timestamp before 1970"))
}

/// The store clock's value in column [`NOW`], of a row that need not hold a readable record
/// (the clock is the query's, not the record's).
pub(crate) fn clock(row: &Row) -> Result<Timestamp, String> {
    clock_at(row, NOW)
}

/// The timestamp in column `index` of `row`.
pub(crate) fn clock_at(row: &Row, index: usize) -> Result<Timestamp, String> {
    let at: SystemTime = row
        .try_get(index)
        .map_err(|e| format!("column {index}: {e}"))?;
    at.duration_since(UNIX_EPOCH)
        .map(|d| Timestamp::EPOCH.saturating_add(d))
        .map_err(|_| "the store's clock is before 1970".to_owned())
}

/// The creation time of the row (column 6) in signed microseconds since the epoch, read
/// without decoding the record: the position of a scan's cursor, which a row that does not
/// decode has too.
pub(crate) fn created_micros(row: &Row) -> Result<i64, String> {
    let created: SystemTime = row.try_get(6).map_err(|e| format!("column 6: {e}"))?;
    let micros = |d: std::time::Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    Ok(match created.duration_since(UNIX_EPOCH) {
        Ok(after) => micros(after),
        Err(before) => -micros(before.duration()),
    })
}

/// The record in the first sixteen columns of `row`, or `None` if they are NULL (no row matched
/// a LEFT JOIN). Checks the record invariants.
pub(crate) fn record(key: &RecordKey, row: &Row) -> Result<Option<Record>, StoreError> {
    let Some(state) = get::<Option<&str>>(key, row, 0)? else {
        return Ok(None);
    };
    let corrupt = |reason: &str| StoreError::corrupt(key, reason.to_owned());
    let state: State = state.parse().map_err(|_| corrupt("unknown state"))?;
    let fingerprint: &[u8] = get(key, row, 1)?;
    let fingerprint: [u8; 32] = fingerprint
        .try_into()
        .map_err(|_| corrupt("the fingerprint is not 32 bytes"))?;
    let owner: &str = get(key, row, 2)?;
    let owner: OwnerToken = owner
        .replace('-', "")
        .parse()
        .map_err(|_| corrupt("the owner is not a 128-bit token"))?;
    let fence: i64 = get(key, row, 3)?;
    let fence = u64::try_from(fence).map_err(|_| corrupt("the fence is negative"))?;
    let attempt: i32 = get(key, row, 5)?;
    let attempt = u32::try_from(attempt).map_err(|_| corrupt("the attempt count is negative"))?;
    let completed_at = get::<Option<SystemTime>>(key, row, 7)?
        .map(|t| timestamp(key, t))
        .transpose()?;
    let result = get::<Option<&[u8]>>(key, row, 9)?.map(Bytes::copy_from_slice);
    let message: Option<String> = get(key, row, 10)?;
    let retryable: Option<bool> = get(key, row, 11)?;
    let failure = match (message, retryable) {
        (Some(message), Some(retryable)) => Some(Failure { message, retryable }),
        (None, None) => None,
        _ => return Err(corrupt("half a failure")),
    };
    let reason: Option<String> = get(key, row, 12)?;
    let request_sent: Option<bool> = get(key, row, 13)?;
    let head_seen: Option<bool> = get(key, row, 14)?;
    let unknown = match (reason, request_sent, head_seen) {
        (Some(reason), Some(request_sent), Some(head_seen)) => Some(UnknownOutcome {
            reason,
            request_sent,
            head_seen,
        }),
        (None, None, None) => None,
        _ => return Err(corrupt("part of an unknown outcome")),
    };
    let hold_until = get::<Option<SystemTime>>(key, row, 15)?
        .map(|t| timestamp(key, t))
        .transpose()?;
    let record = Record {
        key: key.clone(),
        state,
        fingerprint: Fingerprint::from_bytes(fingerprint),
        owner,
        fence: Fence::new(fence),
        lease_until: timestamp(key, get(key, row, 4)?)?,
        attempt,
        created_at: timestamp(key, get(key, row, 6)?)?,
        completed_at,
        expires_at: timestamp(key, get(key, row, 8)?)?,
        result,
        failure,
        unknown,
        hold_until,
    };
    record.validate()?;
    Ok(Some(record))
}
