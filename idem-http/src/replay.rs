//! [`replay`]: a stored response, answered again.

use http::header;
use http::{HeaderMap, HeaderName, HeaderValue, Response};
use idem_core::Record;

use crate::body::ResponseBody;
use crate::codec;
use crate::fields;
use crate::layer::Shared;
use crate::outcome::Outcome;
use crate::rejection::Rejection;
use crate::service::{REPLAY_HEADER, REPLAYED_HEADER, log_key, reject};

/// The stored response of `record`, replayed.
pub(crate) fn replay<B>(shared: &Shared, record: &Record) -> Response<ResponseBody<B>> {
    let decoded = match &record.result {
        Some(bytes) => codec::decode(bytes).map_err(|error| error.to_string()),
        None => Err("a completed record without a result".to_owned()),
    };
    let stored = match decoded {
        Ok(stored) => stored,
        Err(error) => {
            tracing::error!(
                idempotency_key = %log_key(&shared.config, &record.key),
                error = %error,
                "stored response unreadable"
            );
            return reject(shared, Rejection::CorruptRecord);
        }
    };
    let omitted = stored.body.is_none();
    // `Trailer` names them, as the original response did (it is never stored: it describes
    // the message, not the resource): an HTTP/1.1 server sends only the trailers it names.
    let announced = fields::trailer_value(stored.trailers.iter().map(|(name, _)| name));
    // The stored trailers are the last frame, after the body (or alone, if it was omitted).
    let trailers = (!stored.trailers.is_empty()).then(|| {
        let mut trailers = HeaderMap::with_capacity(stored.trailers.len());
        for (name, value) in stored.trailers {
            trailers.append(name, value);
        }
        trailers
    });
    let mut response = Response::new(ResponseBody::collected(
        stored.body.unwrap_or_default(),
        trailers,
    ));
    *response.status_mut() = stored.status;
    let headers = response.headers_mut();
    for (name, value) in stored.headers {
        headers.append(name, value);
    }
    if let Some(announced) = announced {
        headers.insert(header::TRAILER, announced);
    }
    if omitted {
        headers.insert(
            HeaderName::from_static(REPLAY_HEADER),
            HeaderValue::from_static("omitted"),
        );
    }
    headers.insert(
        HeaderName::from_static(REPLAYED_HEADER),
        HeaderValue::from_static("true"),
    );
    response.extensions_mut().insert(Outcome::Replayed);
    response
}
