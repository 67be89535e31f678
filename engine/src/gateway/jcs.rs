//! RFC 8785 JSON Canonicalization Scheme: the `canonical_json` of spec 002's
//! HMAC inputs (§2.2 pseudonym, §2.4 collapse key) and of the request
//! digests that tell an idempotent replay from a conflicting reuse (§5.2).
//!
//! The encoder is `serde_json_canonicalizer` (RFC 8785 number formatting via
//! ryu-js, UTF-16 key order); this module pins its output on the RFC's own
//! examples and on an independent implementation (Python `rfc8785`).

use serde::Serialize;
use sha2::{Digest, Sha256};

/// The JCS bytes of `value`. Every value the gateway canonicalizes is built
/// from strings, booleans and integers below 2^53, which JCS always encodes;
/// a failure would be a bug, not input.
pub fn to_vec<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json_canonicalizer::to_vec(value).expect("JCS of strings, booleans and safe integers")
}

/// SHA-256 of the JCS bytes: two bodies that differ only in key order,
/// whitespace or escapes have the same digest.
pub fn sha256<T: Serialize>(value: &T) -> [u8; 32] {
    Sha256::digest(to_vec(value)).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(json: &str) -> String {
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        String::from_utf8(to_vec(&value)).unwrap()
    }

    #[test]
    fn rfc_8785_section_3_2_2_sample() {
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        assert_eq!(
            canonical(input),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    #[test]
    fn rfc_8785_section_3_2_3_sorts_by_utf16_code_units() {
        let input = r#"{
          "\u20ac": "Euro Sign",
          "\r": "Carriage Return",
          "\ufb33": "Hebrew Letter Dalet With Dagesh",
          "1": "One",
          "\ud83d\ude00": "Emoji: Grinning Face",
          "\u0080": "Control",
          "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        // U+1F600 (surrogates D83D DE00) sorts before U+FB33: UTF-16 order,
        // not code point order.
        assert_eq!(
            canonical(input),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\
             \"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
    }

    /// Outputs pinned from Python's `rfc8785` 0.1.4 (`rfc8785.dumps`), an
    /// implementation independent of ours.
    #[test]
    fn agrees_with_python_rfc8785() {
        for (input, python) in [
            (
                r#"{"b":[1,{"z":1,"a":2}],"a":-0.0,"c":1e21,"d":1e-7,"f":9007199254740991}"#,
                r#"{"a":0,"b":[1,{"a":2,"z":1}],"c":1e+21,"d":1e-7,"f":9007199254740991}"#,
            ),
            (
                r#"{"notification":{"push_target_id":"ak:pseudonym:push:kosc9iQ4gVct1OB-b6X364WIFIsJFVbVzn7BMBs1sm8","wakeup_kind":"message","counts":{"badge":"2-5","missed_call":false},"devices":[{"device_id":"ak:device:0192f3a1-4c2b-7d5e-9f10-2a3b4c5d6e7f"}]}}"#,
                r#"{"notification":{"counts":{"badge":"2-5","missed_call":false},"devices":[{"device_id":"ak:device:0192f3a1-4c2b-7d5e-9f10-2a3b4c5d6e7f"}],"push_target_id":"ak:pseudonym:push:kosc9iQ4gVct1OB-b6X364WIFIsJFVbVzn7BMBs1sm8","wakeup_kind":"message"}}"#,
            ),
            (
                r#"{"k":"<tab>\t</script>\u2028\u007f","e":"","A":[],"a":{}}"#,
                "{\"A\":[],\"a\":{},\"e\":\"\",\"k\":\"<tab>\\t</script>\u{2028}\u{7f}\"}",
            ),
            (r#"[1.5,100,1e-6,0.1,123456789.125,-1]"#, "[1.5,100,0.000001,0.1,123456789.125,-1]"),
        ] {
            assert_eq!(canonical(input), python, "{input}");
        }
    }

    #[test]
    fn struct_fields_are_sorted_and_the_digest_ignores_layout() {
        #[derive(Serialize)]
        struct S {
            z: u32,
            a: &'static str,
        }
        assert_eq!(to_vec(&S { z: 1, a: "x" }), br#"{"a":"x","z":1}"#);
        let one: serde_json::Value = serde_json::from_str(r#"{ "a" : "x", "z" : 1 }"#).unwrap();
        let two: serde_json::Value = serde_json::from_str(r#"{"z":1,"a":"\u0078"}"#).unwrap();
        assert_eq!(sha256(&one), sha256(&two));
        assert_eq!(sha256(&one), sha256(&S { z: 1, a: "x" }));
        let three: serde_json::Value = serde_json::from_str(r#"{"z":2,"a":"x"}"#).unwrap();
        assert_ne!(sha256(&one), sha256(&three));
    }
}
