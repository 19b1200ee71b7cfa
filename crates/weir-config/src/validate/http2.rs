//! Validation of `[listeners.http2]`: HTTP/2 settings and flood-defence budgets, each with
//! its default and a range the `h2` crate and RFC 9113 accept.

use std::ops::RangeInclusive;

use super::{duration, int_in, size};
use crate::error::{FieldPath, Issue};
use crate::model::Http2;
use crate::raw::{RawHttp2, StrOrInt};

/// The largest flow-control window RFC 9113 allows (2^31 - 1).
const MAX_WINDOW: u64 = (1 << 31) - 1;

pub(super) fn http2(raw: Option<RawHttp2>, path: &FieldPath) -> Result<Http2, Issue> {
    let Some(raw) = raw else {
        return Ok(Http2::default());
    };
    let d = Http2::default();
    let key = |k: &str| path.key(k);
    let count = |v: Option<i64>, default: u32, range: RangeInclusive<i64>, k: &str| {
        int_in::<u32>(v, i64::from(default), range, &key(k))
    };
    let [initial_stream_window, initial_connection_window, max_send_buffer, max_connection_send_buffer] =
        windows(&raw, path)?;
    let reset_window = duration(raw.reset_window, "10s", &key("reset_window"), true)?;
    let glitch_window = duration(raw.glitch_window, "10s", &key("glitch_window"), true)?;
    let stall_timeout = duration(raw.stall_timeout, "30s", &key("stall_timeout"), true)?;
    Ok(Http2 {
        max_concurrent_streams: count(
            raw.max_concurrent_streams,
            d.max_concurrent_streams,
            1..=65_535,
            "max_concurrent_streams",
        )?,
        max_header_list_size: header_list_size(
            raw.max_header_list_size,
            &key("max_header_list_size"),
        )?,
        initial_stream_window,
        initial_connection_window,
        max_send_buffer,
        max_connection_send_buffer,
        reset_budget: count(
            raw.reset_budget,
            d.reset_budget,
            1..=1_000_000,
            "reset_budget",
        )?,
        reset_window,
        max_pending_accept_resets: count(
            raw.max_pending_accept_resets,
            d.max_pending_accept_resets,
            1..=100_000,
            "max_pending_accept_resets",
        )?,
        max_local_error_resets: count(
            raw.max_local_error_resets,
            d.max_local_error_resets,
            1..=1_000_000,
            "max_local_error_resets",
        )?,
        glitch_budget: count(
            raw.glitch_budget,
            d.glitch_budget,
            1..=1_000_000,
            "glitch_budget",
        )?,
        glitch_window,
        stall_timeout,
        max_informational: count(
            raw.max_informational,
            d.max_informational,
            0..=100,
            "max_informational",
        )?,
        max_tunnels: count(raw.max_tunnels, d.max_tunnels, 1..=65_535, "max_tunnels")?,
    })
}

/// The flow-control windows and send buffers: each from its least size up to the largest
/// window RFC 9113 allows.
fn windows(raw: &RawHttp2, path: &FieldPath) -> Result<[u32; 4], Issue> {
    let d = Http2::default();
    let window = |v: &Option<StrOrInt>, default: u32, min: u64, k: &str| {
        bytes(v.clone(), default, min..=MAX_WINDOW, &path.key(k))
    };
    Ok([
        window(
            &raw.initial_stream_window,
            d.initial_stream_window,
            1024,
            "initial_stream_window",
        )?,
        window(
            &raw.initial_connection_window,
            d.initial_connection_window,
            65_535,
            "initial_connection_window",
        )?,
        window(
            &raw.max_send_buffer,
            d.max_send_buffer,
            1024,
            "max_send_buffer",
        )?,
        // Below a DATA frame's default size (16KiB) a connection would write in dribbles.
        window(
            &raw.max_connection_send_buffer,
            d.max_connection_send_buffer,
            16 * 1024,
            "max_connection_send_buffer",
        )?,
    ])
}

/// A `max_header_list_size` (a listener's `http2`, an upstream's): 1KiB..=16MiB, 64KiB
/// by default.
pub(super) fn header_list_size(raw: Option<StrOrInt>, path: &FieldPath) -> Result<u32, Issue> {
    bytes(raw, 64 * 1024, 1024..=16 * 1024 * 1024, path)
}

/// A size within `range` bytes.
pub(super) fn bytes(
    raw: Option<StrOrInt>,
    default: u32,
    range: RangeInclusive<u64>,
    path: &FieldPath,
) -> Result<u32, Issue> {
    let key = path.last_key();
    let value = size(raw, u64::from(default), path)?;
    if !range.contains(&value) {
        return Err(Issue::new(
            path,
            format!(
                "{key} must be between {} and {} bytes, not {value}",
                range.start(),
                range.end()
            ),
            format!(
                "set {key} to a size such as \"{}KiB\" (the default)",
                default / 1024
            ),
        ));
    }
    Ok(u32::try_from(value).unwrap_or(default))
}
