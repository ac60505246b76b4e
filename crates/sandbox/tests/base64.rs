//! `atob` and `btoa`: HTML's forgiving base64, as pure functions of the prelude.

mod common;

use base64::Engine;
use common::*;
use serde_json::json;

async fn known_vectors_and_every_byte_round_trip() {
    let r = run(r#"
        const bytes = Array.from({ length: 256 }, (_, i) => String.fromCharCode(i)).join("");
        return [btoa(""), btoa("f"), btoa("fo"), btoa("foo"), btoa("foobar"), btoa(bytes),
                atob(btoa(bytes)) === bytes, atob("Zm9vYg"), atob(" Zm9v\tYmFy\n"), atob("Zg=="),
                atob(""), btoa(12), typeof atob, atob.length, btoa.length]"#)
    .await;
    let all: Vec<u8> = (0..=255).collect();
    assert_eq!(
        r.value,
        Some(json!([
            "",
            "Zg==",
            "Zm8=",
            "Zm9v",
            "Zm9vYmFy",
            base64::engine::general_purpose::STANDARD.encode(&all),
            true,
            "foob",
            "foobar",
            "f",
            "",
            "MTI=",
            "function",
            1,
            1
        ])),
        "{:?}",
        r.error
    );
}

async fn bad_input_is_an_invalid_character_error() {
    let r = run(r#"
        const out = [];
        for (const f of [() => btoa("日本"), () => btoa("\u0100"), () => atob("Zm9v!"), () => atob("Z"),
                         () => atob("Zm9=v"), () => atob("Zg="), () => atob("Zg==="), () => atob("é"),
                         () => atob(undefined), () => atob(), () => btoa()]) {
          try { out.push(["no error", f()]); } catch (e) { out.push([e.name, e instanceof Error]); }
        }
        return out"#)
    .await;
    let v = r.value.unwrap_or_else(|| panic!("{:?}", r.error));
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[0].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "InvalidCharacterError",
            "InvalidCharacterError",
            "InvalidCharacterError",
            "InvalidCharacterError",
            "InvalidCharacterError",
            "InvalidCharacterError",
            "InvalidCharacterError",
            "InvalidCharacterError",
            "InvalidCharacterError",
            "TypeError",
            "TypeError"
        ],
        "{v}"
    );
}

async fn large_data_decodes_and_scripts_cannot_replace_them() {
    // A megabyte of bytes, as an MCP tool might hand over a file.
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&data);
    let r = run(&format!(
        r#"const s = atob({b64:?});
           let sum = 0; for (let i = 0; i < s.length; i++) sum = (sum + s.charCodeAt(i) * (i % 13 + 1)) % 1000000007;
           const again = btoa(s) === {b64:?};
           const original = atob; try {{ globalThis.atob = () => "x"; }} catch (_) {{}}
           const replaced = atob !== original;
           return [s.length, sum, again, replaced, atob("Zg==")]"#
    ))
    .await;
    let sum = data.iter().enumerate().fold(0u64, |s, (i, b)| {
        (s + u64::from(*b) * (i as u64 % 13 + 1)) % 1_000_000_007
    });
    assert_eq!(
        r.value,
        Some(json!([1_000_000, sum, true, false, "f"])),
        "{:?}",
        r.error
    );
}

both_modes!(
    known_vectors_and_every_byte_round_trip,
    bad_input_is_an_invalid_character_error,
    large_data_decodes_and_scripts_cannot_replace_them,
);
