//! The lease model in JavaScript's shape: items and held leases as camelCase objects, and the
//! lease rules a driver asks about (deadline, next renewal).

use leaselock::{DesiredState, Lease, LeaseItem};
use serde::{Deserialize, Serialize};

/// A stored lease item (`LeaseItem`), as JavaScript sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JsItem {
    pub id: String,
    pub desired_state: Option<DesiredState>,
    pub url: Option<String>,
    pub owner: Option<String>,
    pub expires_at_ms: Option<u64>,
    pub last_seq: Option<u64>,
    pub fence: u64,
    pub ttl: Option<u64>,
}

impl From<LeaseItem> for JsItem {
    fn from(i: LeaseItem) -> Self {
        JsItem {
            id: i.id,
            desired_state: i.desired_state,
            url: i.url,
            owner: i.owner,
            expires_at_ms: i.expires_at_ms,
            last_seq: i.last_seq,
            fence: i.fence,
            ttl: i.ttl,
        }
    }
}

impl From<JsItem> for LeaseItem {
    fn from(i: JsItem) -> Self {
        LeaseItem {
            id: i.id,
            desired_state: i.desired_state,
            url: i.url,
            owner: i.owner,
            expires_at_ms: i.expires_at_ms,
            last_seq: i.last_seq,
            fence: i.fence,
            ttl: i.ttl,
        }
    }
}

/// A held lease (`Lease`). `deadline` is `deadline_mono_ms`: on the driver's monotonic clock
/// (`performance.now()`), when the owner must stop acting for the lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JsLease {
    pub id: String,
    pub owner: String,
    pub fence: u64,
    pub expires_at_ms: u64,
    pub last_seq: Option<u64>,
    pub url: Option<String>,
    pub desired_state: Option<DesiredState>,
    pub deadline: u64,
}

impl From<Lease> for JsLease {
    fn from(l: Lease) -> Self {
        JsLease {
            id: l.id,
            owner: l.owner,
            fence: l.fence,
            expires_at_ms: l.expires_at_ms,
            last_seq: l.last_seq,
            url: l.url,
            desired_state: l.desired_state,
            deadline: l.deadline_mono_ms,
        }
    }
}

impl From<JsLease> for Lease {
    fn from(l: JsLease) -> Self {
        Lease {
            id: l.id,
            owner: l.owner,
            fence: l.fence,
            expires_at_ms: l.expires_at_ms,
            last_seq: l.last_seq,
            url: l.url,
            desired_state: l.desired_state,
            deadline_mono_ms: l.deadline,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_cross_as_camel_case() {
        let lease = Lease {
            id: "a".into(),
            owner: "w".into(),
            fence: 3,
            expires_at_ms: 9,
            last_seq: Some(4),
            url: None,
            desired_state: Some(DesiredState::Started),
            deadline_mono_ms: 19_000,
        };
        let json = serde_json::to_string(&JsLease::from(lease.clone())).unwrap();
        assert!(json.contains(r#""expiresAtMs":9"#) && json.contains(r#""desiredState":"STARTED""#), "{json}");
        let back: JsLease = serde_json::from_str(&json).unwrap();
        assert_eq!(Lease::from(back), lease);
    }
}
