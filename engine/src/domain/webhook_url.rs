//! A webhook or Web Push URL that passed the syntactic rules of PUSH-256,
//! parsed once at registration (or when a stored one is read) and kept
//! parsed: an attempt resolves and checks its host but never parses again.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Which syntactic rule a URL broke. `describe` words it for the field it
/// came in (never with the URL itself, PUSH-254).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrlError {
    NotHttps,
    UserInfo,
    Invalid,
}

impl UrlError {
    /// The rule, for a field named `subject` ("webhook url", "webpush endpoint").
    pub fn describe(self, subject: &str) -> String {
        match self {
            Self::NotHttps => format!("{subject} must use https"),
            Self::UserInfo => format!("{subject} must not carry a username or password"),
            Self::Invalid => format!("{subject} is not a valid absolute url with a host"),
        }
    }
}

/// A webhook URL that passed the syntactic rules of PUSH-256: https, no
/// userinfo, a valid host. Debug never prints the URL (PUSH-254).
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookUrl {
    original: String,
    uri: http::Uri,
    /// Lowercased, IPv6 without brackets.
    host: String,
    port: u16,
    ip: Option<IpAddr>,
}

impl WebhookUrl {
    pub fn parse(url: &str) -> Result<WebhookUrl, UrlError> {
        let uri: http::Uri = url.parse().map_err(|_| UrlError::Invalid)?;
        match uri.scheme_str() {
            Some(scheme) if scheme.eq_ignore_ascii_case("https") => {}
            _ => return Err(UrlError::NotHttps),
        }
        let authority = uri.authority().ok_or(UrlError::Invalid)?;
        if authority.as_str().contains('@') {
            return Err(UrlError::UserInfo);
        }
        let raw_host = authority.host();
        let (host, ip) = if let Some(inner) = raw_host.strip_prefix('[') {
            let inner = inner.strip_suffix(']').ok_or(UrlError::Invalid)?;
            let v6: Ipv6Addr = inner.parse().map_err(|_| UrlError::Invalid)?;
            (v6.to_string(), Some(IpAddr::V6(v6)))
        } else if let Ok(v4) = raw_host.parse::<Ipv4Addr>() {
            (v4.to_string(), Some(IpAddr::V4(v4)))
        } else {
            let host = raw_host.to_ascii_lowercase();
            if !is_host_name(&host) {
                return Err(UrlError::Invalid);
            }
            (host, None)
        };
        // `Authority::port_u16` reads an out-of-range port as no port, so
        // parse the text after the host here.
        let port = match authority.as_str().strip_prefix(raw_host) {
            Some("") => 443,
            Some(rest) => match rest.strip_prefix(':') {
                Some(digits) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
                    match digits.parse::<u16>() {
                        Ok(port) if port != 0 => port,
                        _ => return Err(UrlError::Invalid),
                    }
                }
                _ => return Err(UrlError::Invalid),
            },
            None => return Err(UrlError::Invalid),
        };
        Ok(WebhookUrl { original: url.to_owned(), uri, host, port, ip })
    }

    /// The host, lowercased; an IPv6 literal without brackets.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port, 443 when the URL names none.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address when the host is an IP literal.
    pub fn ip_literal(&self) -> Option<IpAddr> {
        self.ip
    }

    /// The URL exactly as given.
    pub fn as_str(&self) -> &str {
        &self.original
    }

    pub fn uri(&self) -> &http::Uri {
        &self.uri
    }
}

crate::domain::redacted_debug!(WebhookUrl);

/// A DNS host name: dot-separated labels of ASCII letters, digits, '-' and
/// '_', each 1 to 63 bytes, at most 253 bytes, one optional trailing dot,
/// and a last label that is not all digits (that would be an IPv4 shorthand
/// such as `2130706433`, which some parsers read as an address).
pub(crate) fn is_host_name(host: &str) -> bool {
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.is_empty() || name.len() > 253 {
        return false;
    }
    let labels_ok = name.split('.').all(|label| {
        (1..=63).contains(&label.len()) && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    });
    let last_numeric = name.rsplit('.').next().is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()));
    labels_ok && !last_numeric
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn url_parsing() {
        let url = WebhookUrl::parse("https://Hooks.Example.COM/path?q=1").unwrap();
        assert_eq!(url.host(), "hooks.example.com");
        assert_eq!(url.port(), 443);
        assert_eq!(url.ip_literal(), None);
        assert_eq!(url.as_str(), "https://Hooks.Example.COM/path?q=1");
        assert_eq!(url.uri().path(), "/path");

        let url = WebhookUrl::parse("HTTPS://example.com:8443/").unwrap();
        assert_eq!(url.port(), 8443);

        let url = WebhookUrl::parse("https://[2001:DB8::1]:9000/x").unwrap();
        assert_eq!(url.host(), "2001:db8::1");
        assert_eq!(url.port(), 9000);
        assert_eq!(url.ip_literal(), Some(ip("2001:db8::1")));

        let url = WebhookUrl::parse("https://127.0.0.1/").unwrap();
        assert_eq!(url.ip_literal(), Some(ip("127.0.0.1")));

        assert_eq!(WebhookUrl::parse("http://example.com/"), Err(UrlError::NotHttps));
        assert_eq!(WebhookUrl::parse("ftp://example.com/"), Err(UrlError::NotHttps));
        assert_eq!(WebhookUrl::parse("example.com"), Err(UrlError::NotHttps));
        assert_eq!(WebhookUrl::parse("/just/a/path"), Err(UrlError::NotHttps));
        assert_eq!(WebhookUrl::parse("https://user:pw@example.com/"), Err(UrlError::UserInfo));
        assert_eq!(WebhookUrl::parse("https://user@example.com/"), Err(UrlError::UserInfo));
        assert_eq!(WebhookUrl::parse("https://@example.com/"), Err(UrlError::UserInfo));
        for bad in [
            "",
            "https://",
            "https:///path",
            "https://:443/",
            "https://exa mple.com/",
            "https://example.com:0/",
            "https://example.com:99999/",
            "https://example.com:/",
            "https://example.com:+443/",
            "https://[::1/",
            "https://[fe80::1%25eth0]/",
            "https://2130706433/",
            "https://a..b/",
            "https://*.example.com/",
        ] {
            assert!(WebhookUrl::parse(bad).is_err(), "{bad:?} should be rejected");
        }
        let debug = format!("{:?}", WebhookUrl::parse("https://secret.example.com/token").unwrap());
        assert!(!debug.contains("secret") && !debug.contains("token"));
    }

    #[test]
    fn rules_are_worded_for_their_field() {
        assert_eq!(UrlError::NotHttps.describe("webhook url"), "webhook url must use https");
        assert_eq!(
            UrlError::UserInfo.describe("webpush endpoint"),
            "webpush endpoint must not carry a username or password"
        );
        assert_eq!(UrlError::Invalid.describe("webhook url"), "webhook url is not a valid absolute url with a host");
    }
}
