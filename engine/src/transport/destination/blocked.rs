//! Which addresses a webhook may never reach: the blocked address table of
//! spec 000 section 2 (PUSH-256), and the reserved classes beyond it
//! (`RESERVED_V4`, `RESERVED_V6`: NAT64, 6to4, Teredo, the TEST-NETs and more).
//!
//! The two tables have their own switch: `allow_private_addresses` (the
//! spec's, development and test only) lifts the spec's table,
//! `allow_reserved_addresses` lifts the reserved classes; an address in both
//! (`::1` in `0::/8`, 255.255.255.255 in 240.0.0.0/4) follows the spec's. Both default to
//! false, so the reserved classes are refused by default and the spec's table
//! is always the minimum: with `allow_reserved_addresses = true` the check is
//! exactly the spec's.
//!
//! Addresses that embed an IPv4 address are judged either by that address or
//! by their whole prefix:
//!
//! - `::ffff:0:0/96` (IPv4-mapped) is the IPv4 address it maps, for both
//!   tables (the spec's table says so for its rows).
//! - `64:ff9b::/96` (NAT64 well-known prefix, RFC 6052) is the IPv4 address
//!   in its last 32 bits while the reserved classes apply. That is exactly
//!   where a NAT64 gateway sends the packet, and DNS64 synthesizes such AAAA
//!   records for every IPv4-only host in an IPv6-only cluster, so blocking
//!   the prefix would cut off every IPv4-only receiver there.
//! - `64:ff9b:1::/48` (NAT64 local use, RFC 8215) is blocked whole: the IPv4
//!   address sits at a place that depends on the prefix length the operator
//!   chose (/48 to /96, RFC 6052 section 2.2), which the engine cannot know.
//! - 6to4 `2002::/16` and Teredo `2001::/32` are blocked whole. Both are
//!   deprecated tunnels (RFC 7526; Teredo's public servers are gone), so no
//!   real receiver sits behind them, and decoding would not bound where the
//!   request goes: a 6to4 packet continues from the embedded IPv4 router to
//!   any host of its site, and a Teredo address carries two IPv4 addresses
//!   (the server's and the client's, obfuscated) plus a port, reached through
//!   a relay. Blocking is exact; a decode would check one hop of several.
//! - The rest of `0000::/8` (reserved by the IETF, RFC 4291) is blocked
//!   whole: the deprecated IPv4-compatible `::a.b.c.d` (`::/96`, which some
//!   stacks still tunnel to the embedded address), the IPv4-translated
//!   `::ffff:0:a.b.c.d` (RFC 2765), the NAT64 local-use prefix above, and
//!   unassigned space. Nothing routable lives there.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The two switches over the two tables.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddressRules {
    /// Lift the spec's table (PUSH-256): development and test only.
    pub allow_private_addresses: bool,
    /// Lift the reserved classes beyond the spec's table.
    pub allow_reserved_addresses: bool,
}

impl AddressRules {
    /// Whether a webhook may not connect to `ip`.
    pub fn blocks(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None if !self.allow_reserved_addresses => nat64_well_known(v6).map_or(ip, IpAddr::V4),
                None => ip,
            },
            v4 => v4,
        };
        // An address of the spec's table (::1, ::, 255.255.255.255 also sit
        // in reserved blocks) answers to the spec's switch alone.
        if is_blocked(ip) { !self.allow_private_addresses } else { !self.allow_reserved_addresses && is_reserved(ip) }
    }
}

/// A CIDR block, as bits and prefix length.
struct Block<T> {
    bits: T,
    len: u32,
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u32) -> Block<u32> {
    Block { bits: u32::from_be_bytes([a, b, c, d]), len }
}

const fn v6(segments: [u16; 8], len: u32) -> Block<u128> {
    let mut bits = 0u128;
    let mut i = 0;
    while i < 8 {
        bits = (bits << 16) | segments[i] as u128;
        i += 1;
    }
    Block { bits, len }
}

impl Block<u32> {
    fn contains(&self, ip: Ipv4Addr) -> bool {
        self.len == 0 || (ip.to_bits() ^ self.bits) >> (32 - self.len) == 0
    }
}

impl Block<u128> {
    fn contains(&self, ip: Ipv6Addr) -> bool {
        self.len == 0 || (ip.to_bits() ^ self.bits) >> (128 - self.len) == 0
    }
}

