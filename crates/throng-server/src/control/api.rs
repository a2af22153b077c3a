//! The records of the server API (`/api/...`, [`crate::api`]): a worker
//! asks the supervisor, the supervisor asks every worker, each answers its
//! part, and the supervisor hands the merged answer back to the worker
//! that asked. One record kind with a leg byte: the four legs carry the
//! same fields, a request id and a JSON body (the API is not on the hot
//! path; JSON keeps the records readable and the merge in one place).

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::{ControlError, need};

/// Which way an [`ApiRecord`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leg {
    /// Worker → supervisor: an API request ([`crate::api::Query`]) arrived.
    Ask,
    /// Supervisor → every worker: answer your part of query `id`.
    Query,
    /// Worker → supervisor: this worker's part ([`crate::api::Part`]).
    Part,
    /// Supervisor → the asking worker: the merged parts.
    Answer,
}

/// One leg of an API request's round trip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiRecord {
    /// Which leg this is.
    pub leg: Leg,
    /// The asker's request id (`Ask`, `Answer`) or the supervisor's (`Query`, `Part`).
    pub id: u64,
    /// JSON: a [`crate::api::Query`] (`Ask`, `Query`) or a [`crate::api::Part`].
    pub body: Bytes,
}

pub(super) const API: u8 = 70;

/// Set in the id of a [`super::Record::Recover`] that is a server API
/// history read (`GET /api/history`), not a subscriber's recovery: its
/// answer goes to the API, and it is not counted as a recovery. A
/// worker's rejoin requests count up from 1 and never reach it.
pub const API_READ: u64 = 1 << 63;

pub(super) fn put(out: &mut BytesMut, r: &ApiRecord) {
    out.put_u8(API);
    out.put_u8(match r.leg {
        Leg::Ask => 0,
        Leg::Query => 1,
        Leg::Part => 2,
        Leg::Answer => 3,
    });
    out.put_u64_le(r.id);
    out.put_slice(&r.body);
}

pub(super) fn get(mut rec: Bytes) -> Result<ApiRecord, ControlError> {
    need(&rec, 9)?;
    let leg = match rec.get_u8() {
        0 => Leg::Ask,
        1 => Leg::Query,
        2 => Leg::Part,
        3 => Leg::Answer,
        _ => return Err(ControlError::Malformed("unknown API leg")),
    };
    let id = rec.get_u64_le();
    Ok(ApiRecord { leg, id, body: rec })
}
