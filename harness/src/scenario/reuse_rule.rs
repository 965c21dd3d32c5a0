//! A reuse rule as a scenario (`engine.reuse_rule`) or an engine's CAPS (`reuse_rule=`) declares it. The oracle
//! (`oracle.rs`) turns it into the rule it checks against.

/// A rule as declared, before the engine's capabilities fill in audio taint and sharing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DeclaredRule {
    Strict,
    Lcp,
    Grid(usize),
    Blocks(usize),
    None,
}

impl std::str::FromStr for DeclaredRule {
    type Err = String;
    /// `strict`, `lcp`, `grid:R`, `block:B`, `none`.
    fn from_str(s: &str) -> Result<Self, String> {
        let size = |n: &str, what: &str| match n.parse::<usize>() {
            Ok(v) if v > 0 => Ok(v),
            _ => Err(format!("`{s}`: the {what} must be a positive whole number")),
        };
        match s.split_once(':') {
            None if s == "strict" => Ok(DeclaredRule::Strict),
            None if s == "lcp" => Ok(DeclaredRule::Lcp),
            None if s == "none" => Ok(DeclaredRule::None),
            Some(("grid", n)) => size(n, "grid").map(DeclaredRule::Grid),
            Some(("block", n)) => size(n, "block size").map(DeclaredRule::Blocks),
            _ => Err(format!("`{s}` is not a reuse rule (strict, lcp, grid:R, block:B, none)")),
        }
    }
}

impl std::fmt::Display for DeclaredRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeclaredRule::Strict => f.write_str("strict"),
            DeclaredRule::Lcp => f.write_str("lcp"),
            DeclaredRule::Grid(r) => write!(f, "grid:{r}"),
            DeclaredRule::Blocks(b) => write!(f, "block:{b}"),
            DeclaredRule::None => f.write_str("none"),
        }
    }
}

impl TryFrom<String> for DeclaredRule {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<DeclaredRule> for String {
    fn from(d: DeclaredRule) -> String {
        d.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_read_and_print_back() {
        for s in ["strict", "lcp", "grid:16", "block:32", "none"] {
            let d: DeclaredRule = s.parse().expect(s);
            assert_eq!(d.to_string(), s);
        }
        for bad in ["", "prefix", "block", "block:0", "grid:x", "block:-1", "lcp:3"] {
            let e = bad.parse::<DeclaredRule>().expect_err(bad);
            assert!(e.contains(&format!("`{bad}`")), "{e}");
        }
    }
}
