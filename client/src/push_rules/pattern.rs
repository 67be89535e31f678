//! Globs for `field_match`, `strand_track` and `watch_state` (§4.3): `*`
//! matches any run of characters (none included), `?` exactly one; every
//! other character matches itself, case-sensitively.

pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    // The last `*` seen and the text position it was tried at: on a
    // mismatch, let it swallow one more character (linear backtracking).
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        // A `*` in the pattern is always a wildcard, even facing a literal
        // `*` in the text: testing it first keeps a literal match from
        // consuming it and losing the backtrack point.
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::glob_matches;

    #[test]
    fn globs() {
        assert!(glob_matches("ak.message.create", "ak.message.create"));
        assert!(!glob_matches("ak.message.create", "ak.message.created"));
        assert!(glob_matches("ak.message.*", "ak.message.revise"));
        assert!(glob_matches("*", ""));
        assert!(glob_matches("a*b*c", "aXXbYYc"));
        assert!(!glob_matches("a*b*c", "aXXbYY"));
        assert!(glob_matches("?iscussion", "discussion"));
        assert!(!glob_matches("?", ""));
        assert!(glob_matches("紧*", "紧急"));
        assert!(!glob_matches("Muted", "muted"), "case-sensitive");
        assert!(glob_matches("*a", "aaa"));
    }

    #[test]
    fn pattern_star_facing_a_literal_star_in_the_text() {
        assert!(glob_matches("*", "**"));
        assert!(glob_matches("*", "*"));
        assert!(glob_matches("ak.message.*", "ak.message.*x"));
        assert!(glob_matches("bot*", "bot*1"), "an override on `bot*` mutes sender `bot*1`");
        assert!(glob_matches("a*b", "a*xb"));
        assert!(glob_matches("*b", "**b"));
        assert!(!glob_matches("a*b", "a*x"));
        assert!(glob_matches("?", "*"), "`?` matches a literal `*` too");
    }
}
