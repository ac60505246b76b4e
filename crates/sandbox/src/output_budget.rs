//! The model text's budget, counted in real tokens (o200k) rather than characters, and the
//! images that fit in it.
//!
//! Four characters a token holds for English prose only: code takes about 2.4 bytes a token,
//! base64 1.6, control characters 1, and a mathematical letter outside the BMP 3 tokens for its
//! one character. A budget counted in characters let such output reach the model at 1.6 to 12
//! times the operator's limit.

use base64::Engine as _;

/// Text longer than this many bytes per token of the budget is not counted whole: only real
/// text past it is never cheaper (runs of one repeated character are, and they are slow to
/// count), so it is cut as if it did not fit.
const COUNTED_BYTES_PER_TOKEN: usize = 32;

/// What an image of unknown size costs: about the most a model charges for one it has resized
/// to its own maximum (1.15 megapixels at 750 pixels a token).
pub(crate) const IMAGE_TOKENS_MAX: u64 = 1_600;
/// The least an image costs, whatever its size: its block's own overhead.
pub(crate) const IMAGE_TOKENS_MIN: u64 = 85;

/// How `text` fits in `budget` tokens.
pub(crate) enum Fit {
    Whole,
    /// Keep `text[..head]` and `text[tail..]`; `total` is the whole text's tokens (estimated
    /// when it was too long to count).
    Cut {
        head: usize,
        tail: usize,
        total: usize,
    },
}

pub(crate) fn fit(text: &str, budget: usize) -> Fit {
    // No token is shorter than a byte.
    if text.len() <= budget {
        return Fit::Whole;
    }
    let bpe = tiktoken_rs::o200k_base_singleton();
    let head_tokens = budget / 2;
    let tail_tokens = budget - head_tokens;
    if text.len() <= budget.saturating_mul(COUNTED_BYTES_PER_TOKEN) {
        let tokens = bpe.encode_ordinary(text);
        if tokens.len() <= budget {
            return Fit::Whole;
        }
        let head = floor_char(text, bytes_of(bpe, &tokens[..head_tokens]));
        let tail_len = bytes_of(bpe, &tokens[tokens.len() - tail_tokens..]);
        let tail = ceil_char(text, text.len() - tail_len);
        return Fit::Cut {
            head,
            tail: tail.max(head),
            total: tokens.len(),
        };
    }
    // Too long to count whole: count a window at each end, each long enough for its half.
    let window = head_tokens
        .max(tail_tokens)
        .saturating_mul(COUNTED_BYTES_PER_TOKEN);
    let head_window = &text[..floor_char(text, window)];
    let head_counted = bpe.encode_ordinary(head_window);
    let head = floor_char(
        text,
        bytes_of(bpe, &head_counted[..head_tokens.min(head_counted.len())]),
    );
    let tail_window = &text[ceil_char(text, text.len() - window)..];
    let tail_counted = bpe.encode_ordinary(tail_window);
    let keep = tail_tokens.min(tail_counted.len());
    let tail_len = bytes_of(bpe, &tail_counted[tail_counted.len() - keep..]);
    let tail = ceil_char(text, text.len() - tail_len);
    let sampled = head_window.len() + tail_window.len();
    let total = (text.len() as u128 * (head_counted.len() + tail_counted.len()) as u128
        / sampled.max(1) as u128) as usize;
    Fit::Cut {
        head,
        tail: tail.max(head),
        total: total.max(budget + 1),
    }
}

fn bytes_of(bpe: &tiktoken_rs::CoreBPE, tokens: &[u32]) -> usize {
    bpe.decode_bytes(tokens).map(|b| b.len()).unwrap_or(0)
}

fn floor_char(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn ceil_char(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// The picture types `image()` takes, and clients show: none of them runs code (an SVG may).
pub(crate) const IMAGE_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

/// The type of picture base64 `data` holds, by its first bytes, when it is one of
/// [`IMAGE_TYPES`] and all of it is base64 (the checks `image()` makes).
pub(crate) fn image_type(data: &str) -> Option<&'static str> {
    let clean = data.len().is_multiple_of(4)
        && data
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=');
    if !clean {
        return None;
    }
    let head = base64::engine::general_purpose::STANDARD
        .decode(&data.as_bytes()[..data.len().min(16)])
        .ok()?;
    let h = head.as_slice();
    if h.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if h.starts_with(b"\xFF\xD8\xFF") && !matches!(h.get(3), Some(0xF4..=0xF7)) {
        // As image() checks it: its base64 test leaves out a fourth byte of F4 to F7.
        Some("image/jpeg")
    } else if h.starts_with(b"GIF87a") || h.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if h.starts_with(b"RIFF") && h.get(8..12) == Some(b"WEBP") {
        Some("image/webp")
    } else {
        None
    }
}

/// What an image costs the model, from its size where its header says it (PNG, GIF), at 750
/// pixels a token, between [`IMAGE_TOKENS_MIN`] and [`IMAGE_TOKENS_MAX`].
pub(crate) fn image_tokens(base64_data: &str) -> u64 {
    let head: String = base64_data.chars().take(32).collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(head.as_bytes())
        .unwrap_or_default();
    let pixels = match bytes.as_slice() {
        [
            0x89,
            b'P',
            b'N',
            b'G',
            _,
            _,
            _,
            _,
            _,
            _,
            _,
            _,
            b'I',
            b'H',
            b'D',
            b'R',
            w @ ..,
        ] if w.len() >= 8 => {
            let width = u32::from_be_bytes([w[0], w[1], w[2], w[3]]) as u64;
            let height = u32::from_be_bytes([w[4], w[5], w[6], w[7]]) as u64;
            Some(width.saturating_mul(height))
        }
        [b'G', b'I', b'F', b'8', _, b'a', w0, w1, h0, h1, ..] => {
            Some(u16::from_le_bytes([*w0, *w1]) as u64 * u16::from_le_bytes([*h0, *h1]) as u64)
        }
        _ => None,
    };
    match pixels {
        Some(p) => p.div_ceil(750).clamp(IMAGE_TOKENS_MIN, IMAGE_TOKENS_MAX),
        None => IMAGE_TOKENS_MAX,
    }
}
