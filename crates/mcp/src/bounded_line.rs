//! One line of a peer's output, read piece by piece and kept only up to a limit: the rest of a
//! longer line is skipped to its end instead of held in memory, and the line is reported as
//! oversized so the reader can answer for it.

pub(crate) struct BoundedLine {
    bytes: Vec<u8>,
    oversized: bool,
    max: usize,
}

impl BoundedLine {
    pub(crate) fn new(max: usize) -> Self {
        BoundedLine {
            bytes: Vec::new(),
            oversized: false,
            max,
        }
    }

    /// Adds the next piece of the line (its newline included, when the piece ends it).
    pub(crate) fn push(&mut self, piece: &[u8]) {
        if self.oversized {
            return;
        }
        if self.bytes.len() + piece.len() > self.max {
            self.oversized = true;
            self.bytes = Vec::new();
        } else {
            self.bytes.extend_from_slice(piece);
        }
    }

    /// Whether the line has run past the limit so far.
    pub(crate) fn is_oversized(&self) -> bool {
        self.oversized
    }

    /// Whether the line ran past the limit (and so holds nothing); true once per such line.
    pub(crate) fn take_oversized(&mut self) -> bool {
        std::mem::take(&mut self.oversized)
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Ready for the next line. One long line must not keep its buffer for the rest of the
    /// connection.
    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.bytes.shrink_to(64 * 1024);
    }
}

#[cfg(test)]
mod tests {
    use super::BoundedLine;

    #[test]
    fn a_line_past_the_limit_keeps_nothing_and_says_so_once() {
        let mut line = BoundedLine::new(8);
        line.push(b"1234");
        line.push(b"5678\n");
        assert!(line.take_oversized());
        assert!(line.bytes().is_empty());
        line.clear();
        assert!(!line.take_oversized());
        line.push(b"abc\n");
        assert_eq!(line.bytes(), b"abc\n");
    }
}
