//! The transport headers (§5.1): the operation selector and notify's
//! idempotency key and service ids, each read exactly once.

use super::{Result, Rule, SchemaViolation};
use crate::domain::{IdempotencyKey, ServiceId, visible_ascii};

pub const HEADER_OPERATION: &str = "arkret-operation";
pub const HEADER_IDEMPOTENCY_KEY: &str = "idempotency-key";
pub const HEADER_SOURCE_SERVICE: &str = "source-service-id";
pub const HEADER_DESTINATION_SERVICE: &str = "destination-service-id";

/// The operations and their paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    RegisterDevice,
    UnregisterDevice,
    Notify,
}

impl Operation {
    /// The exact `Arkret-Operation` selector. §3.1 names register's; the
    /// unregister one follows the same pattern (reading).
    pub fn selector(self) -> &'static str {
        match self {
            Self::RegisterDevice => "ak.edge.push.command.register_device.v1",
            Self::UnregisterDevice => "ak.edge.push.command.unregister_device.v1",
            Self::Notify => "ak.edge.push.command.notify.v1",
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Self::RegisterDevice => "/_arkret/edge/push/register-device",
            Self::UnregisterDevice => "/_arkret/edge/push/unregister-device",
            Self::Notify => "/_arkret/edge/push/notify",
        }
    }

    /// §5.1: notify MUST carry the selector. Reading: register/unregister
    /// may omit it, but a present one must be theirs.
    pub fn selector_required(self) -> bool {
        matches!(self, Self::Notify)
    }
}

fn header_once<'h>(headers: &'h http::HeaderMap, name: &'static str, shown: &'static str) -> Result<Option<&'h str>> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(SchemaViolation::header(shown, Rule::RepeatedHeader));
    }
    match first.to_str() {
        Ok(v) if visible_ascii(v, 255) => Ok(Some(v)),
        _ => Err(SchemaViolation::header(shown, Rule::BadHeaderValue)),
    }
}

/// `Arkret-Operation` against `op` (§5.1: exact selector).
pub fn check_operation(headers: &http::HeaderMap, op: Operation) -> Result<()> {
    const SHOWN: &str = "Arkret-Operation";
    match header_once(headers, HEADER_OPERATION, SHOWN) {
        Ok(None) if op.selector_required() => Err(SchemaViolation::header(SHOWN, Rule::MissingHeader)),
        Ok(None) => Ok(()),
        Ok(Some(v)) if v == op.selector() => Ok(()),
        Ok(Some(_)) | Err(SchemaViolation { rule: Rule::BadHeaderValue, .. }) => {
            Err(SchemaViolation::header(SHOWN, Rule::WrongOperation))
        }
        Err(e) => Err(e),
    }
}

/// The transport headers of notify (§5.1), each exactly once. Their
/// authenticity is `signature.rs`'s; that `source` is a configured Station
/// and `destination` this gateway is the service's to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyHeaders {
    pub idempotency_key: IdempotencyKey,
    pub source: ServiceId,
    pub destination: ServiceId,
}

impl NotifyHeaders {
    pub fn parse(headers: &http::HeaderMap) -> Result<Self> {
        check_operation(headers, Operation::Notify)?;
        let required = |name: &'static str, shown: &'static str| {
            header_once(headers, name, shown)?.ok_or(SchemaViolation::header(shown, Rule::MissingHeader))
        };
        let key = required(HEADER_IDEMPOTENCY_KEY, "Idempotency-Key")?;
        let source = required(HEADER_SOURCE_SERVICE, "Source-Service-ID")?;
        let destination = required(HEADER_DESTINATION_SERVICE, "Destination-Service-ID")?;
        Ok(Self {
            idempotency_key: IdempotencyKey::parse(key).expect("checked by header_once"),
            source: ServiceId::parse(source)
                .map_err(|_| SchemaViolation::header("Source-Service-ID", Rule::BadHeaderValue))?,
            destination: ServiceId::parse(destination)
                .map_err(|_| SchemaViolation::header("Destination-Service-ID", Rule::BadHeaderValue))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, http::HeaderValue::from_str(value).unwrap());
        }
        h
    }

    const NOTIFY_HEADERS: [(&str, &str); 4] = [
        ("arkret-operation", "ak.edge.push.command.notify.v1"),
        ("idempotency-key", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ("source-service-id", "did:web:station.example"),
        ("destination-service-id", "did:web:push.example"),
    ];

    #[test]
    fn notify_headers() {
        let h = NotifyHeaders::parse(&headers(&NOTIFY_HEADERS)).unwrap();
        assert_eq!(h.idempotency_key.as_str(), "8e03978e-40d5-43e8-bc93-6894a57f9324");
        assert_eq!((h.source.as_str(), h.destination.as_str()), ("did:web:station.example", "did:web:push.example"));

        let without = |name: &str| -> Vec<_> { NOTIFY_HEADERS.iter().copied().filter(|(n, _)| *n != name).collect() };
        let err = |pairs: &[(&'static str, &str)]| NotifyHeaders::parse(&headers(pairs)).unwrap_err();
        assert_eq!(err(&without("arkret-operation")), SchemaViolation::header("Arkret-Operation", Rule::MissingHeader));
        assert_eq!(err(&without("idempotency-key")), SchemaViolation::header("Idempotency-Key", Rule::MissingHeader));
        assert_eq!(
            err(&without("source-service-id")),
            SchemaViolation::header("Source-Service-ID", Rule::MissingHeader)
        );
        assert_eq!(
            err(&without("destination-service-id")),
            SchemaViolation::header("Destination-Service-ID", Rule::MissingHeader)
        );
        let mut wrong = without("arkret-operation");
        wrong.push(("arkret-operation", "ak.edge.push.command.register_device.v1"));
        assert_eq!(err(&wrong), SchemaViolation::header("Arkret-Operation", Rule::WrongOperation));
        let mut twice = NOTIFY_HEADERS.to_vec();
        twice.push(("idempotency-key", "other"));
        assert_eq!(err(&twice), SchemaViolation::header("Idempotency-Key", Rule::RepeatedHeader));
        let mut spaced = without("source-service-id");
        spaced.push(("source-service-id", "did:web:a b"));
        assert_eq!(err(&spaced), SchemaViolation::header("Source-Service-ID", Rule::BadHeaderValue));
        let mut long = without("idempotency-key");
        let key = "k".repeat(256);
        long.push(("idempotency-key", &key));
        assert_eq!(err(&long), SchemaViolation::header("Idempotency-Key", Rule::BadHeaderValue));
    }

    #[test]
    fn station_operations_may_omit_their_selector() {
        assert!(check_operation(&headers(&[]), Operation::RegisterDevice).is_ok());
        let register = headers(&[("arkret-operation", "ak.edge.push.command.register_device.v1")]);
        assert!(check_operation(&register, Operation::RegisterDevice).is_ok());
        assert_eq!(
            check_operation(&register, Operation::UnregisterDevice).unwrap_err(),
            SchemaViolation::header("Arkret-Operation", Rule::WrongOperation)
        );
        assert_eq!(Operation::Notify.path(), "/_arkret/edge/push/notify");
    }
}
