//! What a machine lacks for a stage or a benchmark, and how to get it: every stage's
//! prerequisites are a list of these, printed the same way.

/// One thing the machine lacks, and how to get it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    pub what: String,
    pub how: String,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.how)
    }
}

/// `missing` as an indented list, one line each.
pub fn list(missing: &[Missing]) -> String {
    missing
        .iter()
        .map(|m| format!("  - {m}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_things_are_listed_with_how_to_get_them() {
        let text = list(&[Missing {
            what: "Go".into(),
            how: "install it".into(),
        }]);
        assert_eq!(text, "  - Go: install it");
    }
}