/// The reserved IPv4 classes beyond the spec's table.
const RESERVED_V4: &[Block<u32>] = &[
    v4(192, 0, 0, 0, 24),    // IETF protocol assignments (RFC 6890): DS-Lite, NAT64 discovery
    v4(192, 0, 2, 0, 24),    // TEST-NET-1 (RFC 5737)
    v4(198, 51, 100, 0, 24), // TEST-NET-2
    v4(203, 0, 113, 0, 24),  // TEST-NET-3
    v4(198, 18, 0, 0, 15),   // benchmarking (RFC 2544)
    v4(240, 0, 0, 0, 4),     // reserved, former class E (RFC 1112)
];

/// The reserved IPv6 classes beyond the spec's table, after the IPv4-mapped
/// and NAT64 well-known prefixes were read as their IPv4 address.
const RESERVED_V6: &[Block<u128>] = &[
    // Reserved by the IETF: IPv4-compatible ::/96, IPv4-translated
    // ::ffff:0:0:0/96, NAT64 local use 64:ff9b:1::/48 (RFC 8215), unassigned.
    v6([0, 0, 0, 0, 0, 0, 0, 0], 8),
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64),      // discard-only (RFC 6666)
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32),     // Teredo (RFC 4380)
    v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48),     // benchmarking (RFC 5180)
    v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), // documentation (RFC 3849)
    v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16),     // 6to4 (RFC 3056, deprecated by RFC 7526)
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),     // documentation (RFC 9637)
];

const NAT64_WELL_KNOWN: Block<u128> = v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96);

/// The IPv4 address a `64:ff9b::/96` address stands for (RFC 6052 2.1).
fn nat64_well_known(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    NAT64_WELL_KNOWN.contains(ip).then(|| Ipv4Addr::from_bits(ip.to_bits() as u32))
}

/// In a reserved class beyond the spec's table; an IPv4-mapped or NAT64
/// well-known-prefix address by the IPv4 address it stands for.
pub fn is_reserved(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => RESERVED_V4.iter().any(|b| b.contains(v4)),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped().or_else(|| nat64_well_known(v6)) {
            Some(v4) => is_reserved(IpAddr::V4(v4)),
            None => RESERVED_V6.iter().any(|b| b.contains(v6)),
        },
    }
}

/// The blocked address table of spec 000 section 2 (PUSH-256).
///
/// One deliberate widening: the table lists only the single address 0.0.0.0,
/// but the whole 0.0.0.0/8 ("this network") is blocked here, since a
/// connect to 0.x.y.z can reach the local host on some systems.
pub fn is_blocked(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_blocked_v4(v4),
        IpAddr::V6(v6) => is_blocked_v6(v6),
    }
}

fn is_blocked_v4(ip: Ipv4Addr) -> bool {
    let [a, b, _, _] = ip.octets();
    a == 10 // private 10.0.0.0/8
        || (a == 172 && (b & 0xf0) == 16) // private 172.16.0.0/12
        || (a == 192 && b == 168) // private 192.168.0.0/16
        || (a == 100 && (b & 0xc0) == 64) // shared 100.64.0.0/10
        || a == 127 // loopback 127.0.0.0/8
        || (a == 169 && b == 254) // link-local 169.254.0.0/16
        || a == 0 // unspecified 0.0.0.0 (widened to 0.0.0.0/8)
        || ip == Ipv4Addr::BROADCAST // 255.255.255.255
        || (a & 0xf0) == 224 // multicast 224.0.0.0/4
}

