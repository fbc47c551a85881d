//! An operator's resolution of an unknown outcome, as `idem keys resolve`, the key API
//! (`POST /api/keys/KEY`) and the `/ui` buttons make it: the key is released (the effect did
//! not happen: the next request runs it) or settled as completed with the response the
//! operator gives (the effect happened: every retry gets that response). Either applies only
//! to a record still unknown at the fence the operator saw, so it never overwrites another
//! resolution or a newer attempt.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use idem_core::{Fence, RecordKey, State, Store, StoreError};
use idem_http::codec::{StoredResponse, encode};
use serde::Deserialize;
use serde_json::{Value, json};

/// What became of an unknown outcome, as the operator says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// It did not happen: the key is freed.
    Release,
    /// It happened, and this is its answer.
    Completed(StoredResponse),
}

impl Resolution {
    /// The `way` label of `idem_gateway_unknown_resolutions_total`.
    pub(crate) fn way(&self) -> &'static str {
        match self {
            Resolution::Release => "operator_released",
            Resolution::Completed(_) => "operator_completed",
        }
    }
}

/// Why a resolution was not applied.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResolveError {
    /// No record at the key.
    #[error("no record at {0}")]
    NoRecord(RecordKey),
    /// The record is not unknown (any more), or not at the fence given.
    #[error("the record at {key} is {state} at fence {fence}, not unknown{at}: nothing changed")]
    NotUnknown {
        /// The key.
        key: RecordKey,
        /// Its state.
        state: State,
        /// Its fence.
        fence: u64,
        /// ` at fence N` when a fence was given.
        at: String,
    },
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

impl ResolveError {
    /// The status the key API answers it with.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            ResolveError::NoRecord(_) => StatusCode::NOT_FOUND,
            ResolveError::NotUnknown { .. } => StatusCode::CONFLICT,
            ResolveError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// Resolves the unknown record at `key`: at `fence` if given, else at the fence the record
/// has now (read first). A completed resolution is kept for `retention`. Returns the fence
/// resolved.
///
/// # Errors
/// [`ResolveError`]: no record, a record not unknown (or at another fence), a store error.
pub(crate) async fn resolve(
    store: &dyn Store,
    key: &RecordKey,
    fence: Option<Fence>,
    resolution: &Resolution,
    retention: Duration,
) -> Result<Fence, ResolveError> {
    let record = store
        .get(key)
        .await?
        .ok_or_else(|| ResolveError::NoRecord(key.clone()))?;
    let fence = fence.unwrap_or(record.fence);
    let not_unknown = |state: State, at: Fence| ResolveError::NotUnknown {
        key: key.clone(),
        state,
        fence: at.get(),
        at: format!(" at fence {}", fence.get()),
    };
    if record.state != State::Unknown || record.fence != fence {
        return Err(not_unknown(record.state, record.fence));
    }
    let applied = match resolution {
        Resolution::Release => store.resolve_released(key, fence).await,
        Resolution::Completed(response) => {
            store
                .resolve_completed(key, fence, encode(response), retention)
                .await
        }
    };
    match applied {
        Ok(()) => {
            crate::reconcile::resolved(resolution.way()).increment(1);
            tracing::info!(%key, fence = fence.get(), way = resolution.way(), "admin: an unknown outcome was resolved");
            Ok(fence)
        }
        // Changed between the read and the resolution: say what it is now.
        Err(StoreError::Rejected(_)) => match store.get(key).await? {
            Some(now) => Err(not_unknown(now.state, now.fence)),
            None => Err(ResolveError::NoRecord(key.clone())),
        },
        Err(error) => Err(error.into()),
    }
}

/// A resolution as the key API takes it, JSON: `{"resolve": "release"}` or `{"resolve":
/// "completed", "status": 201, "headers": [["content-type", "application/json"]], "body":
/// "..."}`, with an optional `"fence"`.
#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResolveRequest {
    /// `release` or `completed`.
    pub resolve: String,
    /// The fence the resolution is for (default: the record's).
    #[serde(default)]
    pub fence: Option<u64>,
    /// The status of a completed resolution (default 200).
    #[serde(default)]
    pub status: Option<u16>,
    /// Its headers, in order.
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    /// Its body, as text.
    #[serde(default)]
    pub body: String,
}

