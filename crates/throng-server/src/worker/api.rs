//! A worker's part of a server API question ([`crate::api::Query`]): the
//! supervisor asks every worker, each answers from its own subscriber
//! tables, and the supervisor merges the parts.

use bytes::Bytes;

use super::state::Worker;
use crate::api::{Part, Query};
use crate::control::{ApiRecord, Leg, Record};

/// Answers question `r` (a [`Leg::Query`]) with this worker's part.
pub(super) fn answer(w: &Worker, r: &ApiRecord) {
    let part = match serde_json::from_slice::<Query>(&r.body) {
        Ok(q) => part(w, &q),
        Err(e) => {
            log!("throng: worker {}: malformed API question: {e}", w.index);
            Part::default()
        }
    };
    let body = serde_json::to_vec(&part).unwrap_or_default();
    w.supervisor.send(&Record::Api(ApiRecord {
        leg: Leg::Part,
        id: r.id,
        body: Bytes::from(body),
    }));
}

fn part(w: &Worker, q: &Query) -> Part {
    let mut part = Part {
        workers: 1,
        ..Part::default()
    };
    match q {
        Query::Channels {
            prefix,
            after,
            limit,
        } => part.channels = w.subs.channel_page(prefix, after, limit.saturating_add(1)),
        Query::Channel { name } => {
            part.channels = vec![(name.clone(), w.subs.subscribers_of(name))];
            if presence_on(w, name) {
                part.presence = Some(Box::new(w.subs.presence_of(name)));
            }
        }
        Query::Disconnect {
            channel,
            code,
            reason,
        } => part.closed = w.subs.close_channel(channel, *code, reason),
        Query::DisconnectSubject { sub, code, reason } => {
            part.closed = w.subs.close_subject(sub, *code, reason);
        }
    }
    part
}

/// Whether `--presence` names `channel` (a pattern that does not parse was
/// refused at start).
pub(super) fn presence_on(w: &Worker, channel: &str) -> bool {
    !w.cfg.presence.is_empty()
        && crate::auth::Grants::parse(&w.cfg.presence).is_ok_and(|g| g.allows(channel))
}
