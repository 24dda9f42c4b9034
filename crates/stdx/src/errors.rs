//! Rendering errors for people: one line with every cause in the chain, each once. The one
//! error-chain printer of the workspace: kube-dra's logs, resmgr's answers and logs, and the
//! binary's logs and fatal errors all print with it.
//!
//! Our library errors keep their cause in `source()` rather than repeating it in their message
//! (so chain printers do not print it twice); some third-party errors do repeat it, which
//! [`chain`] drops. Where an error leaves the process as a string (a per-claim error to the
//! kubelet, an NRI status message, the binary's last line) the whole chain is what the reader
//! needs.

use std::error::Error;

/// `error: cause: cause of cause`.
pub fn chain(error: &(dyn Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        // Some errors do put their cause in their message too; do not say it twice.
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn joins_the_chain() {
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(chain(&e), "outer: inner");
    }
}