impl ResolveRequest {
    /// The resolution and the fence it names, or what is wrong with it.
    ///
    /// # Errors
    /// A message for a 400 (or the CLI's exit 2).
    pub(crate) fn parse(self) -> Result<(Resolution, Option<Fence>), String> {
        let fence = self.fence.map(Fence::new);
        match self.resolve.as_str() {
            "release" => {
                if self.status.is_some() || !self.headers.is_empty() || !self.body.is_empty() {
                    return Err("a release takes no status, headers or body".to_owned());
                }
                Ok((Resolution::Release, fence))
            }
            "completed" => {
                let status = StatusCode::from_u16(self.status.unwrap_or(200))
                    .ok()
                    .filter(|status| !status.is_informational())
                    .ok_or("status: a final HTTP status, 200 to 599")?;
                let mut headers = Vec::with_capacity(self.headers.len());
                for (name, value) in &self.headers {
                    let name = HeaderName::try_from(name.as_str())
                        .map_err(|_| format!("{name:?} is not a header name"))?;
                    let value = HeaderValue::try_from(value.as_str())
                        .map_err(|_| format!("the value of {name} is not a header value"))?;
                    headers.push((name, value));
                }
                Ok((
                    Resolution::Completed(StoredResponse {
                        status,
                        headers,
                        body: Some(Bytes::from(self.body)),
                        trailers: Vec::new(),
                    }),
                    fence,
                ))
            }
            other => Err(format!("resolve: {other:?}: \"release\" or \"completed\"")),
        }
    }
}

/// The answer to a resolution, as JSON.
pub(crate) fn resolved_json(key: &RecordKey, fence: Fence, resolution: &Resolution) -> Value {
    json!({
        "key": key.key.as_str(),
        "scope": key.scope.as_str(),
        "fence": fence.get(),
        "resolved": match resolution {
            Resolution::Release => "released",
            Resolution::Completed(_) => "completed",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(json: &str) -> Result<(Resolution, Option<Fence>), String> {
        serde_json::from_str::<ResolveRequest>(json)
            .map_err(|err| err.to_string())
            .and_then(ResolveRequest::parse)
    }

    #[test]
    fn requests_parse_or_say_what_is_wrong() {
        assert_eq!(
            parsed(r#"{"resolve":"release"}"#).unwrap(),
            (Resolution::Release, None)
        );
        let (completed, fence) = parsed(
            r#"{"resolve":"completed","status":201,"headers":[["content-type","text/plain"]],"body":"ok","fence":7}"#,
        )
        .unwrap();
        assert_eq!(fence, Some(Fence::new(7)));
        let Resolution::Completed(response) = completed else {
            panic!("not completed");
        };
        assert_eq!(response.status, StatusCode::CREATED);
        assert_eq!(response.body.as_deref(), Some(&b"ok"[..]));
        for (bad, why) in [
            (r#"{"resolve":"maybe"}"#, "\"release\" or \"completed\""),
            (r#"{"resolve":"release","status":200}"#, "takes no status"),
            (
                r#"{"resolve":"completed","status":100}"#,
                "a final HTTP status",
            ),
            (
                r#"{"resolve":"completed","status":1000}"#,
                "a final HTTP status",
            ),
            (
                r#"{"resolve":"completed","headers":[["a b","x"]]}"#,
                "not a header name",
            ),
            (
                r#"{"resolve":"completed","headers":[["a","\n"]]}"#,
                "not a header value",
            ),
            (r#"{"resolve":"release","extra":1}"#, "unknown field"),
        ] {
            let err = parsed(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
