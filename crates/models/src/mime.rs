//! Image type detection by magic bytes: providers and scripts often mislabel images, and the
//! bytes are what a viewer will decode.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// The MIME type of base64 image data, judged from its first bytes only (no full decode).
pub(crate) fn image_mime(base64_data: &str) -> Option<&'static str> {
    // 24 base64 characters are 18 bytes, enough for every signature below.
    let head: String = base64_data
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .take(24)
        .collect();
    if !head.is_ascii() {
        return None;
    }
    let usable = head.len() - head.len() % 4;
    let bytes = STANDARD.decode(&head[..usable]).ok()?;
    sniff(&bytes)
}

fn sniff(b: &[u8]) -> Option<&'static str> {
    if b.starts_with(&[0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a]) {
        Some("image/png")
    } else if b.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if b.len() >= 12 && b.starts_with(b"RIFF") && &b[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::image_mime;

    #[test]
    fn detects_the_four_formats_and_refuses_others() {
        assert_eq!(
            image_mime("iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"),
            Some("image/png")
        );
        assert_eq!(image_mime("/9j/4AAQSkZJRgABAQ=="), Some("image/jpeg"));
        assert_eq!(image_mime("R0lGODlhAQABAAAAACw="), Some("image/gif"));
        assert_eq!(
            image_mime("UklGRiQAAABXRUJQVlA4IBgAAAAw"),
            Some("image/webp")
        );
        assert_eq!(image_mime("QUJDREVGR0hJSktM"), None);
        assert_eq!(image_mime("not base64 at all!!"), None);
        assert_eq!(image_mime(""), None);
    }
}
