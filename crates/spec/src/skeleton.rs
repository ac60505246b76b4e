//! What a character reads as: the visible ASCII a reader takes it for, in lower case.
//!
//! Text an MCP server or a script writes must never pass for a line codemode writes (a framing
//! line, a namespace heading, a declaration). Whether it does is judged on its skeleton, not on
//! its characters: a list of invisible or lookalike characters is never complete (Hangul
//! fillers, braille blanks, tag characters, fullwidth forms, small capitals, ...), so what is
//! not visible ASCII after the fold counts for nothing, and a Latin letter the fold cannot name
//! counts as any letter.

use std::collections::HashMap;

/// A skeleton byte that stands for a Latin letter without an ASCII lookalike (`ʀ`, `ᴛ`, `ɾ`,
/// `ł`): a pattern's letter matches it, so that such letters cannot spell a pattern past a
/// check that compares letters.
pub const ANY_LETTER: u8 = 0x01;

/// Feeds `emit` the skeleton of `c`: its compatibility decomposition (NFKD, which folds
/// fullwidth, mathematical, circled and superscript forms and splits off accents), each part
/// that is not ASCII taken as the ASCII of its confusable prototype (UTS #39) if it has one, a
/// Latin letter that has none as [`ANY_LETTER`], combining marks and everything else dropped.
/// Visible ASCII is lowercased, other ASCII dropped.
///
/// A character folds alone, so a skeleton streams and each of its bytes points back to one
/// character of the text; a normalization that composes (NFKC) would only turn `e` and a
/// combining accent into `é`, which then drops.
pub fn fold_char(c: char, emit: &mut impl FnMut(u8)) {
    if c.is_ascii() {
        if c.is_ascii_graphic() {
            emit(c.to_ascii_lowercase() as u8);
        }
        return;
    }
    // Whole blocks of letters that fold to nothing: prose in them costs no table look-ups.
    if matches!(c, '\u{AC00}'..='\u{D7A3}' | '\u{3040}'..='\u{30FF}' | '\u{4E00}'..='\u{9FFF}') {
        return;
    }
    if unicode_normalization::char::is_combining_mark(c) {
        return;
    }
    let mut parts = Vec::new();
    unicode_normalization::char::decompose_compatible(c, |d| parts.push(d));
    // A ligature of a whole phrase (U+FDFA is 18 letters) is no lookalike of one letter: its
    // ASCII parts count, and no part costs a confusables look-up.
    let look_up = parts.len() <= 4;
    for d in parts {
        if d.is_ascii() {
            if d.is_ascii_graphic() {
                emit(d.to_ascii_lowercase() as u8);
            }
        } else if look_up && !unicode_normalization::char::is_combining_mark(d) {
            lookalike(d, emit);
        }
    }
}

/// The ASCII a character that is not ASCII looks like: its confusable prototype when that is
/// visible ASCII (Cyrillic `ѕ` and `о`, Greek `Ο`, `‹`), [`ANY_LETTER`] for a Latin letter
/// without one, none otherwise.
fn lookalike(c: char, emit: &mut impl FnMut(u8)) {
    let mut utf8 = [0u8; 4];
    let mut proto = [0u8; 4];
    let mut n = 0;
    for p in unicode_security::skeleton(c.encode_utf8(&mut utf8)) {
        if !p.is_ascii_graphic() || n == proto.len() {
            if is_latin_letter(c) {
                emit(ANY_LETTER);
            }
            return;
        }
        proto[n] = p.to_ascii_lowercase() as u8;
        n += 1;
    }
    // UTS #39 writes an `m` as `rn`, its prototype.
    if proto[..n] == *b"rn" {
        emit(b'm');
    } else {
        proto[..n].iter().for_each(|&b| emit(b));
    }
}

/// Whether skeleton byte `s` reads as byte `p` of a pattern written in lower-case ASCII: the
/// same, an `l` for an `i` (what UTS #39 folds `I`-like letters to), or a Latin letter the fold
/// could not name ([`ANY_LETTER`]) for a letter.
pub fn reads_as(p: u8, s: u8) -> bool {
    s == p || (p == b'i' && s == b'l') || (s == ANY_LETTER && p.is_ascii_alphabetic())
}

/// Letters of the Latin blocks past ASCII: Latin-1, Extended-A to E, IPA, phonetic extensions
/// (small capitals), Latin Extended Additional.
fn is_latin_letter(c: char) -> bool {
    c.is_alphabetic()
        && matches!(c,
            '\u{00C0}'..='\u{024F}'
            | '\u{0250}'..='\u{02AF}'
            | '\u{1D00}'..='\u{1DBF}'
            | '\u{1E00}'..='\u{1EFF}'
            | '\u{2C60}'..='\u{2C7F}'
            | '\u{A720}'..='\u{A7FF}'
            | '\u{AB30}'..='\u{AB6F}')
}

/// [`fold_char`] with the skeletons of characters that are not ASCII remembered: prose in
/// another script repeats few letters, and a look-up in the confusables table costs far more
/// than one in this map. Up to [`FoldCache::MAX`] characters are kept (about 2 MB).
#[derive(Default)]
pub struct FoldCache(HashMap<char, Box<[u8]>>);

impl FoldCache {
    /// Distinct characters remembered; past it, characters fold uncached (each at most four
    /// confusables look-ups).
    pub const MAX: usize = 65_536;

    pub fn fold(&mut self, c: char, emit: &mut impl FnMut(u8)) {
        if c.is_ascii() {
            return fold_char(c, emit);
        }
        if let Some(bytes) = self.0.get(&c) {
            bytes.iter().for_each(|&b| emit(b));
            return;
        }
        let mut folded = Vec::new();
        fold_char(c, &mut |b| folded.push(b));
        folded.iter().for_each(|&b| emit(b));
        if self.0.len() < Self::MAX {
            self.0.insert(c, folded.into_boxed_slice());
        }
    }
}

/// The skeleton of `text`.
pub fn skeleton(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut cache = FoldCache::default();
    for c in text.chars() {
        cache.fold(c, &mut |b| out.push(b));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookalikes_fold_to_the_ascii_they_read_as() {
        assert_eq!(skeleton("Script error:"), b"scripterror:");
        // Fullwidth, Cyrillic, invisibles, a Hangul filler, a braille blank, a tag space.
        assert_eq!(skeleton("\u{FF33}cr\u{0456}pt"), b"script");
        assert_eq!(skeleton("\u{200B}\u{3164}\u{2800}\u{E0020}\u{FE0F}#"), b"#");
        assert_eq!(skeleton("\u{FF03}\u{FF0F}\u{FF09}"), b"#/)");
        // Combining marks count for nothing, whatever their decomposition.
        assert_eq!(skeleton("a\u{1D16D}b\u{1BF3}c\u{0301}"), b"abc");
    }

    #[test]
    fn latin_letters_without_a_lookalike_are_any_letter() {
        let s = skeleton("\u{0280}\u{1D1B}\u{0142}");
        assert!(
            s.iter().all(|&b| b == ANY_LETTER || b.is_ascii_lowercase()),
            "{s:?}"
        );
        assert!(s.contains(&ANY_LETTER), "{s:?}");
        // Other scripts' letters without a lookalike drop.
        assert!(!skeleton("Привет, мир").contains(&ANY_LETTER));
    }

    #[test]
    fn phrase_ligatures_cost_no_look_ups_and_are_remembered() {
        let mut cache = FoldCache::default();
        let mut out = Vec::new();
        for _ in 0..3 {
            cache.fold('\u{FDFA}', &mut |b| out.push(b));
        }
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(cache.0.len(), 1);
    }
}
