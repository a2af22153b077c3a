//! Reading one HTTP/1.1 response as its bytes arrive, sans I/O: the head
//! (kept only when it arrives split), then the body, counted and dropped
//! (or, for Vegeta's results, kept with the headers: [`Answer`]).
//! Both a request's task ([`super::worker`]) and the waiting room
//! ([`super::waiting`]) feed it whatever they read.

use throng_proto::http::{self, BodyDecoder, BodyError};

use super::record::{Answer, Exchange, MAX_KEPT_BODY, RequestError};
use crate::harness::failure::Failure;

/// Reads one response from the bytes as they arrive: the head (kept only
/// when it arrives split), then the body, which is counted and dropped.
#[derive(Debug)]
pub(super) struct ResponseReader {
    /// A head that has not arrived whole yet (empty otherwise).
    partial: Vec<u8>,
    /// Status, keep-alive and the body's decoder, once the head is in.
    head: Option<(u16, bool, BodyDecoder)>,
    /// Any byte arrived.
    any: bool,
    /// The headers and body, when kept (`--format vegeta`).
    answer: Option<Box<Answer>>,
}

impl ResponseReader {
    /// A reader before the first byte.
    pub(super) fn new() -> Self {
        Self {
            partial: Vec::new(),
            head: None,
            any: false,
            answer: None,
        }
    }

    /// A reader that keeps the response's headers and body (the first
    /// [`MAX_KEPT_BODY`] bytes of it) for [`ResponseReader::take_answer`].
    pub(super) fn keeping() -> Self {
        Self {
            answer: Some(Box::default()),
            ..Self::new()
        }
    }

    /// The headers and body kept, if this reader keeps them.
    pub(super) fn take_answer(&mut self) -> Option<Box<Answer>> {
        self.answer.take()
    }

    /// Any byte of the response arrived.
    pub(super) fn started(&self) -> bool {
        self.any
    }

    /// Feeds newly read bytes: `Some((status, keep_alive))` once the response ended.
    pub(super) fn feed(
        &mut self,
        data: &[u8],
        method: &str,
    ) -> Result<Option<(u16, bool)>, RequestError> {
        self.any = true;
        if let Some((status, keep, dec)) = self.head.as_mut() {
            return Ok(body(dec, data, self.answer.as_deref_mut())?
                .map(|extra| (*status, *keep && !extra)));
        }
        let joined = !self.partial.is_empty();
        if joined {
            if self.partial.len() + data.len() > http::MAX_HEAD + data.len().min(64 * 1024) {
                return Err(Failure::Own(Exchange::BadResponse));
            }
            self.partial.extend_from_slice(data);
        }
        let buf: &[u8] = if joined { &self.partial } else { data };
        let parsed = http::parse_response(buf, http::MAX_HEAD)
            .map_err(|_| Failure::Own(Exchange::BadResponse))?;
        let Some((mut resp, used)) = parsed else {
            if !joined {
                self.partial.extend_from_slice(data);
            }
            return Ok(None);
        };
        let kind = resp
            .body_kind(method)
            .map_err(|_| Failure::Own(Exchange::BadResponse))?;
        let keep = resp.keep_alive();
        let mut dec = BodyDecoder::new(kind, u64::MAX);
        if let Some(a) = self.answer.as_deref_mut() {
            a.headers = std::mem::take(&mut resp.headers);
        }
        let result = body(&mut dec, &buf[used..], self.answer.as_deref_mut())?
            .map(|extra| (resp.status, keep && !extra));
        self.head = Some((resp.status, keep, dec));
        self.partial = Vec::new();
        Ok(result)
    }

    /// The peer closed: the status if that ended the response.
    pub(super) fn eof(&mut self) -> Option<u16> {
        let (status, _, dec) = self.head.as_mut()?;
        match dec.decode(&[], true) {
            Ok(step) if step.done => Some(*status),
            _ => None,
        }
    }
}

/// Runs body bytes through the decoder (the data kept in `answer`, up to
/// [`MAX_KEPT_BODY`]): `Some(extra)` when the body ended (`extra`: bytes
/// followed it, so the connection cannot be trusted again).
fn body(
    dec: &mut BodyDecoder,
    mut rest: &[u8],
    mut answer: Option<&mut Answer>,
) -> Result<Option<bool>, RequestError> {
    loop {
        if dec.is_done() {
            return Ok(Some(!rest.is_empty()));
        }
        if rest.is_empty() {
            return Ok(None);
        }
        let step = dec.decode(rest, false).map_err(|e| match e {
            BodyError::Truncated => Failure::Own(Exchange::Closed),
            _ => Failure::Own(Exchange::BadResponse),
        })?;
        if let Some(a) = answer.as_deref_mut() {
            let data = &rest[step.data.0..step.data.1];
            let room = MAX_KEPT_BODY.saturating_sub(a.body.len());
            a.body.extend_from_slice(&data[..data.len().min(room)]);
        }
        rest = &rest[step.consumed..];
        if step.done {
            return Ok(Some(!rest.is_empty()));
        }
        if step.consumed == 0 {
            return Ok(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_split_heads_and_chunked_bodies() {
        let wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\npong\r\n4\r\npong\r\n0\r\n\r\n";
        for split in 1..wire.len() {
            // Kept (for Vegeta's results): the headers, the body decoded.
            let mut r = ResponseReader::keeping();
            let first = r.feed(&wire[..split], "POST").unwrap();
            let got = match first {
                Some(done) => {
                    assert_eq!(split, wire.len(), "ended early at {split}");
                    done
                }
                None => r.feed(&wire[split..], "POST").unwrap().unwrap(),
            };
            assert_eq!(got, (200, true), "split {split}");
            let a = r.take_answer().unwrap();
            assert_eq!(a.body, b"pongpong", "split {split}");
            assert_eq!(
                a.headers,
                [("Transfer-Encoding".to_owned(), b"chunked".to_vec())]
            );
        }
        assert!(ResponseReader::new().take_answer().is_none());
    }

    #[test]
    fn length_close_and_bad() {
        let mut r = ResponseReader::new();
        assert_eq!(
            r.feed(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno",
                "GET"
            )
            .unwrap(),
            Some((404, true))
        );
        let mut r = ResponseReader::new();
        assert_eq!(r.feed(b"HTTP/1.0 200 OK\r\n\r\nbody", "GET").unwrap(), None);
        assert_eq!(r.eof(), Some(200));
        let mut r = ResponseReader::new();
        assert_eq!(
            r.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", "GET")
                .unwrap(),
            None
        );
        assert_eq!(r.eof(), None);
        let mut r = ResponseReader::new();
        assert_eq!(
            r.feed(b"HTTP/1.1 204 No Content\r\n\r\nextra", "GET")
                .unwrap(),
            Some((204, false))
        );
        let mut r = ResponseReader::new();
        assert_eq!(
            r.feed(b"SMTP ready\r\n\r\n", "GET"),
            Err(Failure::Own(Exchange::BadResponse))
        );
    }
}
