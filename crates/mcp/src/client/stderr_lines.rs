//! A stdio server's stderr, line by line, each line cut to a bound.
//!
//! What a server writes there is logged and its last lines kept for the error when it fails to
//! start. Read as whole lines, one line without a newline grew with everything written: a
//! server that wrote 300 MiB of it took codemode to 365 MB, and one that failed after 200 MB to
//! 5.5 GB while the line was joined and escaped for its error message.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// The longest stderr line kept; the rest of it is counted, not kept.
pub(crate) const MAX_LINE_BYTES: usize = 4096;

/// Calls `line` with each line of `reader` (without its newline), cut to [`MAX_LINE_BYTES`]
/// with a note of what was left out, until the end or a read error.
pub(crate) async fn each_line<R: AsyncBufRead + Unpin>(
    mut reader: R,
    mut line: impl FnMut(String),
) {
    let mut kept: Vec<u8> = Vec::new();
    let mut dropped: u64 = 0;
    loop {
        let (used, ended) = match reader.fill_buf().await {
            Ok([]) | Err(_) => {
                if !kept.is_empty() || dropped > 0 {
                    line(finish(&mut kept, &mut dropped));
                }
                return;
            }
            Ok(buf) => match buf.iter().position(|&b| b == b'\n') {
                Some(at) => {
                    take(&mut kept, &mut dropped, &buf[..at]);
                    (at + 1, true)
                }
                None => {
                    take(&mut kept, &mut dropped, buf);
                    (buf.len(), false)
                }
            },
        };
        reader.consume(used);
        if ended {
            line(finish(&mut kept, &mut dropped));
        }
    }
}

fn take(kept: &mut Vec<u8>, dropped: &mut u64, bytes: &[u8]) {
    let room = MAX_LINE_BYTES.saturating_sub(kept.len());
    let (now, rest) = bytes.split_at(room.min(bytes.len()));
    kept.extend_from_slice(now);
    *dropped += rest.len() as u64;
}

fn finish(kept: &mut Vec<u8>, dropped: &mut u64) -> String {
    let mut text = String::from_utf8_lossy(kept).into_owned();
    if *dropped > 0 {
        text.push_str(&format!(
            " […{} more bytes of this line left out]",
            *dropped
        ));
    }
    kept.clear();
    *dropped = 0;
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines_of(input: Vec<u8>) -> Vec<String> {
        let mut seen = Vec::new();
        // A small buffer, so lines span many reads.
        let reader = tokio::io::BufReader::with_capacity(1000, &input[..]);
        each_line(reader, |l| seen.push(l)).await;
        seen
    }

    #[tokio::test]
    async fn a_line_without_end_is_cut_and_the_next_ones_come_whole() {
        let mut input = vec![b'a'; 10 << 20];
        input.extend_from_slice(b"\nsecond\n\nlast without newline");
        let lines = lines_of(input).await;
        assert_eq!(
            lines.len(),
            4,
            "{:?}",
            lines.iter().map(String::len).collect::<Vec<_>>()
        );
        assert!(lines[0].starts_with(&"a".repeat(MAX_LINE_BYTES)));
        assert!(lines[0].len() < MAX_LINE_BYTES + 100, "{}", lines[0].len());
        assert!(lines[0].ends_with(&format!(
            "[…{} more bytes of this line left out]",
            (10 << 20) - MAX_LINE_BYTES
        )));
        assert_eq!(lines[1..], ["second", "", "last without newline"]);
    }

    #[tokio::test]
    async fn an_endless_line_is_reported_once_the_stream_ends() {
        let lines = lines_of(vec![0u8; 3 << 20]).await;
        assert_eq!(lines.len(), 1);
        assert!(lines[0].len() < MAX_LINE_BYTES * 4);
    }
}
