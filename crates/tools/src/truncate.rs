//! Keeping the head and tail of output that is too long to return whole.

use std::collections::VecDeque;

/// Collects a stream of bytes while keeping at most `max` of them: the first half and the last
/// half. The beginning of a command's output usually says what it did and the end how it ended,
/// so those are the parts worth keeping.
#[derive(Debug)]
pub(crate) struct HeadTail {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    total: u64,
}

impl HeadTail {
    pub fn new(max: usize) -> Self {
        let head_cap = max / 2;
        HeadTail {
            head: Vec::new(),
            tail: VecDeque::new(),
            head_cap,
            tail_cap: max - head_cap,
            total: 0,
        }
    }

    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = self.head_cap - self.head.len();
        if room > 0 {
            let n = room.min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        if bytes.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.tail_cap..]);
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow);
        self.tail.extend(bytes);
    }

    pub fn truncated(&self) -> bool {
        self.total > (self.head.len() + self.tail.len()) as u64
    }

    /// The kept text. When bytes were cut, a marker in the middle says how many; cuts are moved
    /// to character boundaries so no character is split.
    pub fn finish(self) -> String {
        let truncated = self.truncated();
        let total = self.total;
        let mut tail: Vec<u8> = self.tail.into();
        if !truncated {
            let mut all = self.head;
            all.extend_from_slice(&tail);
            return String::from_utf8_lossy(&all).into_owned();
        }
        let mut head = self.head;
        // Drop a character split by the head's end: back up over continuation bytes to the
        // start byte of the last character and drop it if incomplete.
        let head_keep = complete_prefix_len(&head);
        head.truncate(head_keep);
        let tail_skip = tail
            .iter()
            .take_while(|b| is_continuation(**b))
            .count()
            .min(tail.len());
        tail.drain(..tail_skip);
        let cut = total - (head.len() + tail.len()) as u64;
        let mut out = String::from_utf8_lossy(&head).into_owned();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&format!(
            "\n[… {cut} bytes cut from the middle of {total} bytes of output …]\n\n"
        ));
        out.push_str(&String::from_utf8_lossy(&tail));
        out
    }
}

fn is_continuation(b: u8) -> bool {
    b & 0b1100_0000 == 0b1000_0000
}

/// Length of the longest prefix of `bytes` that does not end inside a UTF-8 character.
fn complete_prefix_len(bytes: &[u8]) -> usize {
    let len = bytes.len();
    // A UTF-8 character is at most 4 bytes: look at most 3 bytes back for its start.
    for back in 1..=len.min(4) {
        let b = bytes[len - back];
        if is_continuation(b) {
            continue;
        }
        let width = match b {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            _ => 4,
        };
        return if width > back { len - back } else { len };
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let mut h = HeadTail::new(10);
        h.push(b"abc");
        h.push(b"def");
        assert!(!h.truncated());
        assert_eq!(h.finish(), "abcdef");
    }

    #[test]
    fn long_output_keeps_head_and_tail() {
        let mut h = HeadTail::new(10);
        for chunk in [b"01234".as_slice(), b"56789", b"abcdefghij", b"KLMNO"] {
            h.push(chunk);
        }
        assert!(h.truncated());
        let out = h.finish();
        assert!(out.starts_with("01234\n"), "{out}");
        assert!(out.ends_with("KLMNO"), "{out}");
        assert!(out.contains("15 bytes cut"), "{out}");
    }

    #[test]
    fn cuts_never_split_a_character() {
        let text = "ééééééééééééééééééééé"; // 2 bytes each
        let mut h = HeadTail::new(7);
        h.push(text.as_bytes());
        let out = h.finish();
        assert!(!out.contains('\u{fffd}'), "{out}");
        assert!(out.starts_with("é"));
        assert!(out.ends_with("é"));
    }
}