fn is_blocked_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        // ::ffff:0:0/96 mapping any blocked IPv4 address
        return is_blocked_v4(v4);
    }
    let first = ip.segments()[0];
    (first & 0xfe00) == 0xfc00 // private fc00::/7
        || (first & 0xffc0) == 0xfec0 // site-local fec0::/10
        || ip == Ipv6Addr::LOCALHOST // loopback ::1
        || (first & 0xffc0) == 0xfe80 // link-local fe80::/10
        || ip == Ipv6Addr::UNSPECIFIED // unspecified ::
        || (first & 0xff00) == 0xff00 // multicast ff00::/8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const DEFAULT: AddressRules = AddressRules { allow_private_addresses: false, allow_reserved_addresses: false };
    const PRIVATE_ALLOWED: AddressRules =
        AddressRules { allow_private_addresses: true, allow_reserved_addresses: false };
    const RESERVED_ALLOWED: AddressRules =
        AddressRules { allow_private_addresses: false, allow_reserved_addresses: true };
    const ALL_ALLOWED: AddressRules = AddressRules { allow_private_addresses: true, allow_reserved_addresses: true };

    #[test]
    fn blocked_table_rows() {
        // First and last address of every row of the table.
        let inside = [
            "10.0.0.0",
            "10.255.255.255", // private
            "172.16.0.0",
            "172.31.255.255",
            "192.168.0.0",
            "192.168.255.255",
            "fc00::",
            "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "100.64.0.0",
            "100.127.255.255", // shared
            "fec0::",
            "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", // site-local
            "127.0.0.0",
            "127.255.255.255", // loopback
            "::1",
            "169.254.0.0",
            "169.254.255.255", // link-local
            "fe80::",
            "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "0.0.0.0",
            "0.255.255.255",   // unspecified (0.0.0.0/8, see is_blocked)
            "255.255.255.255", // broadcast
            "224.0.0.0",
            "239.255.255.255", // multicast
            "::",
            "ff00::",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ];
        for addr in inside {
            assert!(is_blocked(ip(addr)), "{addr} should be blocked");
        }
        // The address just outside each edge, where that neighbour is not
        // itself in another row (fec0::/10 sits between fe80::/10 and
        // ff00::/8, so its neighbours are blocked by those rows).
        let outside = [
            "9.255.255.255",
            "11.0.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.167.255.255",
            "192.169.0.0",
            "fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "fe00::",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "::2",
            "169.253.255.255",
            "169.255.0.0",
            "fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "1.0.0.0",
            "255.255.255.254",
            "223.255.255.255",
            "240.0.0.0",
            "::1:0:0:0",        // just above ::ffff:0:0/96
            "::fffe:ffff:ffff", // just below ::ffff:0:0/96
        ];
        for addr in outside {
            assert!(!is_blocked(ip(addr)), "{addr} should not be blocked");
        }
        // Public addresses of both families.
        for public in ["93.184.216.34", "8.8.8.8", "2606:2800:220:1:248:1893:25c8:1946", "2001:4860::8888"] {
            assert!(!is_blocked(ip(public)), "{public}");
        }
    }

    #[test]
    fn blocked_ipv4_mapped() {
        for mapped in [
            "::ffff:10.0.0.1",
            "::ffff:172.16.0.1",
            "::ffff:192.168.1.1",
            "::ffff:100.64.0.1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.1.1",
            "::ffff:0.0.0.0",
            "::ffff:255.255.255.255",
            "::ffff:224.0.0.1",
            "::ffff:7f00:1",
        ] {
            assert!(is_blocked(ip(mapped)), "{mapped}");
        }
        for mapped in ["::ffff:93.184.216.34", "::ffff:11.0.0.0", "::ffff:172.32.0.0", "::ffff:100.128.0.0"] {
            assert!(!is_blocked(ip(mapped)), "{mapped}");
        }
    }

    /// Every reserved class: its first and last address (plus one inside
    /// for the wide ones), then the neighbours just outside each edge.
    const RESERVED_CLASSES: &[(&str, &[&str], &[&str])] = &[
        ("192.0.0.0/24", &["192.0.0.0", "192.0.0.170", "192.0.0.255"], &["191.255.255.255", "192.0.1.0"]),
        ("TEST-NET-1", &["192.0.2.0", "192.0.2.255"], &["192.0.1.255", "192.0.3.0"]),
        ("TEST-NET-2", &["198.51.100.0", "198.51.100.255"], &["198.51.99.255", "198.51.101.0"]),
        ("TEST-NET-3", &["203.0.113.0", "203.0.113.255"], &["203.0.112.255", "203.0.114.0"]),
        ("benchmarking", &["198.18.0.0", "198.19.255.255"], &["198.17.255.255", "198.20.0.0"]),
        ("240.0.0.0/4", &["240.0.0.0", "250.1.2.3", "255.255.255.254"], &["239.255.255.255"]),
        ("IPv4-compatible", &["::0.0.0.2", "::10.0.0.1", "::93.184.216.34", "::255.255.255.255"], &[]),
        ("IPv4-translated", &["::ffff:0:0:0", "::ffff:0:93.184.216.34", "::ffff:0:ffff:ffff"], &[]),
        ("NAT64 local use", &["64:ff9b:1::", "64:ff9b:1::5db8:d822", "64:ff9b:1:ffff:ffff:ffff:ffff:ffff"], &[]),
        ("rest of 0::/8", &["::1:0:0:0", "64:ff9b::1:0:0", "ff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"], &["100:0:0:1::"]),
        (
            "6to4",
            &["2002::", "2002:5db8:d822::1", "2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff"],
            &["2001:ffff::", "2003::"],
        ),
        ("Teredo", &["2001::", "2001:0:4136:e378::1", "2001:0:ffff:ffff:ffff:ffff:ffff:ffff"], &["2001:1::"]),
        (
            "documentation 2001:db8::/32",
            &["2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"],
            &["2001:db7:ffff::", "2001:db9::"],
        ),
        (
            "documentation 3fff::/20",
            &["3fff::", "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff"],
            &["3ffe:ffff::", "3fff:1000::"],
        ),
        (
            "benchmarking 2001:2::/48",
            &["2001:2::", "2001:2:0:ffff:ffff:ffff:ffff:ffff"],
            &["2001:1:ffff::", "2001:2:1::"],
        ),
        ("discard-only", &["100::", "100::ffff:ffff:ffff:ffff"], &["100:0:0:1::", "101::"]),
    ];

    #[test]
    fn reserved_classes_and_their_edges() {
        for (class, inside, outside) in RESERVED_CLASSES {
            for addr in *inside {
                assert!(is_reserved(ip(addr)), "{class}: {addr} is reserved");
                assert!(DEFAULT.blocks(ip(addr)), "{class}: {addr} is blocked by default");
                assert!(PRIVATE_ALLOWED.blocks(ip(addr)), "{class}: {addr} stays blocked with private allowed");
                assert!(!ALL_ALLOWED.blocks(ip(addr)), "{class}: {addr} is allowed with both switches");
                // Only the spec's table decides once the reserved classes are lifted.
                assert_eq!(RESERVED_ALLOWED.blocks(ip(addr)), is_blocked(ip(addr)), "{class}: {addr}");
            }
            for addr in *outside {
                assert!(!is_reserved(ip(addr)), "{class}: {addr} is outside");
            }
        }
        // The reserved addresses that are IPv4 are also reserved mapped.
        for addr in ["192.0.2.1", "198.18.0.1", "240.0.0.1", "192.0.0.8"] {
            assert!(is_reserved(ip(&format!("::ffff:{addr}"))), "::ffff:{addr}");
            assert!(PRIVATE_ALLOWED.blocks(ip(&format!("::ffff:{addr}"))), "::ffff:{addr}");
        }
        // Public addresses of both families stay open under every rule.
        for public in [
            "93.184.216.34",
            "8.8.8.8",
            "192.0.1.1",
            "198.20.0.1",
            "2606:2800:220:1:248:1893:25c8:1946",
            "2001:4860::8888",
            "2003::1",
            "::ffff:93.184.216.34",
        ] {
            for rules in [DEFAULT, PRIVATE_ALLOWED, RESERVED_ALLOWED, ALL_ALLOWED] {
                assert!(!rules.blocks(ip(public)), "{public} under {rules:?}");
            }
        }
    }

    #[test]
    fn nat64_well_known_prefix_is_judged_by_its_ipv4_address() {
        // 64:ff9b::/96 + every kind of IPv4 address.
        let public = ["64:ff9b::93.184.216.34", "64:ff9b::808:808", "64:ff9b::1.0.0.0", "64:ff9b::223.255.255.255"];
        let spec_table = ["64:ff9b::10.0.0.1", "64:ff9b::7f00:1", "64:ff9b::169.254.169.254", "64:ff9b::"];
        let reserved = ["64:ff9b::192.0.2.1", "64:ff9b::198.18.0.1", "64:ff9b::240.0.0.1", "64:ff9b::192.0.0.170"];
        for addr in public {
            assert!(!is_reserved(ip(addr)), "{addr}");
            for rules in [DEFAULT, PRIVATE_ALLOWED, RESERVED_ALLOWED, ALL_ALLOWED] {
                assert!(!rules.blocks(ip(addr)), "{addr} under {rules:?}: a DNS64 answer for a public host");
            }
        }
        for addr in spec_table {
            assert!(DEFAULT.blocks(ip(addr)), "{addr}: its IPv4 address is in the spec's table");
            // Lifted with the spec's table, like ::ffff:10.0.0.1 is.
            assert!(!PRIVATE_ALLOWED.blocks(ip(addr)), "{addr}");
            // The spec's table alone does not know NAT64.
            assert!(!is_blocked(ip(addr)) && !RESERVED_ALLOWED.blocks(ip(addr)), "{addr}");
        }
        for addr in reserved {
            assert!(is_reserved(ip(addr)), "{addr}");
            assert!(DEFAULT.blocks(ip(addr)) && PRIVATE_ALLOWED.blocks(ip(addr)), "{addr}");
            assert!(!ALL_ALLOWED.blocks(ip(addr)), "{addr}");
        }
        // Just past the /96 is the rest of 0::/8, blocked whole.
        assert!(DEFAULT.blocks(ip("64:ff9b::1:5db8:d822")));
    }

    #[test]
    fn an_address_in_both_tables_follows_the_spec_switch() {
        for addr in ["::1", "::", "255.255.255.255", "::ffff:255.255.255.255"] {
            assert!(DEFAULT.blocks(ip(addr)) && RESERVED_ALLOWED.blocks(ip(addr)), "{addr}");
            assert!(!PRIVATE_ALLOWED.blocks(ip(addr)), "{addr}: lifted with the spec's table");
        }
        // The NAT64 address of the broadcast address, decoded while the
        // reserved classes apply.
        assert!(DEFAULT.blocks(ip("64:ff9b::ffff:ffff")) && !PRIVATE_ALLOWED.blocks(ip("64:ff9b::ffff:ffff")));
    }

    #[test]
    fn the_spec_table_is_the_minimum_under_every_reserved_setting() {
        for addr in ["10.0.0.1", "127.0.0.1", "::1", "fe80::1", "::ffff:10.0.0.1", "255.255.255.255", "::"] {
            assert!(DEFAULT.blocks(ip(addr)) && RESERVED_ALLOWED.blocks(ip(addr)), "{addr}");
            assert!(!ALL_ALLOWED.blocks(ip(addr)), "{addr}");
        }
    }

    /// Addresses from DNS, property-tested.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        const RULES: [AddressRules; 4] = [DEFAULT, PRIVATE_ALLOWED, RESERVED_ALLOWED, ALL_ALLOWED];

        proptest! {
            /// An IPv4-mapped address is judged exactly as its IPv4 address,
            /// under every setting.
            #[test]
            fn mapped_is_its_ipv4_address(v4: Ipv4Addr) {
                for rules in RULES {
                    prop_assert_eq!(rules.blocks(IpAddr::V6(v4.to_ipv6_mapped())), rules.blocks(IpAddr::V4(v4)));
                }
            }

            /// While the reserved classes apply, a NAT64 well-known-prefix
            /// address is judged exactly as its IPv4 address.
            #[test]
            fn nat64_is_its_ipv4_address_while_reserved_apply(v4: Ipv4Addr) {
                let nat64 = IpAddr::V6(Ipv6Addr::from_bits((0x64_ff9b_u128 << 96) | u128::from(v4.to_bits())));
                for rules in [DEFAULT, PRIVATE_ALLOWED] {
                    prop_assert_eq!(rules.blocks(nat64), rules.blocks(IpAddr::V4(v4)));
                }
            }

            /// 6to4 and Teredo are blocked whole, whatever they embed; lifting
            /// both tables lets everything through.
            #[test]
            fn tunnels_are_blocked_whole(low: u128, v6: Ipv6Addr, v4: Ipv4Addr) {
                let six_to_four = Ipv6Addr::from_bits((0x2002_u128 << 112) | (low >> 16));
                let teredo = Ipv6Addr::from_bits((0x2001_0000_u128 << 96) | (low >> 32));
                for tunnel in [six_to_four, teredo] {
                    prop_assert!(DEFAULT.blocks(IpAddr::V6(tunnel)) && PRIVATE_ALLOWED.blocks(IpAddr::V6(tunnel)));
                }
                prop_assert!(!ALL_ALLOWED.blocks(IpAddr::V6(v6)) && !ALL_ALLOWED.blocks(IpAddr::V4(v4)));
                // The default is the strictest: whatever another setting blocks, it blocks.
                for ip in [IpAddr::V6(v6), IpAddr::V4(v4)] {
                    if RULES.iter().any(|r| r.blocks(ip)) {
                        prop_assert!(DEFAULT.blocks(ip));
                    }
                }
            }
        }
    }
}
