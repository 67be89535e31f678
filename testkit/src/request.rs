//! Reading a request the way the mocks record it: headers as lowercase
//! (name, value) pairs, percent-decoding, the bearer credential.

/// Lowercase header names and lossily decoded values, in arrival order.
pub fn header_list(headers: &http::HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(name, value)| (name.as_str().to_string(), String::from_utf8_lossy(value.as_bytes()).into_owned()))
        .collect()
}

/// First value of header `name` (case-insensitive) in a [`header_list`].
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// The credential after `bearer `/`Bearer ` in an `authorization` value.
pub fn bearer(authorization: Option<&str>) -> Option<&str> {
    let value = authorization?;
    let (scheme, credential) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(credential.trim())
}

/// Decodes `%XX` escapes (and `+` as space when `plus_is_space`).
pub fn percent_decode(text: &str, plus_is_space: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok());
        match (escaped, bytes[i]) {
            (Some(byte), _) => {
                out.push(byte);
                i += 3;
                continue;
            }
            (None, b'+') if plus_is_space => out.push(b' '),
            (None, byte) => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb%3f+c", false), "a/b?+c");
        assert_eq!(percent_decode("a+b%3A", true), "a b:");
        assert_eq!(percent_decode("100%", false), "100%");
        assert_eq!(percent_decode("%zz", false), "%zz");
    }

    #[test]
    fn bearer_and_header_lookup() {
        assert_eq!(bearer(Some("Bearer abc ")), Some("abc"));
        assert_eq!(bearer(Some("bearer x.y.z")), Some("x.y.z"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(None), None);
        let headers = vec![("content-type".to_string(), "application/json".to_string())];
        assert_eq!(header(&headers, "Content-Type"), Some("application/json"));
        assert_eq!(header(&headers, "accept"), None);
    }
}
