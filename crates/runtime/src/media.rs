//! Pictures, sound and binary resources a script returns, taken out of the returned value so
//! that a front end can send them as content blocks of their own (an MCP client shows an image
//! block; it does not decode base64 inside JSON text), and so that the model's text and the
//! structured result do not carry megabytes of base64.

use serde_json::{Map, Value, json};

/// Media found at most this deep in the returned value (MCP results nest two or three levels).
const MAX_DEPTH: usize = 8;

/// Replaces every MCP media block in `value` (`{type: "image"|"audio", data, mimeType}` and
/// `{type: "resource", resource: {uri, blob}}`) with a short note, and returns the blocks to
/// send: not an image block that is no picture `image()` would take, whose note says so.
pub(crate) fn lift_media(value: &mut Value) -> Vec<Value> {
    let mut found = Vec::new();
    walk(value, 0, &mut found);
    found
}

/// What the note of a lifted block says while it is to be sent.
const SENT_NOTE: &str = "sent as its own content block (media ";

/// Rewrites the notes of the lifted blocks numbered `first_unsent` and after (1-based among
/// those [`lift_media`] returned): the output budget left them out, and the returned value the
/// model reads must not say they were sent.
pub(crate) fn mark_unsent(value: &mut Value, first_unsent: usize) {
    mark(value, 0, first_unsent);
}

fn mark(value: &mut Value, depth: usize, first_unsent: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    match value {
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| mark(v, depth + 1, first_unsent)),
        Value::Object(map) => {
            let n = map.get("note").and_then(Value::as_str).and_then(|note| {
                note.strip_prefix(SENT_NOTE)?
                    .strip_suffix(')')?
                    .parse::<usize>()
                    .ok()
            });
            match n {
                Some(n) if n >= first_unsent => {
                    map.insert(
                        "note".into(),
                        Value::String("not sent: media may take half of the output budget, and this block did not fit; raise `max_output_tokens` to get it".into()),
                    );
                }
                Some(_) => {}
                None => map
                    .values_mut()
                    .for_each(|v| mark(v, depth + 1, first_unsent)),
            }
        }
        _ => {}
    }
}

fn walk(value: &mut Value, depth: usize, found: &mut Vec<Value>) {
    if depth > MAX_DEPTH {
        return;
    }
    match value {
        Value::Array(items) => items.iter_mut().for_each(|v| walk(v, depth + 1, found)),
        Value::Object(map) => {
            if let Some(note) = media_note(map, found.len() + 1) {
                let block = std::mem::replace(value, note);
                match codemode_sandbox::media_refusal(&block) {
                    // Not sent at all (an SVG "image"): the note says why instead.
                    Some(why) => {
                        if let Some(note) = value.as_object_mut() {
                            note.insert("note".into(), Value::String(format!("not sent: {why}")));
                        }
                    }
                    None => found.push(block),
                }
                return;
            }
            map.values_mut().for_each(|v| walk(v, depth + 1, found));
        }
        _ => {}
    }
}

/// The note that takes a media block's place, or `None` when `map` is not one.
fn media_note(map: &Map<String, Value>, n: usize) -> Option<Value> {
    let str_of = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_str).map(str::len);
    let kind = map.get("type").and_then(Value::as_str)?;
    let (mime, base64_len) = match kind {
        "image" | "audio" => (
            map.get("mimeType").and_then(Value::as_str)?,
            str_of(map, "data")?,
        ),
        "resource" => {
            let resource = map.get("resource")?.as_object()?;
            (
                resource
                    .get("mimeType")
                    .and_then(Value::as_str)
                    .unwrap_or("application/octet-stream"),
                str_of(resource, "blob")?,
            )
        }
        _ => return None,
    };
    Some(json!({
        "type": kind,
        "mimeType": mime,
        "bytes": base64_len / 4 * 3,
        "note": format!("{SENT_NOTE}{n})"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 1x1 PNG.
    const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";

    #[test]
    fn blocks_are_lifted_and_text_stays() {
        let mut v = json!({"content": [
            {"type": "text", "text": "hi"},
            {"type": "image", "data": PNG, "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "x:/a", "blob": "AAAAAAAA", "mimeType": "application/pdf"}},
            {"type": "resource", "resource": {"uri": "x:/b", "text": "plain"}}
        ]});
        let media = lift_media(&mut v);
        assert_eq!(media.len(), 2);
        assert_eq!(media[0]["data"], PNG);
        assert_eq!(v["content"][0]["text"], "hi");
        assert_eq!(v["content"][1]["bytes"], 72);
        assert_eq!(v["content"][2]["mimeType"], "application/pdf");
        assert_eq!(v["content"][3]["resource"]["text"], "plain");
    }

    #[test]
    fn a_bare_image_value_is_lifted() {
        let mut v = json!({"type": "image", "data": PNG, "mimeType": "image/png"});
        assert_eq!(lift_media(&mut v).len(), 1);
        assert_eq!(v["type"], "image");
        assert!(v.get("data").is_none());
    }

    /// Red team: an SVG returned as an image block was sent, though image() refuses it.
    #[test]
    fn an_image_that_is_no_picture_image_takes_is_not_sent() {
        let svg = "PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+"; // <svg onload=alert(1)>
        let mut v = json!([
            {"type": "image", "data": svg, "mimeType": "image/svg+xml"},
            {"type": "image", "data": svg, "mimeType": "image/png"},
            {"type": "image", "data": PNG, "mimeType": "image/png"}
        ]);
        let media = lift_media(&mut v);
        assert_eq!(media.len(), 1);
        assert_eq!(media[0]["data"], PNG);
        for refused in &v.as_array().unwrap()[..2] {
            let note = refused["note"].as_str().unwrap();
            assert!(note.starts_with("not sent: its "), "{note}");
            assert!(refused.get("data").is_none());
        }
        assert_eq!(v[2]["note"], "sent as its own content block (media 1)");
    }
}
