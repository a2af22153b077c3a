//! Inflating one permessage-deflate message (RFC 7692) into a bounded
//! buffer: the receiving half of [`crate::deflate`], apart so that the
//! frame decoder, which inflates, does not depend on the frame encoder.

use flate2::{Decompress, FlushDecompress, Status};

/// The bytes a sync flush ends with, stripped by the sender and put back
/// by the receiver (RFC 7692 section 7.2.1).
pub(crate) const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// Why a compressed message could not be inflated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InflateError {
    /// It inflates to more than the limit (a decompression bomb is cut
    /// off here, having cost at most the limit).
    TooBig,
    /// Not a valid raw deflate stream.
    Corrupt,
}

/// Inflates one message's compressed payload (its frames' payloads
/// joined, without the tail) into at most `limit` bytes. Each message
/// starts afresh: the client was told `client_no_context_takeover`.
pub fn inflate(compressed: &[u8], limit: usize) -> Result<Vec<u8>, InflateError> {
    let mut d = Decompress::new(false);
    let mut out: Vec<u8> = Vec::with_capacity(
        compressed
            .len()
            .saturating_mul(4)
            .max(64)
            .min(limit.saturating_add(1)),
    );
    for (input, last) in [(compressed, false), (&TAIL[..], true)] {
        let start = d.total_in();
        loop {
            let used = (d.total_in() - start) as usize;
            if out.len() == out.capacity() {
                if out.len() > limit {
                    return Err(InflateError::TooBig);
                }
                // Room for one byte past the limit, to see it exceeded.
                let grow = out
                    .capacity()
                    .max(64)
                    .min(limit.saturating_add(1) - out.len());
                out.reserve_exact(grow);
            }
            let status = d
                .decompress_vec(&input[used..], &mut out, FlushDecompress::Sync)
                .map_err(|_| InflateError::Corrupt)?;
            if out.len() > limit {
                return Err(InflateError::TooBig);
            }
            let consumed = (d.total_in() - start) as usize == input.len();
            match status {
                Status::StreamEnd => return Ok(out),
                // All in, and room was left: nothing more comes out.
                _ if consumed && out.len() < out.capacity() => break,
                Status::BufError if !consumed && out.len() < out.capacity() => {
                    return Err(InflateError::Corrupt);
                }
                _ => {}
            }
        }
        if last {
            break;
        }
    }
    Ok(out)
}
